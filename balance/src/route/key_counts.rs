//! [`KeyCounts`]: keyed requests counted per bin of the key space, for a frontend that
//! makes its own assignments from what it sends (Rudolph's mode: no Assigner service,
//! no load reports, no store).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use steady_slice::{KeyRange, SliceKey};

use crate::ConfigError;

/// The most bins a [`KeyCounts`] may have: 2^20 (8 MiB of counters).
pub const MAX_BINS_LOG2: u32 = 20;

/// Counts of keyed requests in `2^b` equal bins of the key space: bin `i` covers the keys
/// whose top `b` bits are `i`.
///
/// Counting is one relaxed atomic increment per keyed request (the Slicelet's cost); the
/// reader [`KeyCounts::take`]s the counts, which resets them. Clones share the counters.
#[derive(Clone)]
pub struct KeyCounts {
    bins: Arc<[AtomicU64]>,
    /// `64 - b`: a key's bin is `key >> shift`.
    shift: u32,
}

impl fmt::Debug for KeyCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyCounts").field("bins", &self.bins.len()).finish()
    }
}

impl KeyCounts {
    /// `2^bins_log2` bins, zeroed.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] unless `1 <= bins_log2 <= MAX_BINS_LOG2`.
    pub fn new(bins_log2: u32) -> Result<Self, ConfigError> {
        if !(1..=MAX_BINS_LOG2).contains(&bins_log2) {
            return Err(ConfigError::new("key count bins (log2)", bins_log2, "1 to 20"));
        }
        let bins = (0..1usize << bins_log2).map(|_| AtomicU64::new(0)).collect();
        Ok(Self { bins, shift: 64 - bins_log2 })
    }

    /// Counts one request with `key`.
    #[inline]
    pub fn record(&self, key: SliceKey) {
        self.bins[(key.0 >> self.shift) as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// How many bins there are.
    pub fn bins(&self) -> usize {
        self.bins.len()
    }

    /// The keys bin `bin` covers.
    ///
    /// # Panics
    ///
    /// When `bin >= self.bins()`.
    pub fn range(&self, bin: usize) -> KeyRange {
        assert!(bin < self.bins.len(), "bin {bin} of {}", self.bins.len());
        let start = SliceKey((bin as u64) << self.shift);
        let end = (bin + 1 < self.bins.len()).then(|| SliceKey(((bin + 1) as u64) << self.shift));
        KeyRange::new(start, end)
    }

    /// The counts since the last `take`, per bin; the counters start again from zero.
    /// A request counted while this runs lands in this take or the next, never both.
    pub fn take(&self) -> Vec<u64> {
        self.bins.iter().map(|c| c.swap(0, Ordering::Relaxed)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_lands_in_the_bin_whose_range_holds_it() {
        let counts = KeyCounts::new(4).unwrap();
        assert_eq!(counts.bins(), 16);
        for key in [0, 1, u64::MAX / 3, 1 << 63, u64::MAX] {
            counts.record(SliceKey(key));
            let taken = counts.take();
            let bin = taken.iter().position(|&c| c == 1).unwrap();
            assert_eq!(taken.iter().sum::<u64>(), 1);
            assert!(counts.range(bin).contains(SliceKey(key)), "{key:#x} not in bin {bin}");
        }
    }

    #[test]
    fn the_bins_tile_the_key_space_and_take_resets() {
        let counts = KeyCounts::new(3).unwrap();
        assert_eq!(counts.range(0).start(), SliceKey(0));
        for bin in 0..7 {
            assert_eq!(counts.range(bin).end(), Some(counts.range(bin + 1).start()));
        }
        assert_eq!(counts.range(7).end(), None);
        counts.record(SliceKey(5));
        counts.clone().record(SliceKey(6));
        assert_eq!(counts.take()[0], 2);
        assert_eq!(counts.take()[0], 0);
    }

    #[test]
    fn bin_counts_outside_the_bounds_are_refused() {
        assert!(KeyCounts::new(0).is_err());
        assert!(KeyCounts::new(MAX_BINS_LOG2 + 1).is_err());
        assert_eq!(KeyCounts::new(MAX_BINS_LOG2).unwrap().bins(), 1 << 20);
    }
}
