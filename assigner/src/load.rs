//! [`Load`]: observed load over the key space, and [`ReplicaLimits`].

use steady_slice::{KeyRange, SliceKey, MAX_REPLICAS};

use crate::error::AssignError;

/// The key space's size, `2^64`, as a float.
pub(crate) const SPACE: f64 = 18_446_744_073_709_551_616.0;

/// Observed load (requests per second by default) over the key space: load at single
/// keys (the heaviest keys Slicelets report, or every key a simulator knows), load spread
/// evenly over ranges (what Slicelets measure per slice), plus an optional uniform part
/// spread evenly over the whole key space (what an assigner falls back to when reports
/// are stale). Keys not covered carry only the uniform part.
///
/// A slice's load is the load of its keys; each of its replicas carries that load divided
/// by the number of replicas. Queries cost `O(log keys + log ranges)`: the per-key loads
/// are kept sorted with prefix sums, the ranges as a step function with prefix sums.
#[derive(Debug, Clone, PartialEq)]
pub struct Load {
    keys: Vec<u64>,
    /// `prefix[i]`: the load of `keys[..i]`.
    prefix: Vec<f64>,
    /// Range loads as a step function: between `bounds[i]` and `bounds[i + 1]` the load
    /// per key is `density[i]`; `below_bound[i]` is the range load below `bounds[i]`.
    bounds: Vec<u128>,
    density: Vec<f64>,
    below_bound: Vec<f64>,
    uniform: f64,
}

impl Default for Load {
    /// No load at all (as [`Load::none`]).
    fn default() -> Self {
        Self::none()
    }
}

impl Load {
    /// No load at all.
    pub fn none() -> Self {
        Self {
            keys: Vec::new(),
            prefix: vec![0.0],
            bounds: Vec::new(),
            density: Vec::new(),
            below_bound: Vec::new(),
            uniform: 0.0,
        }
    }

    /// Load at single keys; a key listed twice carries the sum.
    ///
    /// # Errors
    ///
    /// [`AssignError::BadLoad`] for a negative, NaN or infinite load, or a sum that
    /// overflows to infinity.
    pub fn from_points(points: impl IntoIterator<Item = (SliceKey, f64)>) -> Result<Self, AssignError> {
        let mut sorted: Vec<(u64, f64)> = Vec::new();
        for (key, load) in points {
            if !load.is_finite() || load < 0.0 {
                return Err(AssignError::BadLoad { key, load });
            }
            sorted.push((key.get(), load));
        }
        sorted.sort_unstable_by_key(|p| p.0);
        let mut keys = Vec::with_capacity(sorted.len());
        let mut prefix = Vec::with_capacity(sorted.len() + 1);
        prefix.push(0.0);
        let mut sum = 0.0;
        for (key, load) in sorted {
            sum += load;
            if !sum.is_finite() {
                return Err(AssignError::BadLoad { key: SliceKey(key), load: sum });
            }
            if keys.last() == Some(&key) {
                *prefix.last_mut().expect("a key was pushed") = sum;
            } else {
                keys.push(key);
                prefix.push(sum);
            }
        }
        Ok(Self { keys, prefix, ..Self::none() })
    }

    /// Adds load spread evenly over each range; ranges may overlap (their loads add up,
    /// as the reports of a slice's replicas do). Replaces ranges added before.
    ///
    /// # Errors
    ///
    /// [`AssignError::BadLoad`] (with the range's start) for a negative, NaN or infinite
    /// load, or a sum that overflows to infinity.
    pub fn with_ranges(
        mut self,
        ranges: impl IntoIterator<Item = (KeyRange, f64)>,
    ) -> Result<Self, AssignError> {
        // Density changes at each range's ends; a sweep turns them into a step function.
        // (where, density, whether a range starts there)
        let mut steps: Vec<(u128, f64, bool)> = Vec::new();
        for (range, load) in ranges {
            if !load.is_finite() || load < 0.0 {
                return Err(AssignError::BadLoad { key: range.start(), load });
            }
            let start = u128::from(range.start().get());
            let end = range.end().map_or(1u128 << 64, |e| u128::from(e.get()));
            let density = load / (end - start) as f64;
            steps.push((start, density, true));
            steps.push((end, density, false));
        }
        // Ends before starts at one position, so ranges that only touch never overlap.
        steps.sort_by_key(|s| (s.0, s.2));
        let (mut bounds, mut density, mut below_bound) = (Vec::new(), Vec::new(), Vec::new());
        let mut below = 0.0f64;
        // The densities of the ranges open at the sweep's position. The density in force
        // is recomputed from them, never by adding and subtracting: a one-key range has a
        // density some 10^20 times a wide one's, and the wide one's would round away.
        let mut open: Vec<f64> = Vec::new();
        let mut current = 0.0f64;
        for (at, change, starts) in steps {
            if let Some(&last) = bounds.last() {
                below += current * (at - last) as f64;
                if !below.is_finite() {
                    return Err(AssignError::BadLoad {
                        key: SliceKey(at.min(u128::from(u64::MAX)) as u64),
                        load: below,
                    });
                }
            }
            if starts {
                open.push(change);
            } else if let Some(i) = open.iter().position(|&d| d.to_bits() == change.to_bits()) {
                open.swap_remove(i);
            }
            current = open.iter().sum();
            if bounds.last() == Some(&at) {
                *density.last_mut().expect("pushed with the bound") = current;
            } else {
                bounds.push(at);
                density.push(current);
                below_bound.push(below);
            }
        }
        self.bounds = bounds;
        self.density = density;
        self.below_bound = below_bound;
        Ok(self)
    }

    /// Adds `total` load spread evenly over the whole key space.
    ///
    /// # Errors
    ///
    /// [`AssignError::BadLoad`] (with key 0) for a negative, NaN or infinite total.
    pub fn with_uniform(mut self, total: f64) -> Result<Self, AssignError> {
        if !total.is_finite() || total < 0.0 {
            return Err(AssignError::BadLoad { key: SliceKey::MIN, load: total });
        }
        self.uniform = total;
        Ok(self)
    }

    /// The load of the whole key space.
    pub fn total(&self) -> f64 {
        self.prefix.last().copied().unwrap_or(0.0) + self.below_ranges(1u128 << 64) + self.uniform
    }

    /// The load of the keys of `range`.
    pub fn of_range(&self, range: KeyRange) -> f64 {
        let end = range.end().map_or(1u128 << 64, |e| u128::from(e.get()));
        self.between(range.start().get(), end)
    }

    /// The load of the keys in `[start, end)` (`end` up to `2^64`).
    pub(crate) fn between(&self, start: u64, end: u128) -> f64 {
        (self.below(end) - self.below(u128::from(start))).max(0.0)
    }

    /// The load of the keys below `key`.
    fn below(&self, key: u128) -> f64 {
        let i = self.keys.partition_point(|&k| u128::from(k) < key);
        self.prefix[i] + self.below_ranges(key) + self.uniform * (key as f64 / SPACE)
    }

    /// The range load below `key`.
    fn below_ranges(&self, key: u128) -> f64 {
        let i = self.bounds.partition_point(|&b| b <= key);
        if i == 0 {
            return 0.0;
        }
        self.below_bound[i - 1] + self.density[i - 1] * (key - self.bounds[i - 1]) as f64
    }

    /// Where to split `[start, end)` in two: the load median where keys carry load (the
    /// boundary just before or just after the key at which half of the range's load is
    /// reached, whichever leaves the halves closer; so a hot key ends up in a slice of
    /// its own after a few splits), the midpoint where no load is known. `None` for a
    /// range of one key. The result is strictly inside the range.
    pub(crate) fn split_point(&self, start: u64, end: u128) -> Option<u64> {
        let len = end - u128::from(start);
        if len < 2 {
            return None;
        }
        let total = self.between(start, end);
        let midpoint = (u128::from(start) + len / 2) as u64;
        if total <= 0.0 {
            return Some(midpoint);
        }
        let base = self.below(u128::from(start));
        // The smallest s in (start, end] whose prefix reaches half of the range's load.
        let (mut lo, mut hi) = (u128::from(start) + 1, end);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.below(mid) - base >= total / 2.0 {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        let inside = |s: u128| s > u128::from(start) && s < end;
        let gap = |s: u128| ((self.below(s) - base) * 2.0 - total).abs();
        let best = [lo - 1, lo]
            .into_iter()
            .filter(|&s| inside(s))
            .min_by(|&a, &b| gap(a).total_cmp(&gap(b)))
            .map(|s| s as u64);
        Some(best.unwrap_or(midpoint))
    }
}

/// How many replicas each slice has: `1 <= min <= max <= MAX_REPLICAS`. When fewer
/// tasks serve than `min`, every slice gets every serving task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaLimits {
    min: usize,
    max: usize,
}

impl Default for ReplicaLimits {
    /// One replica per slice.
    fn default() -> Self {
        Self { min: 1, max: 1 }
    }
}

impl ReplicaLimits {
    /// Limits `min..=max`.
    ///
    /// # Errors
    ///
    /// [`AssignError::BadReplicaLimits`] unless `1 <= min <= max <= MAX_REPLICAS`.
    pub fn new(min: usize, max: usize) -> Result<Self, AssignError> {
        if min == 0 || min > max || max > MAX_REPLICAS {
            return Err(AssignError::BadReplicaLimits { min, max });
        }
        Ok(Self { min, max })
    }

    /// The least replicas a slice has.
    pub fn min(&self) -> usize {
        self.min
    }

    /// The most replicas a slice has.
    pub fn max(&self) -> usize {
        self.max
    }

    /// The limits with `serving` tasks: both capped at `serving`.
    pub(crate) fn effective(&self, serving: usize) -> (usize, usize) {
        (self.min.min(serving).max(1), self.max.min(serving).max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_loads_add_points_and_the_uniform_part() {
        let load = Load::from_points([(SliceKey(10), 2.0), (SliceKey(5), 1.0), (SliceKey(10), 3.0)])
            .unwrap()
            .with_uniform(4.0)
            .unwrap();
        assert_eq!(load.total(), 10.0);
        assert_eq!(load.between(0, 10), 1.0 + 4.0 * 10.0 / SPACE);
        assert_eq!(load.of_range(KeyRange::FULL), 10.0);
        assert!(Load::from_points([(SliceKey(1), -1.0)]).is_err());
        assert!(Load::from_points([(SliceKey(1), f64::NAN)]).is_err());
        assert!(Load::none().with_uniform(f64::INFINITY).is_err());
    }

    #[test]
    fn range_loads_spread_evenly_and_overlapping_ranges_add_up() {
        let r = |a: u64, b: Option<u64>| KeyRange::new(SliceKey(a), b.map(SliceKey));
        let load = Load::from_points([(SliceKey(50), 7.0)])
            .unwrap()
            .with_ranges([(r(0, Some(100)), 10.0), (r(50, Some(150)), 20.0), (r(1 << 63, None), 4.0)])
            .unwrap();
        assert_eq!(load.total(), 41.0);
        assert_eq!(load.between(0, 50), 5.0);
        // 5 of the first range, 10 of the second, and the point at 50.
        assert_eq!(load.between(50, 100), 22.0);
        assert_eq!(load.between(100, 200), 10.0);
        assert_eq!(load.between(1 << 63, (1 << 63) + (1 << 62)), 2.0);
        // The load median of an evenly loaded range is its middle.
        assert_eq!(Load::none().with_ranges([(r(0, Some(100)), 8.0)]).unwrap().split_point(0, 100), Some(50));
        assert!(Load::none().with_ranges([(r(0, Some(1)), -1.0)]).is_err());
        // A range without load between loaded ones changes nothing.
        let gap = Load::none()
            .with_ranges([(r(0, Some(10)), 1.0), (r(5, Some(20)), 0.0), (r(30, Some(40)), 1.0)])
            .unwrap();
        assert_eq!((gap.between(10, 30), gap.total()), (0.0, 2.0));
        // A one-key range beside a wide one, in either order: nothing rounds away.
        let (k, half) = (1u64 << 40, 1u64 << 63);
        for order in [false, true] {
            let mut ranges = vec![(r(k + 1, Some(half)), 100.0), (r(k, Some(k + 1)), 1000.0)];
            if order {
                ranges.reverse();
            }
            let load = Load::none().with_ranges(ranges).unwrap();
            assert!((load.total() - 1100.0).abs() < 1e-6, "{}", load.total());
            assert!((load.between(k + 1, 1u128 << 63) - 100.0).abs() < 1e-6);
        }
        assert_eq!(Load::default().of_range(KeyRange::FULL), 0.0);
    }

    #[test]
    fn a_hot_key_is_split_off_and_unknown_load_splits_in_the_middle() {
        let load =
            Load::from_points([(SliceKey(100), 1.0), (SliceKey(500), 50.0), (SliceKey(900), 1.0)]).unwrap();
        let s = load.split_point(0, 1000).unwrap();
        assert!(s == 500 || s == 501, "{s}");
        // Repeated splits isolate the hot key.
        let piece = if s == 500 { (500, 1000) } else { (0, 501) };
        let t = load.split_point(piece.0, piece.1).unwrap();
        assert!(t == 501 || t == 500);
        assert_eq!(Load::none().split_point(0, 1 << 64), Some(1 << 63));
        assert_eq!(load.split_point(7, 8), None);
    }
}
