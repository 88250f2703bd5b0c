//! Exponential backoff with jitter for reconnecting to failed backends.

use std::time::Duration;

use steady_subset::prng::SplitMix64;

/// Reconnection delays: `base × 2^(failures - 1)`, capped at `max`, then scaled by a
/// random factor in `[1 - jitter, 1]` so that many frontends do not retry in lockstep.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// The delay after the first failure.
    pub base: Duration,
    /// The largest delay.
    pub max: Duration,
    /// The fraction of the delay that is random, in `0.0..=1.0`.
    pub jitter: f64,
}

impl Default for Backoff {
    fn default() -> Self {
        Self { base: Duration::from_millis(100), max: Duration::from_secs(10), jitter: 0.5 }
    }
}

impl Backoff {
    /// The delay after `failures` consecutive failures (`failures >= 1`).
    pub fn delay(&self, failures: u32, rng: &mut SplitMix64) -> Duration {
        let exponent = failures.saturating_sub(1).min(30);
        let full = self.base.saturating_mul(1 << exponent).min(self.max);
        // NaN (which `clamp` keeps) counts as no jitter: `Duration` arithmetic panics on it.
        let jitter = if self.jitter.is_nan() { 0.0 } else { self.jitter.clamp(0.0, 1.0) };
        // A uniform fraction in [0, 1) from 53 random bits.
        let unit = (rng.next() >> 11) as f64 / (1u64 << 53) as f64;
        full.mul_f64(1.0 - jitter * unit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap_within_the_jitter() {
        let b = Backoff { base: Duration::from_millis(100), max: Duration::from_secs(1), jitter: 0.5 };
        let mut rng = SplitMix64::new(1);
        for (failures, full) in [(1, 100), (2, 200), (3, 400), (4, 800), (5, 1000), (40, 1000)] {
            for _ in 0..50 {
                let d = b.delay(failures, &mut rng);
                let full = Duration::from_millis(full);
                assert!(d <= full && d >= full / 2, "{failures}: {d:?}");
            }
        }
        let exact = Backoff { jitter: 0.0, ..b };
        assert_eq!(exact.delay(2, &mut rng), Duration::from_millis(200));
    }
}
