//! The frozen pseudo-random number generator, bounded draw and shuffle.
//!
//! # Contract
//!
//! Subsets must be identical on every frontend and in every version of the library,
//! so the generator and the ways we use it are written out here rather than taken
//! from a crate whose algorithm might change. Golden vectors in the tests pin them.
//!
//! * **Generator**: SplitMix64. The state is one `u64`; each step adds
//!   [`GAMMA`] (wrapping) and returns [`mix64`] of the new state.
//! * **Bounded draw** ([`SplitMix64::below`]): a uniform integer in `0..n` by Lemire's
//!   multiply-and-reject method ("Fast random integer generation in an interval",
//!   2019): take `x`, form the 128-bit product `x * n`; its high word is the result
//!   unless the low word is below `2^64 mod n`, in which case draw again. No bias, and
//!   usually one multiplication and no division.
//! * **Shuffle** ([`shuffle`]): forward Fisher–Yates: for `i` in `0..len-1`, swap
//!   element `i` with element `i + below(len - i)`. Position `i` is final after step
//!   `i`, so a caller that needs only a prefix may stop early and see the same prefix.

use crate::hash::{mix64, GAMMA};

/// SplitMix64: a tiny, fast, statistically solid 64-bit generator (frozen; see the module docs).
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator whose first output is `mix64(seed + GAMMA)`.
    #[inline]
    pub const fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The next 64 uniformly distributed bits.
    #[inline]
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GAMMA);
        mix64(self.state)
    }

    /// A uniform integer in `0..n` (Lemire's method, frozen). Returns 0 when `n` is 0.
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        let mut product = u128::from(self.next()) * u128::from(n);
        let mut low = product as u64;
        if low < n {
            // 2^64 mod n: the number of low words that would bias the result.
            let threshold = n.wrapping_neg() % n;
            while low < threshold {
                product = u128::from(self.next()) * u128::from(n);
                low = product as u64;
            }
        }
        (product >> 64) as u64
    }
}

/// Shuffles `items` in place with forward Fisher–Yates (frozen; see the module docs).
pub fn shuffle<T>(items: &mut [T], rng: &mut SplitMix64) {
    let len = items.len();
    for i in 0..len.saturating_sub(1) {
        let j = i + rng.below((len - i) as u64) as usize;
        items.swap(i, j);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_matches_the_published_reference_sequence() {
        // The sequence for seed 1234567 printed by the reference C implementation
        // (also the test vector used by many ports of it).
        let mut rng = SplitMix64::new(1_234_567);
        let got: Vec<u64> = (0..5).map(|_| rng.next()).collect();
        assert_eq!(
            got,
            [
                6_457_827_717_110_365_317,
                3_203_168_211_198_807_973,
                9_817_491_932_198_370_423,
                4_593_380_528_125_082_431,
                16_408_922_859_458_223_821,
            ]
        );
    }

    #[test]
    fn below_stays_in_range_and_handles_degenerate_bounds() {
        let mut rng = SplitMix64::new(7);
        assert_eq!(rng.below(0), 0);
        assert_eq!(rng.below(1), 0);
        for n in [2u64, 3, 10, 1 << 33, u64::MAX] {
            for _ in 0..1000 {
                assert!(rng.below(n) < n);
            }
        }
    }

    #[test]
    fn below_is_roughly_uniform() {
        let mut rng = SplitMix64::new(42);
        let mut counts = [0u32; 10];
        for _ in 0..100_000 {
            counts[rng.below(10) as usize] += 1;
        }
        for c in counts {
            assert!((9_500..10_500).contains(&c), "{counts:?}");
        }
    }

    #[test]
    fn shuffle_is_a_permutation() {
        let mut a: Vec<u32> = (0..50).collect();
        shuffle(&mut a, &mut SplitMix64::new(9));
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..50).collect::<Vec<_>>());
        assert_ne!(a, sorted);
    }

    #[test]
    fn the_first_r_steps_fix_the_first_r_positions() {
        // The property lazy readers (Rocksteadier) rely on: stopping after r steps
        // leaves the same first r entries as the whole shuffle.
        for seed in 0..20 {
            let mut whole: Vec<u32> = (0..10).collect();
            shuffle(&mut whole, &mut SplitMix64::new(seed));
            for r in 0..10 {
                let mut partial: Vec<u32> = (0..10).collect();
                let mut rng = SplitMix64::new(seed);
                for i in 0..r {
                    let j = i + rng.below((10 - i) as u64) as usize;
                    partial.swap(i, j);
                }
                assert_eq!(partial[..r], whole[..r], "seed {seed}, {r} steps");
            }
        }
    }
}
