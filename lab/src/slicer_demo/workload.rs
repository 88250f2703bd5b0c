//! The demo's keyed traffic: Zipf popularity over named keys, reshuffled each epoch.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use steady_subset::prng::{shuffle, SplitMix64};

/// Zipf popularity over `keys` named keys whose ranking changes each epoch.
#[derive(Debug)]
pub(super) struct Popularity {
    cumulative: Vec<f64>,
    /// Per epoch: key of each rank.
    rankings: Mutex<Vec<Vec<usize>>>,
    pub(super) epoch: AtomicU64,
}

impl Popularity {
    pub(super) fn new(keys: usize, exponent: f64) -> Self {
        let weights: Vec<f64> = (1..=keys).map(|r| (r as f64).powf(-exponent)).collect();
        let total: f64 = weights.iter().sum();
        let mut sum = 0.0;
        let cumulative = weights.iter().map(|w| {
            sum += w / total;
            sum
        });
        Self { cumulative: cumulative.collect(), rankings: Mutex::new(Vec::new()), epoch: AtomicU64::new(0) }
    }

    /// The key name for a uniform draw `u` in [0, 1).
    pub(super) fn key(&self, u: f64) -> String {
        let rank = self.cumulative.partition_point(|&c| c < u).min(self.cumulative.len() - 1);
        let epoch = self.epoch.load(Ordering::Relaxed) as usize;
        let mut rankings = self.rankings.lock().expect("not poisoned");
        while rankings.len() <= epoch {
            let mut order: Vec<usize> = (0..self.cumulative.len()).collect();
            shuffle(&mut order, &mut SplitMix64::new(0xD3_40 + rankings.len() as u64));
            rankings.push(order);
        }
        format!("key-{}", rankings[epoch][rank])
    }
}
