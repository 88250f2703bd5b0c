//! [`SliceKey`]: where a request's key falls in the 64-bit key space.

use std::fmt;

/// A position in the 64-bit key space that assignments divide into slices.
///
/// # Contract
///
/// [`SliceKey::of`] is XXH3-64 with seed 0 of the key's bytes (the reference
/// `XXH3_64bits`), so any language with an XXH3 implementation computes the same slice
/// key for the same bytes. Frozen: golden vectors in the tests pin it. Callers that
/// already have a well-mixed 64-bit key may use [`SliceKey::new`] instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(transparent))]
pub struct SliceKey(pub u64);

impl SliceKey {
    /// The lowest key: every assignment's first slice starts here.
    pub const MIN: SliceKey = SliceKey(0);

    /// A precomputed slice key.
    pub const fn new(key: u64) -> Self {
        Self(key)
    }

    /// The slice key of `bytes`: XXH3-64, seed 0 (its cost: `docs/benchmarks.md#keyed-routing`).
    #[inline]
    pub fn of(bytes: impl AsRef<[u8]>) -> Self {
        Self(xxhash_rust::xxh3::xxh3_64(bytes.as_ref()))
    }

    /// The raw value.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for SliceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#018x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn of_is_xxh3_64_with_seed_zero() {
        // The reference value of XXH3_64bits("") from the xxHash sources.
        assert_eq!(SliceKey::of(b"").get(), 0x2D06_8005_38D3_94C2);
        assert_ne!(SliceKey::of(b"a"), SliceKey::of(b"b"));
        assert_eq!(SliceKey::of("user:42"), SliceKey::of(String::from("user:42")));
    }
}
