//! [`HeavyHitters`]: the heaviest keys of a weighted stream, in bounded memory
//! (Space-Saving, Metwally, Agrawal and El Abbadi 2005), with the whole sketch decayable.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A hasher for keys that are already uniform 64-bit hashes (slice keys are XXH3-64):
/// it passes the key through, so a lookup costs no hashing.
#[derive(Debug, Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used (the keys are u64); fold anything else in anyway.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, key: u64) {
        self.0 = key;
    }
}

#[derive(Debug, Clone, Copy)]
struct Counter {
    key: u64,
    /// An upper bound of the key's weight: its true weight plus at most `error`.
    count: f64,
    /// What the counter held when the key took it over.
    error: f64,
}

/// Space-Saving over at most `capacity` counters.
///
/// Guarantees (for a stream of total weight `W`, decays included): every key whose true
/// weight is above `W / capacity` holds a counter; a counter's count is never below its
/// key's true weight and at most `W / capacity` above it. So with `capacity = 2m`, any
/// key with more than `1/m` of the weight is among the `m` heaviest counters (at most
/// `m - 1` others can count as much, since the counts sum to `W`).
///
/// The counters form a min-heap by count, so that the smallest, which a new key takes
/// over when the sketch is full, is at the root. Costs: `add` is a hash lookup and a
/// sift of `O(log capacity)` steps; [`HeavyHitters::decay`] is `O(capacity)` (scaling
/// every count alike keeps the heap in order); [`HeavyHitters::top`] sorts.
#[derive(Debug)]
pub(crate) struct HeavyHitters {
    capacity: usize,
    /// A min-heap by `count`.
    heap: Vec<Counter>,
    /// Key -> its position in `heap`.
    index: HashMap<u64, usize, BuildHasherDefault<PassThrough>>,
}

impl HeavyHitters {
    /// An empty sketch of `capacity` counters (at least 1).
    pub(crate) fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            capacity,
            heap: Vec::with_capacity(capacity),
            index: HashMap::with_capacity_and_hasher(capacity, BuildHasherDefault::default()),
        }
    }

    /// Adds `weight` (positive, finite) to `key`.
    pub(crate) fn add(&mut self, key: u64, weight: f64) {
        debug_assert!(weight.is_finite() && weight > 0.0, "weight {weight}");
        if let Some(&i) = self.index.get(&key) {
            self.heap[i].count += weight;
            self.sift_down(i);
        } else if self.heap.len() < self.capacity {
            // Not full: a new counter; its count may be smaller than its parents'.
            let i = self.heap.len();
            self.heap.push(Counter { key, count: weight, error: 0.0 });
            self.index.insert(key, i);
            self.sift_up(i);
        } else {
            // Full: the key takes over the smallest counter (the root), inheriting its
            // count as its error.
            let min = self.heap[0];
            self.index.remove(&min.key);
            self.heap[0] = Counter { key, count: min.count + weight, error: min.count };
            self.index.insert(key, 0);
            self.sift_down(0);
        }
        debug_assert_eq!(self.index.len(), self.heap.len());
    }

    /// Moves the counter at `i` towards the leaves until no child counts less.
    fn sift_down(&mut self, mut i: usize) {
        loop {
            let (left, right) = (2 * i + 1, 2 * i + 2);
            let mut smallest = i;
            if left < self.heap.len() && self.heap[left].count < self.heap[smallest].count {
                smallest = left;
            }
            if right < self.heap.len() && self.heap[right].count < self.heap[smallest].count {
                smallest = right;
            }
            if smallest == i {
                return;
            }
            self.swap(i, smallest);
            i = smallest;
        }
    }

    /// Moves the counter at `i` towards the root until its parent counts no more.
    fn sift_up(&mut self, mut i: usize) {
        while i > 0 {
            let parent = (i - 1) / 2;
            if self.heap[parent].count <= self.heap[i].count {
                return;
            }
            self.swap(i, parent);
            i = parent;
        }
    }

    fn swap(&mut self, a: usize, b: usize) {
        self.heap.swap(a, b);
        self.index.insert(self.heap[a].key, a);
        self.index.insert(self.heap[b].key, b);
    }

    /// Multiplies every count by `factor` (in `0.0..=1.0`): the weights seen so far count
    /// for that much less. Scaling every counter alike keeps Space-Saving's guarantees:
    /// it is the sketch of the same stream with the past weights scaled.
    pub(crate) fn decay(&mut self, factor: f64) {
        debug_assert!((0.0..=1.0).contains(&factor), "factor {factor}");
        for c in &mut self.heap {
            c.count *= factor;
            c.error *= factor;
        }
    }

    /// The `n` heaviest keys with their counts (upper bounds), heaviest first; ties in
    /// key order, so the result is deterministic.
    pub(crate) fn top(&self, n: usize) -> Vec<(u64, f64)> {
        let mut all: Vec<(u64, f64)> = self.heap.iter().map(|c| (c.key, c.count)).collect();
        all.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        all.truncate(n);
        all
    }

    /// The count and error of `key`, if it holds a counter.
    #[cfg(test)]
    fn get(&self, key: u64) -> Option<(f64, f64)> {
        self.index.get(&key).map(|&i| (self.heap[i].count, self.heap[i].error))
    }

    /// Whether the heap and the index agree and the heap is in order.
    #[cfg(test)]
    fn is_consistent(&self) -> bool {
        let ordered = (1..self.heap.len()).all(|i| self.heap[(i - 1) / 2].count <= self.heap[i].count);
        let indexed = self.heap.iter().enumerate().all(|(i, c)| self.index.get(&c.key) == Some(&i));
        ordered && indexed && self.index.len() == self.heap.len()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_few_keys_are_counted_exactly() {
        let mut s = HeavyHitters::new(4);
        for (key, times) in [(1, 5), (2, 3), (3, 1)] {
            for _ in 0..times {
                s.add(key, 1.0);
            }
        }
        assert_eq!(s.top(2), [(1, 5.0), (2, 3.0)]);
        assert_eq!(s.get(3), Some((1.0, 0.0)));
    }

    #[test]
    fn a_new_key_takes_over_the_smallest_counter_with_its_count_as_error() {
        let mut s = HeavyHitters::new(2);
        s.add(1, 5.0);
        s.add(2, 2.0);
        s.add(3, 1.0);
        assert_eq!(s.get(2), None, "the smallest counter went to key 3");
        assert_eq!(s.get(3), Some((3.0, 2.0)));
        assert_eq!(s.top(5), [(1, 5.0), (3, 3.0)]);
    }

    #[test]
    fn decay_scales_every_count() {
        let mut s = HeavyHitters::new(2);
        s.add(1, 8.0);
        s.add(2, 2.0);
        s.decay(0.5);
        assert_eq!(s.top(2), [(1, 4.0), (2, 1.0)]);
    }

    /// A stream of `len` keys from `0..distinct`, with a planted key (`u64::MAX`) at the
    /// positions `hot` selects (a share of 0 to 30%, so that it is sometimes just over
    /// the threshold and sometimes under), and decays of the whole sketch between items
    /// where `decays` says.
    fn stream() -> impl Strategy<Value = (Vec<u64>, Vec<bool>, Vec<bool>)> {
        (1usize..2000, 2u64..500, 0.0..0.3f64).prop_flat_map(|(len, distinct, share)| {
            (
                prop::collection::vec(0..distinct, len),
                prop::collection::vec(prop::bool::weighted(share), len),
                prop::collection::vec(prop::bool::weighted(0.01), len),
            )
        })
    }

    proptest! {
        /// Space-Saving's guarantee, decays included: a key with more than 1/capacity of
        /// the weight holds a counter that overestimates it by at most W/capacity; with
        /// capacity 2m it is among the m heaviest reported.
        #[test]
        fn a_key_with_more_than_one_mth_of_the_weight_is_always_reported(
            (keys, hot, decays) in stream(),
            m in 1usize..16,
        ) {
            let capacity = 2 * m;
            let mut sketch = HeavyHitters::new(capacity);
            let mut truth: HashMap<u64, f64> = HashMap::new();
            for ((&key, &hot), &decay) in keys.iter().zip(&hot).zip(&decays) {
                if decay {
                    sketch.decay(0.5);
                    truth.values_mut().for_each(|w| *w *= 0.5);
                }
                // Key u64::MAX is the planted heavy key.
                let key = if hot { u64::MAX } else { key };
                sketch.add(key, 1.0);
                *truth.entry(key).or_default() += 1.0;
            }
            prop_assert!(sketch.is_consistent());
            let total: f64 = truth.values().sum();
            let top = sketch.top(m);
            for (&key, &weight) in &truth {
                if weight > total / capacity as f64 * (1.0 + 1e-9) {
                    let (count, _) = sketch.get(key).expect("a key over W/capacity holds a counter");
                    prop_assert!(count >= weight * (1.0 - 1e-9), "{count} under its weight {weight}");
                    prop_assert!(count <= weight + total / capacity as f64 + 1e-6);
                }
                if weight > total / m as f64 * (1.0 + 1e-9) {
                    prop_assert!(top.iter().any(|t| t.0 == key), "{key} ({weight} of {total}) not in {top:?}");
                }
            }
        }
    }
}
