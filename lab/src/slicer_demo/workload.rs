//! The demo's keyed traffic: the simulator's Zipf popularity over named keys
//! ([`steady_lab::sharding::workload::Popularity`]), its ranking reshuffled each epoch,
//! sampled one request at a time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use steady_lab::sharding::workload::{Popularity as Zipf, Shift};

/// Zipf popularity over `keys` named keys (`key-<i>`) whose ranking changes each epoch.
#[derive(Debug)]
pub(crate) struct Popularity {
    zipf: Zipf,
    /// Per epoch so far: the cumulative share of keys `0..=i`, for sampling.
    cumulative: Mutex<Vec<Vec<f64>>>,
    pub(crate) epoch: AtomicU64,
}

impl Popularity {
    pub(crate) fn new(keys: usize, exponent: f64) -> Self {
        // One simulator step per epoch; the rate only scales the shares.
        let zipf = Zipf::new(keys, exponent, 1.0, Shift::Every { steps: 1 }, 0xD3_40);
        Self { zipf, cumulative: Mutex::new(Vec::new()), epoch: AtomicU64::new(0) }
    }

    /// The key name for a uniform draw `u` in [0, 1).
    pub(super) fn key(&self, u: f64) -> String {
        format!("key-{}", self.index(u))
    }

    /// The index of the key for a uniform draw `u` in [0, 1).
    pub(crate) fn index(&self, u: f64) -> usize {
        let epoch = self.epoch.load(Ordering::Relaxed) as usize;
        let mut cumulative = self.cumulative.lock().expect("not poisoned");
        while cumulative.len() <= epoch {
            let mut sum = 0.0;
            let shares = self.zipf.rates(cumulative.len()).into_iter().map(|r| {
                sum += r;
                sum
            });
            cumulative.push(shares.collect());
        }
        let shares = &cumulative[epoch];
        shares.partition_point(|&c| c < u).min(shares.len() - 1)
    }
}
