//! The simulated keyed traffic: Zipf popularity over named keys, shifting hot keys,
//! a diurnal drift, and Poisson-sampled request counts per step.
//!
//! Everything is seeded: the same [`Popularity`] and seed give the same counts, step
//! for step, so every assigner of a scenario sees exactly the same traffic.

use std::f64::consts::TAU;

use steady_slice::SliceKey;
use steady_subset::prng::{shuffle, SplitMix64};

/// How the popularity of keys changes over time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Shift {
    /// Never: the same keys stay hot.
    None,
    /// Every `steps` steps the ranks are reshuffled, so the hot load moves to other keys
    /// at once (the reaction experiment of Slicer, OSDI 2016, section 5.2.3: every 19
    /// minutes; Rudolph's stress case: every 10 s).
    Every {
        /// Steps between reshuffles (at least 1).
        steps: usize,
    },
    /// A day: popularity drifts from one ranking of the keys at midnight to another at
    /// noon and back (each key's rate is the cosine-weighted mix of its two Zipf rates),
    /// and the total rate swings by `swing` around its mean, lowest at midnight.
    Diurnal {
        /// Steps in a day.
        day_steps: usize,
        /// Relative amplitude of the total rate (0.3: from 0.7 to 1.3 times the mean).
        swing: f64,
    },
}

/// The popularity of `keys` named keys: Zipf with exponent `exponent` over a ranking of
/// the keys that [`Shift`] changes over time; `rate` requests per second in total.
#[derive(Debug, Clone)]
pub struct Popularity {
    /// The slice key of each key (`SliceKey::of("key-{i}")`).
    slice_keys: Vec<SliceKey>,
    /// `zipf[r]`: the share of the load of the key of rank `r` (they sum to 1).
    zipf: Vec<f64>,
    rate: f64,
    shift: Shift,
    seed: u64,
}

impl Popularity {
    /// `keys` keys (at least 1) with Zipf exponent `exponent` (at least 0), `rate`
    /// requests per second in total.
    pub fn new(keys: usize, exponent: f64, rate: f64, shift: Shift, seed: u64) -> Self {
        let keys = keys.max(1);
        let weights: Vec<f64> = (1..=keys).map(|r| (r as f64).powf(-exponent)).collect();
        let sum: f64 = weights.iter().sum();
        Self {
            slice_keys: (0..keys).map(|i| SliceKey::of(format!("key-{i}"))).collect(),
            zipf: weights.into_iter().map(|w| w / sum).collect(),
            rate,
            shift,
            seed,
        }
    }

    /// The slice key of each key, by key index.
    pub fn slice_keys(&self) -> &[SliceKey] {
        &self.slice_keys
    }

    /// The share of the load of the hottest key (rank 0).
    pub fn hottest_share(&self) -> f64 {
        self.zipf[0]
    }

    /// The ranking in force in epoch `epoch`: `ranks[key]` is the key's rank.
    fn ranking(&self, epoch: u64) -> Vec<u32> {
        let mut order: Vec<u32> = (0..self.zipf.len() as u32).collect();
        shuffle(&mut order, &mut SplitMix64::new(self.seed ^ epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15)));
        let mut ranks = vec![0u32; order.len()];
        for (rank, key) in order.into_iter().enumerate() {
            ranks[key as usize] = rank as u32;
        }
        ranks
    }

    /// The expected requests per second of every key during step `step`.
    pub fn rates(&self, step: usize) -> Vec<f64> {
        match self.shift {
            Shift::None => self.rates_of(&self.ranking(0), self.rate),
            Shift::Every { steps } => self.rates_of(&self.ranking((step / steps.max(1)) as u64), self.rate),
            Shift::Diurnal { day_steps, swing } => {
                let phase = TAU * (step % day_steps.max(1)) as f64 / day_steps.max(1) as f64;
                // 0 at midnight, 1 at noon.
                let noon = (1.0 - phase.cos()) / 2.0;
                let total = self.rate * (1.0 - swing * phase.cos());
                let (night, day) = (self.ranking(0), self.ranking(1));
                night
                    .iter()
                    .zip(&day)
                    .map(|(&a, &b)| {
                        total * ((1.0 - noon) * self.zipf[a as usize] + noon * self.zipf[b as usize])
                    })
                    .collect()
            }
        }
    }

    fn rates_of(&self, ranks: &[u32], total: f64) -> Vec<f64> {
        ranks.iter().map(|&r| total * self.zipf[r as usize]).collect()
    }
}

/// Requests counted per key in one step of `seconds`: Poisson draws around the
/// expected rates (`seed` and `step` fix the draw).
pub fn sample_counts(rates: &[f64], seconds: f64, seed: u64, step: usize) -> Vec<f64> {
    let mut rng = SplitMix64::new(seed ^ (step as u64).wrapping_mul(0xD1B5_4A32_D192_ED03) ^ 0x5EED);
    rates.iter().map(|&r| poisson(r * seconds, &mut rng)).collect()
}

/// A Poisson draw with mean `mean`: Knuth's product of uniforms up to a mean of 30,
/// the normal approximation (rounded, at least 0) above.
fn poisson(mean: f64, rng: &mut SplitMix64) -> f64 {
    if mean <= 0.0 {
        return 0.0;
    }
    if mean > 30.0 {
        return (mean + mean.sqrt() * standard_normal(rng)).round().max(0.0);
    }
    let limit = (-mean).exp();
    let mut product = uniform(rng);
    let mut count = 0.0;
    while product > limit {
        count += 1.0;
        product *= uniform(rng);
    }
    count
}

/// A uniform draw in (0, 1].
fn uniform(rng: &mut SplitMix64) -> f64 {
    ((rng.next() >> 11) + 1) as f64 / (1u64 << 53) as f64
}

/// A standard normal draw (Box–Muller).
fn standard_normal(rng: &mut SplitMix64) -> f64 {
    let (u, v) = (uniform(rng), uniform(rng));
    (-2.0 * u.ln()).sqrt() * (TAU * v).cos()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipf_shares_sum_to_one_and_fall_with_rank() {
        let p = Popularity::new(100, 1.5, 8000.0, Shift::None, 1);
        let total: f64 = p.rates(0).iter().sum();
        assert!((total - 8000.0).abs() < 1e-6, "{total}");
        assert!(p.zipf.windows(2).all(|w| w[0] > w[1]));
        // Zipf 1.5 over 100 keys: the hottest key carries about 40% of the load.
        assert!((0.38..0.42).contains(&p.hottest_share()), "{}", p.hottest_share());
    }

    #[test]
    fn a_reshuffle_moves_the_hot_key_and_nothing_else_changes_between_shifts() {
        let p = Popularity::new(100, 1.5, 8000.0, Shift::Every { steps: 19 }, 7);
        let hottest = |rates: Vec<f64>| rates.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).unwrap().0;
        assert_eq!(p.rates(0), p.rates(18));
        assert_ne!(hottest(p.rates(18)), hottest(p.rates(19)));
    }

    #[test]
    fn the_day_drifts_from_one_ranking_to_another_and_back() {
        let p = Popularity::new(1000, 1.0, 1000.0, Shift::Diurnal { day_steps: 1440, swing: 0.3 }, 3);
        let (midnight, noon) = (p.rates(0), p.rates(720));
        assert!((midnight.iter().sum::<f64>() - 700.0).abs() < 1e-6);
        assert!((noon.iter().sum::<f64>() - 1300.0).abs() < 1e-6);
        assert_eq!(p.rates(1440), midnight);
        let hottest = |rates: &[f64]| rates.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).unwrap().0;
        assert_ne!(hottest(&midnight), hottest(&noon));
    }

    #[test]
    fn poisson_counts_have_the_expected_mean_and_are_seeded() {
        for mean in [0.3, 4.0, 29.0, 500.0] {
            let rates = vec![mean; 20_000];
            let counts = sample_counts(&rates, 1.0, 9, 0);
            let avg = counts.iter().sum::<f64>() / counts.len() as f64;
            assert!((avg - mean).abs() < 0.05 * mean.max(1.0), "mean {mean}: {avg}");
            let var = counts.iter().map(|c| (c - avg).powi(2)).sum::<f64>() / counts.len() as f64;
            assert!((var - mean).abs() < 0.1 * mean.max(1.0), "mean {mean}: variance {var}");
            assert_eq!(counts, sample_counts(&rates, 1.0, 9, 0));
            assert_ne!(counts, sample_counts(&rates, 1.0, 9, 1));
        }
    }
}
