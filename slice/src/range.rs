//! [`KeyRange`]: a contiguous run of slice keys.

use std::fmt;

use crate::key::SliceKey;

/// The keys from `start` (inclusive) up to `end` (exclusive), or to the end of the key
/// space (`u64::MAX` included) when `end` is `None`. Never empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyRange {
    start: SliceKey,
    end: Option<SliceKey>,
}

impl KeyRange {
    /// The keys from `start` up to `end` (exclusive; `None`: the end of the key space).
    ///
    /// # Panics
    ///
    /// When `end` is not after `start` (the range would be empty).
    pub fn new(start: SliceKey, end: Option<SliceKey>) -> Self {
        assert!(end.is_none_or(|e| e > start), "empty key range {start}..{end:?}");
        Self { start, end }
    }

    /// The whole key space.
    pub const FULL: KeyRange = KeyRange { start: SliceKey::MIN, end: None };

    /// The first key.
    pub fn start(&self) -> SliceKey {
        self.start
    }

    /// The first key past the range; `None` when it runs to the end of the key space.
    pub fn end(&self) -> Option<SliceKey> {
        self.end
    }

    /// Whether `key` is in the range.
    pub fn contains(&self, key: SliceKey) -> bool {
        self.start <= key && self.end.is_none_or(|e| key < e)
    }

    /// How many keys it holds (up to `2^64`, hence `u128`).
    pub fn len(&self) -> u128 {
        let end = self.end.map_or(1u128 << 64, |e| u128::from(e.get()));
        end - u128::from(self.start.get())
    }

    /// Always false: a key range holds at least one key (clippy's companion of `len`).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Its share of the key space, in `(0, 1]`.
    pub fn fraction(&self) -> f64 {
        self.len() as f64 / 18_446_744_073_709_551_616.0
    }
}

impl fmt::Display for KeyRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.end {
            Some(end) => write!(f, "[{}, {})", self.start, end),
            None => write!(f, "[{}, end]", self.start),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_and_fractions_cover_the_edges_of_the_key_space() {
        assert_eq!(KeyRange::FULL.len(), 1 << 64);
        assert_eq!(KeyRange::FULL.fraction(), 1.0);
        let top = KeyRange::new(SliceKey(u64::MAX), None);
        assert_eq!(top.len(), 1);
        assert!(top.contains(SliceKey(u64::MAX)) && !top.contains(SliceKey(u64::MAX - 1)));
        let half = KeyRange::new(SliceKey(0), Some(SliceKey(1 << 63)));
        assert_eq!(half.fraction(), 0.5);
        assert!(half.contains(SliceKey(0)) && !half.contains(SliceKey(1 << 63)));
        assert_eq!(half.to_string(), "[0x0000000000000000, 0x8000000000000000)");
    }

    #[test]
    #[should_panic(expected = "empty key range")]
    fn an_empty_range_cannot_be_built() {
        let _ = KeyRange::new(SliceKey(5), Some(SliceKey(5)));
    }
}
