//! Baselines for steady's criterion benchmarks, and the tool that turns criterion's
//! results into the ratios we quote.
//!
//! Every figure steady publishes is a ratio against a baseline measured in the same
//! run: the machine is shared and noisy, absolute nanoseconds are not comparable
//! across runs, ratios mostly are.

#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod report;

/// Ringsteady (unscaled) the naive way: build the whole ring of `N` van der Corput
/// positions, sort it, find the frontend's position and take `k` clockwise.
///
/// `O(N log N)` per frontend. This is the baseline that the lazy `O(k log N)` ring walk
/// in `steady_subset` is measured against; it returns the same subsets (tested).
pub fn naive_ring_subset(frontend: usize, backends: usize, size: usize) -> Vec<usize> {
    let mut ring: Vec<(u64, usize)> = (0..backends).map(|n| ((n as u64).reverse_bits(), n)).collect();
    ring.sort_unstable();
    let pos = (frontend as u64).reverse_bits();
    let start = ring.partition_point(|&(p, _)| p < pos);
    (0..size.min(backends)).map(|i| ring[(start + i) % backends].1).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use steady_subset::{Ringsteady, Subsetting};

    #[test]
    fn naive_ring_agrees_with_the_lazy_ring_walk() {
        for n in [1usize, 7, 20, 100, 1000] {
            for m in [0usize, 1, 5, 99, 12345] {
                assert_eq!(naive_ring_subset(m, n, 20), Ringsteady::unscaled().subset(m, n, 20).unwrap());
            }
        }
    }
}
