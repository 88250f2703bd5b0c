//! [`KeyTally`]: keyed requests counted per key in bounded memory, for the load a
//! channel reports to an A119 server.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use steady_balance::ConfigError;
use steady_proto::autosharding::KeyLoadSource;
use steady_slice::SliceKey;

/// The keys a channel's tally holds by default: 65,536 (1 MiB of counters).
pub const DEFAULT_TALLY_KEYS: usize = 1 << 16;

/// The most keys a [`KeyTally`] may hold: 2^20 (16 MiB of counters).
pub const MAX_TALLY_KEYS: usize = 1 << 20;

/// How many slots a key looks at before it is counted in its bin instead.
const PROBES: usize = 8;

/// The bins of the key space that count the requests of keys without a slot.
const OVERFLOW_BINS_LOG2: u32 = 10;

/// A slot's key when it holds none. The key 0 itself is counted in its bin.
const EMPTY: u64 = 0;

/// Keyed requests counted per key, in a fixed table of slots (a key and its count), so
/// that memory stays bounded whatever the keys.
///
/// Counting a request is two relaxed atomic operations when its key holds a slot (a
/// load, an add), three when it takes a free one (a compare-and-swap), and nothing is
/// allocated. A key finds its slot among 8 neighbours of its hash; when all of
/// them hold other keys, the request is counted in one of 1,024 equal bins of the key
/// space instead, and reported as load at the bin's middle key. That happens only with
/// more distinct keys in an interval than the table holds, when each bin gathers the
/// load of many keys: a report's range then spans several bins anyway, at the quanta
/// steady's server sends (a share of a report's load per range of 1/(16 tasks), kept
/// within 1/1024 and 1/20).
///
/// [`KeyTally::drain`] takes the counts since the last drain. A slot stays with its key
/// while the key carries at least an even share of the drained requests (one in the
/// table's capacity), so that a busy key never waits for a slot; the others are freed
/// for the next interval's keys. A request counted at the instant its key's slot is
/// freed may be counted for the key that takes the slot next (or, if none does, at key
/// 0): never lost, never counted twice. Clones share the table.
#[derive(Clone)]
pub struct KeyTally {
    inner: Arc<Table>,
}

struct Table {
    slots: Box<[Slot]>,
    /// `64 - log2(slots)`: a key's first slot is its hash's top bits.
    shift: u32,
    overflow: Box<[AtomicU64]>,
}

#[derive(Default)]
struct Slot {
    key: AtomicU64,
    count: AtomicU64,
}

impl fmt::Debug for KeyTally {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyTally").field("keys", &self.inner.slots.len()).finish()
    }
}

impl Default for KeyTally {
    /// [`DEFAULT_TALLY_KEYS`] slots.
    fn default() -> Self {
        Self::new(DEFAULT_TALLY_KEYS).expect("the default is in range")
    }
}

impl KeyTally {
    /// A tally of `keys` slots (rounded up to a power of two), zeroed.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] unless `PROBES <= keys <= MAX_TALLY_KEYS` (8 to 2^20).
    pub fn new(keys: usize) -> Result<Self, ConfigError> {
        if !(PROBES..=MAX_TALLY_KEYS).contains(&keys) {
            return Err(ConfigError::new("tally keys", keys, "8 to 2^20"));
        }
        let keys = keys.next_power_of_two();
        let slots = (0..keys).map(|_| Slot::default()).collect();
        let overflow = (0..1usize << OVERFLOW_BINS_LOG2).map(|_| AtomicU64::new(0)).collect();
        Ok(Self { inner: Arc::new(Table { slots, shift: 64 - keys.trailing_zeros(), overflow }) })
    }

    /// How many keys the table holds.
    pub fn keys(&self) -> usize {
        self.inner.slots.len()
    }

    /// Counts one request with `key`.
    #[inline]
    pub fn record(&self, key: SliceKey) {
        let table = &*self.inner;
        let key = key.get();
        if key != EMPTY {
            let mask = table.slots.len() - 1;
            // Fibonacci hashing: keys set in code need not be hashes already.
            let mut i = (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> table.shift) as usize;
            for _ in 0..PROBES {
                let slot = &table.slots[i];
                let mut held = slot.key.load(Ordering::Relaxed);
                if held == EMPTY {
                    // A free slot: this key's, unless another key took it first.
                    held = match slot.key.compare_exchange(EMPTY, key, Ordering::Relaxed, Ordering::Relaxed) {
                        Ok(_) => key,
                        Err(taken) => taken,
                    };
                }
                if held == key {
                    slot.count.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                i = (i + 1) & mask;
            }
        }
        table.overflow[(key >> (64 - OVERFLOW_BINS_LOG2)) as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// The requests per key since the last drain (since the tally began, for the first);
    /// the counts start again from zero. A key may appear twice (its counts add up).
    pub fn drain(&self) -> Vec<(SliceKey, f64)> {
        let table = &*self.inner;
        let counts: Vec<u64> = table.slots.iter().map(|slot| slot.count.swap(0, Ordering::Relaxed)).collect();
        let mut out: Vec<(SliceKey, f64)> = Vec::new();
        let mut total = 0u64;
        for (slot, &count) in table.slots.iter().zip(&counts) {
            if count > 0 {
                out.push((SliceKey(slot.key.load(Ordering::Relaxed)), count as f64));
                total += count;
            }
        }
        let bin_width = 1u64 << (64 - OVERFLOW_BINS_LOG2);
        for (bin, counter) in table.overflow.iter().enumerate() {
            let count = counter.swap(0, Ordering::Relaxed);
            if count > 0 {
                out.push((SliceKey(bin as u64 * bin_width + bin_width / 2), count as f64));
                total += count;
            }
        }
        // Frees the slots of keys below an even share, for the next interval's keys.
        let keys = table.slots.len() as u64;
        for (slot, &count) in table.slots.iter().zip(&counts) {
            let key = slot.key.load(Ordering::Relaxed);
            if key != EMPTY && count.saturating_mul(keys) < total.max(1) {
                let _ = slot.key.compare_exchange(key, EMPTY, Ordering::Relaxed, Ordering::Relaxed);
            }
        }
        out
    }
}

impl KeyLoadSource for KeyTally {
    fn drain(&self) -> Vec<(SliceKey, f64)> {
        KeyTally::drain(self)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn summed(loads: Vec<(SliceKey, f64)>) -> BTreeMap<u64, f64> {
        let mut out = BTreeMap::new();
        for (key, load) in loads {
            *out.entry(key.get()).or_insert(0.0) += load;
        }
        out
    }

    #[test]
    fn keys_that_fit_are_counted_exactly_and_a_drain_starts_again() {
        let tally = KeyTally::new(1024).unwrap();
        for key in 1..=500u64 {
            for _ in 0..key % 7 + 1 {
                tally.clone().record(SliceKey(key));
            }
        }
        let got = summed(tally.drain());
        assert_eq!(got.len(), 500);
        assert!((1..=500u64).all(|key| got[&key] == (key % 7 + 1) as f64));
        assert!(tally.drain().is_empty(), "nothing since");
    }

    #[test]
    fn more_keys_than_slots_keep_the_total_in_bounded_memory() {
        let tally = KeyTally::new(64).unwrap();
        let mut rng = steady_subset::prng::SplitMix64::new(3);
        for _ in 0..100_000 {
            tally.record(SliceKey(rng.next()));
        }
        let loads = tally.drain();
        assert!(loads.len() <= 64 + 1024, "{} entries", loads.len());
        assert_eq!(loads.iter().map(|l| l.1).sum::<f64>(), 100_000.0);
        tally.record(SliceKey(0));
        let bin = tally.drain();
        assert_eq!(bin, [(SliceKey(1 << 53), 1.0)], "key 0 is counted in the first bin, at its middle");
    }

    #[test]
    fn a_busy_key_keeps_its_slot_and_quiet_ones_make_room() {
        let tally = KeyTally::new(8).unwrap();
        for _ in 0..100 {
            tally.record(SliceKey(1));
        }
        for key in 2..=8 {
            tally.record(SliceKey(key));
        }
        assert_eq!(tally.drain().len(), 8, "eight keys in eight slots");
        // Keys 2..=8 had less than an even share: their slots are free for new keys.
        for key in 11..=17 {
            tally.record(SliceKey(key));
        }
        tally.record(SliceKey(1));
        let got = summed(tally.drain());
        let expected: BTreeMap<u64, f64> = [1].into_iter().chain(11..=17).map(|k| (k, 1.0)).collect();
        assert_eq!(got, expected, "every key in a slot of its own, none in a bin");
    }

    #[test]
    fn concurrent_counts_are_never_lost_nor_counted_twice() {
        let tally = KeyTally::new(256).unwrap();
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let tally = tally.clone();
                std::thread::spawn(move || {
                    let mut rng = steady_subset::prng::SplitMix64::new(t);
                    for _ in 0..50_000 {
                        // A few busy keys and a long tail.
                        let key = if rng.next() % 2 == 0 { rng.next() % 16 + 1 } else { rng.next() };
                        tally.record(SliceKey(key));
                    }
                })
            })
            .collect();
        let mut drained = 0.0;
        while threads.iter().any(|t| !t.is_finished()) {
            drained += tally.drain().iter().map(|l| l.1).sum::<f64>();
        }
        for thread in threads {
            thread.join().unwrap();
        }
        drained += tally.drain().iter().map(|l| l.1).sum::<f64>();
        assert_eq!(drained, 200_000.0);
    }

    #[test]
    fn sizes_outside_the_bounds_are_refused() {
        assert!(KeyTally::new(7).is_err());
        assert!(KeyTally::new(MAX_TALLY_KEYS + 1).is_err());
        assert_eq!(KeyTally::new(1000).unwrap().keys(), 1024);
        assert_eq!(KeyTally::default().keys(), DEFAULT_TALLY_KEYS);
    }
}
