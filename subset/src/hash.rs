//! The frozen 64-bit hashes that seed every pseudo-random choice in this crate.
//!
//! # Contract
//!
//! These functions are part of the subset-order contract: every frontend of a fleet
//! must compute the same subsets whichever version of the library it runs, so their
//! outputs never change. Golden vectors in the tests pin them.
//!
//! * [`mix64`] is the output function of SplitMix64 (Steele, Lea and Flood, 2014,
//!   "Fast splittable pseudorandom number generators"; the variant with the shifts
//!   30, 27, 31 and the multipliers below, which Stafford calls "Mix13"). It is a
//!   bijection on `u64` with good avalanche: flipping one input bit flips about half
//!   the output bits.
//! * [`hash_pair`] combines two words: `mix64(mix64(a + GAMMA) ^ b)` in wrapping
//!   arithmetic, where `GAMMA = 0x9E37_79B9_7F4A_7C15` (the SplitMix64 increment,
//!   2^64 divided by the golden ratio, rounded to odd). For a fixed `a` it is a
//!   bijection in `b`, so two backends never share a hash under one frontend seed.

/// The SplitMix64 increment ("golden gamma"): 2^64 / φ, rounded to an odd number.
pub const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output function: a fast bijective mixer of one 64-bit word.
///
/// `z ^= z >> 30; z *= 0xBF58_476D_1CE4_E5B9; z ^= z >> 27; z *= 0x94D0_49BB_1331_11EB; z ^= z >> 31`
/// (multiplications wrap). Frozen.
#[inline]
pub const fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Hashes an ordered pair of words: `mix64(mix64(a + GAMMA) ^ b)`. Frozen.
///
/// Used to derive a seed from (salt, frontend), (salt, round), (seed, backend), ...
/// Not symmetric: `hash_pair(a, b) != hash_pair(b, a)` in general.
#[inline]
pub const fn hash_pair(a: u64, b: u64) -> u64 {
    mix64(mix64(a.wrapping_add(GAMMA)) ^ b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mix64_is_the_splitmix64_finaliser() {
        // SplitMix64 seeded with 0 outputs mix64(GAMMA) first; this is the value
        // every reference implementation prints for that seed.
        assert_eq!(mix64(GAMMA), 0xE220_A839_7B1D_CDAF);
        assert_eq!(mix64(0), 0);
    }

    #[test]
    fn hash_pair_depends_on_both_words_and_their_order() {
        assert_ne!(hash_pair(1, 2), hash_pair(2, 1));
        assert_ne!(hash_pair(0, 0), hash_pair(0, 1));
        assert_ne!(hash_pair(0, 0), hash_pair(1, 0));
    }
}
