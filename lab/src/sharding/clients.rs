//! The load as clients would report it (gRFC A119): each key's load split over a few
//! clients, each client's aggregated into ranges under the server's quantum, validated
//! back into rates and summed the way the Assigner sums clients' reports
//! (`steady_slicer::assigner_service::client_load`).

use std::time::{Duration, SystemTime};

use steady_assigner::{Load, SliceKey};
use steady_proto::autosharding::ranges::{
    aggregate, report, validate, ReportError, ReportRules, DEFAULT_METRIC,
};
use steady_slicer::assigner_service::client_load;
use steady_subset::prng::SplitMix64;

/// How the clients report: how many there are, and the share of a report's load one
/// range may carry unless it holds a single key (the server's `load_quantum_fraction`).
/// Start keys have 8 bytes (the server's resolution).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClientView {
    /// The clients the requests are split over.
    pub clients: usize,
    /// The quantum, as a fraction of a client's total load (`None`: per task, as
    /// steady's server sends it: `steady_slicer::autosharding::quantum_per_task`).
    pub quantum: Option<f64>,
}

impl Default for ClientView {
    /// 8 clients, the quantum per task.
    fn default() -> Self {
        Self { clients: 8, quantum: None }
    }
}

impl ClientView {
    /// The load the Assigner would see from the clients' reports over `seconds`, when
    /// the keys `keys` (ascending) carry `rates` (per second) over that time: each key's
    /// rate split over the clients at random shares (drawn from `seed`), each client's
    /// load aggregated ([`aggregate`]), reported over `seconds` ending at a fixed time and
    /// validated back under the default [`ReportRules`] ([`validate`]).
    ///
    /// # Errors
    ///
    /// The [`ReportError`] of a report the server would refuse.
    pub fn load(
        &self,
        keys: &[u64],
        rates: &[f64],
        seconds: f64,
        seed: u64,
        tasks: usize,
    ) -> Result<Load, ReportError> {
        let quantum = self.quantum.unwrap_or_else(|| steady_slicer::autosharding::quantum_per_task(tasks));
        let clients = self.clients.max(1);
        let mut rng = SplitMix64::new(seed ^ 0xC11E_475E_ED00_0000);
        let mut loads: Vec<Vec<(SliceKey, f64)>> = vec![Vec::new(); clients];
        let mut shares = vec![0.0; clients];
        for (&key, &rate) in keys.iter().zip(rates) {
            if rate <= 0.0 {
                continue;
            }
            for s in &mut shares {
                *s = ((rng.next() >> 11) + 1) as f64;
            }
            let sum: f64 = shares.iter().sum();
            for (client, s) in loads.iter_mut().zip(&shares) {
                client.push((SliceKey(key), rate * seconds * s / sum));
            }
        }
        let end = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let start = end - Duration::from_secs_f64(seconds);
        let rules = ReportRules::default();
        let rates = loads
            .into_iter()
            .map(|client| {
                let ranges = aggregate(client, quantum, rules.resolution_bytes);
                validate(&report(DEFAULT_METRIC, ranges, start, end), &rules, end)
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(client_load(&rates).expect("validated rates are finite"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use steady_slice::KeyRange;

    #[test]
    fn the_clients_report_every_key_load_and_a_heavy_key_at_its_key() {
        let keys: Vec<u64> = (1..=1000u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15)).collect();
        let mut sorted = keys.clone();
        sorted.sort_unstable();
        let mut rates = vec![1.0; sorted.len()];
        rates[500] = 1000.0;
        let load = ClientView::default().load(&sorted, &rates, 300.0, 7, 10).unwrap();
        let total: f64 = rates.iter().sum();
        assert!((load.total() - total).abs() < 1e-6 * total, "{} != {total}", load.total());
        let heavy = KeyRange::new(SliceKey(sorted[500]), Some(SliceKey(sorted[500] + 1)));
        assert!((load.of_range(heavy) - 1000.0).abs() < 1e-6, "{}", load.of_range(heavy));
    }
}
