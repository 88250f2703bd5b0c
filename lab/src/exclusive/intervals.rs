//! Ownership intervals and the checker that no two overlap.
//!
//! A node appends one line per interval during which its Slicelet believed it owned a
//! key: `key owner start end`, the times in nanoseconds of the machine's monotonic clock
//! (`CLOCK_MONOTONIC`, which every process on one machine shares). Both ends are
//! measured inside the belief: `start` just after a key handle was taken, `end` just
//! before a check of it that said it was still valid. So a recorded interval is never
//! longer than the belief, and two that overlap are two beliefs that did.

use std::fmt;

/// One key believed owned by one task from `start` to `end` (nanoseconds, monotonic).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Interval {
    pub(crate) key: u32,
    pub(crate) owner: u32,
    pub(crate) start: u64,
    pub(crate) end: u64,
}

impl Interval {
    /// The line a node writes.
    pub(crate) fn line(&self) -> String {
        format!("{} {} {} {}", self.key, self.owner, self.start, self.end)
    }

    /// Reads a line (`None` for one that is not an interval, e.g. cut short by a kill).
    pub(crate) fn parse(line: &str) -> Option<Self> {
        let mut parts = line.split(' ').map(|p| p.parse::<u64>().ok());
        let (key, owner, start, end) = (parts.next()??, parts.next()??, parts.next()??, parts.next()??);
        if parts.next().is_some() || start > end {
            return None;
        }
        Some(Self { key: u32::try_from(key).ok()?, owner: u32::try_from(owner).ok()?, start, end })
    }
}

/// Two tasks that believed they owned one key at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Overlap {
    pub(crate) first: Interval,
    pub(crate) second: Interval,
}

impl Overlap {
    /// How long both believed, in nanoseconds.
    pub(crate) fn nanos(&self) -> u64 {
        self.first.end.min(self.second.end) - self.second.start
    }
}

impl fmt::Display for Overlap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "key {}: task {} [{}, {}] and task {} [{}, {}] overlap by {:.3} ms",
            self.first.key,
            self.first.owner,
            self.first.start,
            self.first.end,
            self.second.owner,
            self.second.start,
            self.second.end,
            self.nanos() as f64 / 1e6
        )
    }
}

/// Every pair of intervals of one key, of different owners, that overlap (touching ends
/// count: both believed at that instant). `O(n log n)`: per key, sorted by start, each
/// interval against the one that reaches furthest among those before it of another owner.
pub(crate) fn overlaps(intervals: &[Interval]) -> Vec<Overlap> {
    let mut sorted = intervals.to_vec();
    sorted.sort_by_key(|i| (i.key, i.start, i.end));
    let mut found = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let key = sorted[i].key;
        // The interval reaching furthest so far, and the furthest of another owner than it.
        let mut reach: Option<Interval> = None;
        let mut other: Option<Interval> = None;
        while i < sorted.len() && sorted[i].key == key {
            let next = sorted[i];
            for before in [reach, other].into_iter().flatten() {
                if before.owner != next.owner && before.end >= next.start {
                    found.push(Overlap { first: before, second: next });
                    break;
                }
            }
            match reach {
                Some(r) if r.owner == next.owner => {
                    if next.end > r.end {
                        reach = Some(next);
                    }
                }
                Some(r) => {
                    if next.end > r.end {
                        other = Some(r);
                        reach = Some(next);
                    } else if other.is_none_or(|o| next.end > o.end) {
                        other = Some(next);
                    }
                }
                None => reach = Some(next),
            }
            i += 1;
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iv(key: u32, owner: u32, start: u64, end: u64) -> Interval {
        Interval { key, owner, start, end }
    }

    #[test]
    fn lines_round_trip_and_torn_lines_are_skipped() {
        let i = iv(3, 7, 100, 250);
        assert_eq!(Interval::parse(&i.line()), Some(i));
        assert_eq!(Interval::parse("3 7 100"), None);
        assert_eq!(Interval::parse("3 7 300 100"), None);
        assert_eq!(Interval::parse("3 7 100 250 9"), None);
    }

    #[test]
    fn only_different_owners_of_one_key_at_once_overlap() {
        let clean = [iv(0, 1, 0, 10), iv(0, 2, 11, 20), iv(0, 1, 21, 30), iv(1, 2, 5, 25), iv(0, 1, 22, 29)];
        assert!(overlaps(&clean).is_empty(), "{:?}", overlaps(&clean));
        let touching = [iv(0, 1, 0, 10), iv(0, 2, 10, 20)];
        assert_eq!(overlaps(&touching).len(), 1);
        // A long interval of task 1 hides behind a short one of task 2 that ends first.
        let hidden = [iv(0, 1, 0, 100), iv(0, 1, 5, 6), iv(0, 2, 50, 60)];
        assert_eq!(overlaps(&hidden), [Overlap { first: iv(0, 1, 0, 100), second: iv(0, 2, 50, 60) }]);
        let three = [iv(0, 1, 0, 100), iv(0, 2, 101, 300), iv(0, 3, 200, 210)];
        assert_eq!(overlaps(&three).len(), 1);
        assert_eq!(overlaps(&three)[0].nanos(), 10);
    }

    #[test]
    fn the_sweep_finds_what_comparing_every_pair_finds() {
        // Against the quadratic definition, on seeded random intervals.
        let mut rng = steady_subset::prng::SplitMix64::new(11);
        for _ in 0..200 {
            let n = 1 + rng.below(12) as usize;
            let all: Vec<Interval> = (0..n)
                .map(|_| {
                    let start = rng.below(100);
                    iv(rng.below(2) as u32, rng.below(3) as u32, start, start + rng.below(30))
                })
                .collect();
            let any_pair = all.iter().enumerate().any(|(a, x)| {
                all.iter()
                    .skip(a + 1)
                    .any(|y| x.key == y.key && x.owner != y.owner && x.start <= y.end && y.start <= x.end)
            });
            assert_eq!(!overlaps(&all).is_empty(), any_pair, "{all:?}");
        }
    }
}
