//! Exclusive ownership's records (see `docs/exclusive.md`): a job's [`Consistency`] mode,
//! the [`Guard`] the Assigner keeps, and the [`Hold`] each Slicelet keeps on its own lease.
//!
//! # Frozen contract
//!
//! Both records are stored in etcd as ASCII, `v1 ` and then the state (`v1 granted 17`,
//! `v1 recalling 17 18`, `v1 full 17`, `v1 bridge 17 18`), so every version of every party
//! reads them, and an operator can with `etcdctl`. Golden vectors in
//! `tests/golden/guard.txt` pin the format; a change to it is a new version prefix, never
//! a new meaning for `v1`.

use std::fmt;
use std::str::FromStr;

use crate::{Assignment, KeyRange, SliceKey};

/// The longest record [`Guard::decode`] and [`Hold::decode`] read: `v1 recalling` and two
/// 20-digit generations fit in 54 bytes. Longer input is refused unread.
pub const MAX_RECORD_BYTES: usize = 64;

/// A job's consistency mode: what its Slicelets may believe about the keys they hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Consistency {
    /// Affinity (the default): an assignment reaches the tasks a little apart, so for a
    /// moment after a move two tasks may both serve a key (a handover relies on it).
    #[default]
    Eventual,
    /// Exclusive ownership (Slicer's consistent assignment): at most one replica per
    /// slice, and no task ever believes it holds a key when the authoritative assignment
    /// does not agree. Needs etcd (leases): see `docs/exclusive.md`.
    Exclusive,
}

impl Consistency {
    /// `"eventual"` or `"exclusive"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Eventual => "eventual",
            Self::Exclusive => "exclusive",
        }
    }
}

impl fmt::Display for Consistency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Consistency {
    type Err = RecordError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "eventual" => Ok(Self::Eventual),
            "exclusive" => Ok(Self::Exclusive),
            _ => Err(RecordError::Malformed("a consistency mode is `eventual` or `exclusive`")),
        }
    }
}

/// The guard of an exclusive job: which assignment is in force, written only by the
/// job's Assigner (Slicer's guard lease, on etcd).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Guard {
    /// Assignment `G` is in force: Slicelets may hold [`Hold::Full`] of it.
    Granted(u64),
    /// The Assigner replaces assignment `from` by `to` (already stored; `from` is 0 when
    /// the job had no exclusive assignment before). Nobody may start holding
    /// [`Hold::Full`] of `from`; holders give it up, keeping with [`Hold::Bridge`] what
    /// both assignments give them.
    Recalling {
        /// The generation in force until now (0: none).
        from: u64,
        /// The generation that replaces it.
        to: u64,
    },
}

/// What one Slicelet holds, on its own etcd lease: the keys it may believe it owns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Hold {
    /// Every key assignment `G` gives the task.
    Full(u64),
    /// The keys that assignments `from` and `to` both give the task (the bridge).
    Bridge {
        /// The generation being replaced.
        from: u64,
        /// The generation replacing it.
        to: u64,
    },
}

impl Guard {
    /// Whether `hold` may exist while this guard is in etcd (the protocol's second
    /// invariant): under `granted G`, `full G` and `bridge _ G`; under `recalling G1 G2`,
    /// `full G1`, `bridge _ G1` and `bridge G1 G2`.
    pub fn allows(self, hold: Hold) -> bool {
        match (self, hold) {
            (Guard::Granted(g), Hold::Full(h)) => g == h,
            (Guard::Granted(g), Hold::Bridge { to, .. }) => g == to,
            (Guard::Recalling { from, .. }, Hold::Full(h)) => from == h,
            (Guard::Recalling { from, to }, Hold::Bridge { from: f, to: t }) => {
                t == from || (f, t) == (from, to)
            }
        }
    }

    /// Whether, under this guard, `hold` lets the Assigner finish a recall: only
    /// `bridge G1 G2` under `recalling G1 G2` does (every other hold must vanish first).
    pub fn recall_done_with(self, hold: Hold) -> bool {
        matches!(self, Guard::Recalling { from, to } if hold == Hold::Bridge { from, to })
    }

    /// The hold a Slicelet writes under this guard, if it has what it needs: under
    /// `granted G`, `full G`; under `recalling G1 G2`, `bridge G1 G2` when `bridge` is on
    /// and `G1` is a real generation; else none.
    pub fn hold_to_take(self, bridge: bool) -> Option<Hold> {
        match self {
            Guard::Granted(g) => Some(Hold::Full(g)),
            Guard::Recalling { from, to } if bridge && from > 0 => Some(Hold::Bridge { from, to }),
            Guard::Recalling { .. } => None,
        }
    }

    /// The generation whose assignment a holder of this guard's holds must know: the
    /// granted one, or the one recalled to.
    pub fn latest(self) -> u64 {
        match self {
            Guard::Granted(g) => g,
            Guard::Recalling { to, .. } => to,
        }
    }

    /// The stored value (see the module's frozen contract).
    pub fn encode(self) -> String {
        match self {
            Guard::Granted(g) => format!("v1 granted {g}"),
            Guard::Recalling { from, to } => format!("v1 recalling {from} {to}"),
        }
    }

    /// Reads a stored value.
    ///
    /// # Errors
    ///
    /// [`RecordError`] naming what is wrong; nothing is read past [`MAX_RECORD_BYTES`].
    pub fn decode(bytes: &[u8]) -> Result<Self, RecordError> {
        let (word, numbers) = fields(bytes)?;
        match (word, numbers.as_slice()) {
            ("granted", &[g]) if g > 0 => Ok(Guard::Granted(g)),
            ("recalling", &[from, to]) if from < to => Ok(Guard::Recalling { from, to }),
            ("granted" | "recalling", _) => {
                Err(RecordError::Malformed("a guard is `granted G` (G > 0) or `recalling G1 G2` (G1 < G2)"))
            }
            _ => Err(RecordError::Malformed("a guard is `granted` or `recalling`")),
        }
    }
}

impl Hold {
    /// The generation of the assignment the hold is read against: `G` of `full G`, the
    /// newer `G2` of `bridge G1 G2`.
    pub fn latest(self) -> u64 {
        match self {
            Hold::Full(g) => g,
            Hold::Bridge { to, .. } => to,
        }
    }

    /// The key ranges the hold gives `task`, from the assignments it names (`assignment`
    /// looks one up by generation; `None` when it is not known, and then nothing is
    /// given). Ascending, touching ranges merged.
    pub fn ranges<'a>(self, task: u32, assignment: impl Fn(u64) -> Option<&'a Assignment>) -> Vec<KeyRange> {
        match self {
            Hold::Full(g) => assignment(g).map(|a| merged(a.slices_of(task))).unwrap_or_default(),
            Hold::Bridge { from, to } => match (assignment(from), assignment(to)) {
                (Some(a), Some(b)) => held_by_both(a, b, task),
                _ => Vec::new(),
            },
        }
    }

    /// The stored value (see the module's frozen contract).
    pub fn encode(self) -> String {
        match self {
            Hold::Full(g) => format!("v1 full {g}"),
            Hold::Bridge { from, to } => format!("v1 bridge {from} {to}"),
        }
    }

    /// Reads a stored value.
    ///
    /// # Errors
    ///
    /// [`RecordError`] naming what is wrong; nothing is read past [`MAX_RECORD_BYTES`].
    pub fn decode(bytes: &[u8]) -> Result<Self, RecordError> {
        let (word, numbers) = fields(bytes)?;
        match (word, numbers.as_slice()) {
            ("full", &[g]) if g > 0 => Ok(Hold::Full(g)),
            ("bridge", &[from, to]) if 0 < from && from < to => Ok(Hold::Bridge { from, to }),
            ("full" | "bridge", _) => {
                Err(RecordError::Malformed("a hold is `full G` (G > 0) or `bridge G1 G2` (0 < G1 < G2)"))
            }
            _ => Err(RecordError::Malformed("a hold is `full` or `bridge`")),
        }
    }
}

impl fmt::Display for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.encode()[3..])
    }
}

impl fmt::Display for Hold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.encode()[3..])
    }
}

/// A stored guard or hold that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordError {
    /// Longer than [`MAX_RECORD_BYTES`]: refused unread.
    TooLong(usize),
    /// Not `v1`: written by a newer version of steady.
    UnknownVersion,
    /// Not a record of the kind asked for; says what one looks like.
    Malformed(&'static str),
}

impl fmt::Display for RecordError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooLong(n) => write!(f, "record of {n} bytes (at most {MAX_RECORD_BYTES})"),
            Self::UnknownVersion => f.write_str("record of an unknown version (this one reads `v1`)"),
            Self::Malformed(what) => f.write_str(what),
        }
    }
}

impl std::error::Error for RecordError {}

/// The word and the numbers of a `v1` record.
fn fields(bytes: &[u8]) -> Result<(&str, Vec<u64>), RecordError> {
    if bytes.len() > MAX_RECORD_BYTES {
        return Err(RecordError::TooLong(bytes.len()));
    }
    let text = std::str::from_utf8(bytes).map_err(|_| RecordError::Malformed("a record is ASCII"))?;
    let mut parts = text.split(' ');
    if parts.next() != Some("v1") {
        return Err(RecordError::UnknownVersion);
    }
    let word = parts.next().unwrap_or("");
    let numbers = parts
        .map(|n| {
            // Canonical decimal only: no sign, no leading zero, so one value has one form.
            let canonical =
                !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) && (n == "0" || !n.starts_with('0'));
            canonical.then(|| n.parse::<u64>().ok()).flatten()
        })
        .collect::<Option<Vec<u64>>>()
        .ok_or(RecordError::Malformed("generations are decimal numbers, one space apart"))?;
    Ok((word, numbers))
}

/// The etcd key of `job`'s guard under the store's `prefix` (`/steady/jobs/` by default):
/// `{prefix}{job}/exclusive/guard`. A contract, as the records are.
pub fn guard_key(prefix: &str, job: &str) -> String {
    format!("{prefix}{job}/exclusive/guard")
}

/// The prefix under which `job`'s Slicelets keep their holds:
/// `{prefix}{job}/exclusive/holds/`.
pub fn holds_prefix(prefix: &str, job: &str) -> String {
    format!("{prefix}{job}/exclusive/holds/")
}

/// The key of the hold task `task` keeps on etcd lease `lease` (decimal):
/// `{prefix}{job}/exclusive/holds/{task}/{lease}`. One key per lease, so that two
/// processes that both claim a task index (a mistake) cannot overwrite each other's hold.
pub fn hold_key(prefix: &str, job: &str, task: u32, lease: i64) -> String {
    format!("{prefix}{job}/exclusive/holds/{task}/{lease}")
}

/// Ranges sorted and disjoint, with touching ones joined.
fn merged(ranges: impl Iterator<Item = KeyRange>) -> Vec<KeyRange> {
    let mut out: Vec<KeyRange> = Vec::new();
    for r in ranges {
        match out.last_mut() {
            Some(last) if last.end() == Some(r.start()) => *last = KeyRange::new(last.start(), r.end()),
            _ => out.push(r),
        }
    }
    out
}

/// The keys both `a` and `b` give `task` (what a bridge keeps): ascending, merged.
/// `O(slices of a + slices of b)`.
pub fn held_by_both(a: &Assignment, b: &Assignment, task: u32) -> Vec<KeyRange> {
    let (mut i, mut j) = (0, 0);
    let mut out = Vec::new();
    let end = |r: KeyRange| r.end().map_or(1u128 << 64, |e| u128::from(e.0));
    while i < a.slices().len() && j < b.slices().len() {
        let (ra, rb) = (a.range(i), b.range(j));
        let start = ra.start().max(rb.start());
        let stop = end(ra).min(end(rb));
        if u128::from(start.0) < stop
            && a.slices()[i].replicas().contains(&task)
            && b.slices()[j].replicas().contains(&task)
        {
            let stop = (stop < 1 << 64).then_some(SliceKey(stop as u64));
            out.push(KeyRange::new(start, stop));
        }
        if end(ra) <= end(rb) {
            i += 1;
        } else {
            j += 1;
        }
    }
    merged(out.into_iter())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Slice;

    fn assignment(generation: u64, cuts: &[(u64, u32)]) -> Assignment {
        Assignment::new(generation, cuts.iter().map(|&(s, t)| Slice::new(SliceKey(s), vec![t])).collect())
            .unwrap()
    }

    #[test]
    fn records_round_trip_and_refuse_what_is_not_canonical() {
        for g in [
            Guard::Granted(1),
            Guard::Recalling { from: 0, to: 1 },
            Guard::Recalling { from: 7, to: u64::MAX },
        ] {
            assert_eq!(Guard::decode(g.encode().as_bytes()), Ok(g));
        }
        for h in [Hold::Full(3), Hold::Bridge { from: 3, to: 4 }] {
            assert_eq!(Hold::decode(h.encode().as_bytes()), Ok(h));
        }
        for bad in [
            "v1 granted 0",
            "v1 granted 01",
            "v1 granted +1",
            "v1 granted 1 ",
            "v1  granted 1",
            "v1 recalling 5 5",
            "v1 recalling 6 5",
            "v1 granted",
            "v1 full 1",
            "v1 granted 18446744073709551616",
        ] {
            assert!(Guard::decode(bad.as_bytes()).is_err(), "{bad:?} read as a guard");
        }
        assert_eq!(Guard::decode(b"v2 granted 1"), Err(RecordError::UnknownVersion));
        assert_eq!(Hold::decode(&[b'1'; 65]), Err(RecordError::TooLong(65)));
        assert!(Hold::decode(b"v1 bridge 0 1").is_err(), "a bridge needs a real generation to keep");
        assert!(Hold::decode(b"v1 granted 1").is_err());
    }

    #[test]
    fn a_guard_allows_exactly_the_holds_the_invariant_names() {
        let granted = Guard::Granted(5);
        assert!(granted.allows(Hold::Full(5)));
        assert!(granted.allows(Hold::Bridge { from: 4, to: 5 }));
        assert!(!granted.allows(Hold::Full(4)));
        assert!(!granted.allows(Hold::Bridge { from: 5, to: 6 }));
        let recalling = Guard::Recalling { from: 5, to: 6 };
        assert!(recalling.allows(Hold::Full(5)));
        assert!(recalling.allows(Hold::Bridge { from: 4, to: 5 }));
        assert!(recalling.allows(Hold::Bridge { from: 5, to: 6 }));
        assert!(!recalling.allows(Hold::Full(6)), "6 is not granted yet");
        assert!(!recalling.allows(Hold::Full(4)));
        assert!(recalling.recall_done_with(Hold::Bridge { from: 5, to: 6 }));
        assert!(!recalling.recall_done_with(Hold::Full(5)));
        assert!(!recalling.recall_done_with(Hold::Bridge { from: 4, to: 5 }));
        assert_eq!(recalling.hold_to_take(true), Some(Hold::Bridge { from: 5, to: 6 }));
        assert_eq!(recalling.hold_to_take(false), None);
        assert_eq!(Guard::Recalling { from: 0, to: 1 }.hold_to_take(true), None);
    }

    #[test]
    fn a_bridge_keeps_what_both_assignments_give_the_task() {
        // Task 1 holds [100, 300) in 7 and [200, 400) in 8: the bridge keeps [200, 300).
        let a = assignment(7, &[(0, 0), (100, 1), (300, 2)]);
        let b = assignment(8, &[(0, 0), (200, 1), (400, 2)]);
        let spans =
            |v: Vec<KeyRange>| v.iter().map(|r| (r.start().0, r.end().map(|e| e.0))).collect::<Vec<_>>();
        assert_eq!(spans(held_by_both(&a, &b, 1)), [(200, Some(300))]);
        assert_eq!(spans(held_by_both(&a, &b, 0)), [(0, Some(100))]);
        assert_eq!(spans(held_by_both(&a, &b, 2)), [(400, None)]);
        let by = |g| [&a, &b].into_iter().find(|x| x.generation() == g);
        assert_eq!(spans(Hold::Bridge { from: 7, to: 8 }.ranges(1, by)), [(200, Some(300))]);
        assert_eq!(spans(Hold::Full(8).ranges(2, by)), [(400, None)]);
        assert!(Hold::Bridge { from: 6, to: 8 }.ranges(1, by).is_empty(), "6 is unknown: nothing");
    }
}
