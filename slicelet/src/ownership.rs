//! Ownership for the application: which key ranges this task holds, since which
//! generation it has held each of them without a break, and the changes (acquired,
//! released) between any two generations, delivered to the application in order and
//! never lost.
//!
//! Each installed generation gets an [`Ownership`], made from the previous one and the new
//! assignment off the request path (`O(slices)`): the held slices cut into pieces, each
//! with the first generation since which every generation installed held it. A skipped
//! generation breaks continuity (what happened in it is unknown): after a jump from
//! generation 5 to 8, everything held is held "since 8". That errs the safe way for a
//! cache: an entry may be dropped for nothing, never kept when another owner could have
//! written the key meanwhile.

use std::sync::Arc;

use steady_slice::{Assignment, KeyRange, SliceKey};
use tokio::sync::watch;
use tokio::time::Instant;

/// The end of the key space as a half-open bound.
const END: u128 = 1 << 64;

/// The most released ranges remembered for the old owner's grace period; the oldest go
/// first (a release older than the grace is of no use anyway).
pub const MAX_RECENT_RELEASES: usize = 1024;

/// A half-open range of keys `[start, end)`, `end` up to `2^64`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Span {
    start: u128,
    end: u128,
}

impl Span {
    fn of(range: &KeyRange) -> Self {
        Self { start: u128::from(range.start().0), end: range.end().map_or(END, |e| u128::from(e.0)) }
    }

    fn range(self) -> KeyRange {
        let end = (self.end < END).then_some(SliceKey(self.end as u64));
        KeyRange::new(SliceKey(self.start as u64), end)
    }
}

/// One piece of the held key space and the generation since which it has been held
/// without a break.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Piece {
    span: Span,
    since: u64,
}

/// A key range this task is warming up to serve (the first step of a handover): no
/// client sends it these keys yet; load their state now, from `owners` (the replicas
/// serving the range meanwhile) or from storage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warming {
    /// The keys.
    pub range: KeyRange,
    /// The tasks serving them until the switch.
    pub owners: Vec<u32>,
}

/// What one task held in one generation: the held key ranges, ascending, each with the
/// generation since which it has been held continuously; the ranges it warms; and the
/// ranges it released lately, with when (for the old owner's grace period).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ownership {
    generation: u64,
    pieces: Vec<Piece>,
    warming: Vec<Warming>,
    /// Released ranges, oldest first, at most [`MAX_RECENT_RELEASES`].
    released: Vec<(Span, Instant)>,
}

impl Ownership {
    /// Task `task`'s ownership under `assignment`, following `previous` (the ownership of
    /// the generation installed before it, if any).
    pub(crate) fn next(previous: Option<&Ownership>, assignment: &Assignment, task: u32) -> Self {
        Self::next_at(previous, assignment, task, Instant::now())
    }

    /// As [`Ownership::next`], installed at `now`.
    pub(crate) fn next_at(
        previous: Option<&Ownership>,
        assignment: &Assignment,
        task: u32,
        now: Instant,
    ) -> Self {
        let generation = assignment.generation();
        // Continuity carries over only from the generation just before.
        let carried: &[Piece] = match previous {
            Some(p) if p.generation.checked_add(1) == Some(generation) => &p.pieces,
            _ => &[],
        };
        let held: Vec<Span> = (0..assignment.slices().len())
            .filter(|&i| assignment.slices()[i].replicas().contains(&task))
            .map(|i| Span::of(&assignment.range(i)))
            .collect();
        let mut warming: Vec<Warming> = Vec::new();
        for (range, owners) in assignment.warming_of(task) {
            match warming.last_mut() {
                Some(last) if last.owners == owners && last.range.end() == Some(range.start()) => {
                    last.range = KeyRange::new(last.range.start(), range.end());
                }
                _ => warming.push(Warming { range, owners: owners.to_vec() }),
            }
        }
        Self::following(previous, carried, generation, &held, warming, now)
    }

    /// What an exclusive-mode Slicelet believes: exactly the ranges `held` (ascending,
    /// disjoint), labelled `generation`, each piece held since `previous` said where the
    /// Slicelet believed it without a break until now (the caller vouches for that:
    /// belief only narrows and widens through holds), else since `generation`.
    pub(crate) fn believed(
        previous: Option<&Ownership>,
        generation: u64,
        held: &[KeyRange],
        now: Instant,
    ) -> Self {
        let carried: &[Piece] = previous.map_or(&[], |p| &p.pieces);
        let held: Vec<Span> = held.iter().map(Span::of).collect();
        Self::following(previous, carried, generation, &held, Vec::new(), now)
    }

    /// The ownership of `held` after `previous`, carrying the `since` of `carried` pieces.
    fn following(
        previous: Option<&Ownership>,
        carried: &[Piece],
        generation: u64,
        held: &[Span],
        warming: Vec<Warming>,
        now: Instant,
    ) -> Self {
        let mut pieces = Vec::with_capacity(held.len());
        let mut at = 0; // the first carried piece that may overlap what comes next
        for span in held {
            let mut cursor = span.start;
            while at < carried.len() && carried[at].span.end <= span.start {
                at += 1;
            }
            let mut i = at;
            while i < carried.len() && carried[i].span.start < span.end {
                let old = carried[i];
                let (start, end) = (old.span.start.max(span.start), old.span.end.min(span.end));
                if cursor < start {
                    push(&mut pieces, Span { start: cursor, end: start }, generation);
                }
                push(&mut pieces, Span { start, end }, old.since);
                cursor = end;
                i += 1;
            }
            if cursor < span.end {
                push(&mut pieces, Span { start: cursor, end: span.end }, generation);
            }
        }
        // Old boundaries inside held slices could accumulate over generations: past twice
        // the held slices, each held slice becomes one piece with its latest `since`
        // (later is the safe side).
        if pieces.len() > 2 * held.len() + 16 {
            pieces = coarsen(&pieces, held);
        }
        let mut released = previous.map(|p| p.released.clone()).unwrap_or_default();
        if let Some(p) = previous {
            let gone = subtract(&merged(p.pieces.iter().map(|p| p.span)), &merged(held.iter().copied()));
            released.extend(gone.into_iter().map(|span| (span, now)));
        }
        if released.len() > MAX_RECENT_RELEASES {
            released.drain(..released.len() - MAX_RECENT_RELEASES);
        }
        Self { generation, pieces, warming, released }
    }

    /// The key ranges this task warms in this generation (ascending; adjacent ranges with
    /// the same owners merged).
    pub fn warming(&self) -> &[Warming] {
        &self.warming
    }

    /// When this task last released `key`, if it did lately and does not hold it now
    /// (the most recent [`MAX_RECENT_RELEASES`] releases are remembered).
    pub fn released_at(&self, key: SliceKey) -> Option<Instant> {
        if self.holds(key) {
            return None;
        }
        let k = u128::from(key.0);
        self.released.iter().rev().find(|(span, _)| span.start <= k && k < span.end).map(|(_, at)| *at)
    }

    /// The generation this is the ownership of.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether `key` is held.
    pub fn holds(&self, key: SliceKey) -> bool {
        self.piece(key).is_some()
    }

    /// The generation since which `key` has been held in every generation installed, or
    /// `None` if it is not held now.
    pub fn held_since(&self, key: SliceKey) -> Option<u64> {
        self.piece(key).map(|p| p.since)
    }

    /// Whether this task holds no key at all.
    pub fn holds_nothing(&self) -> bool {
        self.pieces.is_empty()
    }

    /// The held key ranges, ascending (adjacent ranges held since different generations
    /// are listed apart).
    pub fn held(&self) -> impl Iterator<Item = KeyRange> + '_ {
        self.pieces.iter().map(|p| p.span.range())
    }

    /// The held key ranges, ascending, touching ones merged whatever their `since`.
    #[cfg_attr(not(feature = "exclusive"), allow(dead_code))]
    pub(crate) fn held_merged(&self) -> Vec<KeyRange> {
        merged(self.pieces.iter().map(|p| p.span)).into_iter().map(Span::range).collect()
    }

    /// The held key ranges, ascending, each with the generation since which it has been
    /// held without a break.
    pub fn held_with_since(&self) -> impl Iterator<Item = (KeyRange, u64)> + '_ {
        self.pieces.iter().map(|p| (p.span.range(), p.since))
    }

    fn piece(&self, key: SliceKey) -> Option<&Piece> {
        let k = u128::from(key.0);
        let i = self.pieces.partition_point(|p| p.span.end <= k);
        self.pieces.get(i).filter(|p| p.span.start <= k)
    }

    /// What changed from `before` (`None`: nothing held yet) to `self`: ranges acquired
    /// (not held continuously since `before`'s generation: new, or lost and held again)
    /// and ranges released (held at `before` and not held continuously since).
    pub(crate) fn changes_since(&self, before: Option<&Ownership>) -> SliceChange {
        let from = before.map(|b| b.generation);
        let held_throughout = |p: &&Piece| from.is_some_and(|g| p.since <= g);
        let acquired = merged(self.pieces.iter().filter(|p| !held_throughout(p)).map(|p| p.span));
        let kept = merged(self.pieces.iter().filter(held_throughout).map(|p| p.span));
        let released = match before {
            None => Vec::new(),
            Some(b) => subtract(&merged(b.pieces.iter().map(|p| p.span)), &kept),
        };
        SliceChange {
            from,
            to: self.generation,
            acquired: acquired.into_iter().map(Span::range).collect(),
            released: released.into_iter().map(Span::range).collect(),
            warming: self.warming.clone(),
        }
    }
}

/// Appends a piece, merging it into the last one when they touch and agree.
fn push(pieces: &mut Vec<Piece>, span: Span, since: u64) {
    match pieces.last_mut() {
        Some(last) if last.span.end == span.start && last.since == since => last.span.end = span.end,
        _ => pieces.push(Piece { span, since }),
    }
}

/// One piece per held slice, with the latest `since` of the pieces inside it.
fn coarsen(pieces: &[Piece], held: &[Span]) -> Vec<Piece> {
    let mut out: Vec<Piece> = Vec::with_capacity(held.len());
    let mut i = 0;
    for span in held {
        let mut since = 0;
        while i < pieces.len() && pieces[i].span.start < span.end {
            since = since.max(pieces[i].since);
            i += 1;
        }
        push(&mut out, *span, since);
    }
    out
}

/// Sorted, non-overlapping spans with touching ones joined.
fn merged(spans: impl Iterator<Item = Span>) -> Vec<Span> {
    let mut out: Vec<Span> = Vec::new();
    for s in spans {
        match out.last_mut() {
            Some(last) if last.end == s.start => last.end = s.end,
            _ => out.push(s),
        }
    }
    out
}

/// `a` minus `b`, both sorted and non-overlapping.
fn subtract(a: &[Span], b: &[Span]) -> Vec<Span> {
    let mut out = Vec::new();
    let mut j = 0;
    for &s in a {
        let mut cursor = s.start;
        while j < b.len() && b[j].end <= cursor {
            j += 1;
        }
        let mut k = j;
        while k < b.len() && b[k].start < s.end {
            if b[k].start > cursor {
                out.push(Span { start: cursor, end: b[k].start });
            }
            cursor = cursor.max(b[k].end);
            k += 1;
        }
        if cursor < s.end {
            out.push(Span { start: cursor, end: s.end });
        }
    }
    out
}

/// What changed for one task between two generations it installed: the key ranges it
/// acquired (to load or warm) and released (to flush), ascending and merged.
///
/// A range lost and held again between `from` and `to` is in both: released (what was
/// cached for it may be stale) and acquired.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceChange {
    /// The last generation the stream looked at before this change (`None`: the first
    /// change it returns). Generations in which nothing changed are passed over, so
    /// the holdings at `from` are those the previous change led to.
    pub from: Option<u64>,
    /// The generation in force now.
    pub to: u64,
    /// Ranges held at `to` and not held continuously since `from`.
    pub acquired: Vec<KeyRange>,
    /// Ranges held at `from` and not held continuously since.
    pub released: Vec<KeyRange>,
    /// Every range warming at `to` (not only the new ones): load them before the switch
    /// makes them acquired. A change is returned when this list differs from the last
    /// one returned, even with nothing acquired or released.
    pub warming: Vec<Warming>,
}

impl SliceChange {
    /// Whether nothing was acquired or released (warming aside).
    pub fn is_empty(&self) -> bool {
        self.acquired.is_empty() && self.released.is_empty()
    }
}

/// The slice changes of one [`Slicelet`](crate::Slicelet), for the application: each
/// [`SliceChanges::next`] returns what changed since the last one returned.
///
/// Changes are never lost or reordered, and memory does not grow with the generations
/// the application has not read yet: generations installed while it was busy are folded
/// into one change from the last generation it saw to the newest (a range lost and held
/// again meanwhile shows as released and acquired). Made by
/// [`Slicelet::slice_changes`](crate::Slicelet::slice_changes).
#[derive(Debug)]
pub struct SliceChanges {
    updates: watch::Receiver<Option<Arc<Ownership>>>,
    seen: Option<Arc<Ownership>>,
}

impl SliceChanges {
    pub(crate) fn new(updates: watch::Receiver<Option<Arc<Ownership>>>) -> Self {
        let mut updates = updates;
        // The ownership in force now, if any, is the first change.
        updates.mark_changed();
        Self { updates, seen: None }
    }

    /// Waits for the next generation whose holdings differ from the last ones returned,
    /// and returns the change; `None` once the Slicelet (every clone) is dropped.
    pub async fn next(&mut self) -> Option<SliceChange> {
        loop {
            self.updates.changed().await.ok()?;
            let Some(now) = self.updates.borrow_and_update().clone() else { continue };
            let change = now.changes_since(self.seen.as_deref());
            let warming_changed =
                self.seen.as_ref().map_or(!now.warming.is_empty(), |s| s.warming != now.warming);
            self.seen = Some(now);
            if !change.is_empty() || warming_changed {
                return Some(change);
            }
        }
    }

    /// The ownership the last change returned led to (`None` before the first).
    pub fn seen(&self) -> Option<&Ownership> {
        self.seen.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use steady_slice::Slice;

    /// An assignment of slices starting at `starts` (the first must be 0), owned by `owners`.
    fn assignment(generation: u64, starts: &[u64], owners: &[u32]) -> Assignment {
        let slices = starts.iter().zip(owners).map(|(&s, &o)| Slice::new(SliceKey(s), vec![o])).collect();
        Assignment::new(generation, slices).unwrap()
    }

    fn spans(ranges: &[KeyRange]) -> Vec<(u64, Option<u64>)> {
        ranges.iter().map(|r| (r.start().0, r.end().map(|e| e.0))).collect()
    }

    #[test]
    fn continuity_carries_over_consecutive_generations_only() {
        let g1 = Ownership::next(None, &assignment(1, &[0, 100, 200], &[0, 1, 0]), 0);
        assert_eq!(g1.held_since(SliceKey(50)), Some(1));
        assert_eq!(g1.held_since(SliceKey(150)), None);
        // Generation 2 keeps [0, 100), gains [100, 150), keeps [200, ..).
        let g2 = Ownership::next(Some(&g1), &assignment(2, &[0, 150, 200], &[0, 1, 0]), 0);
        assert_eq!(g2.held_since(SliceKey(99)), Some(1));
        assert_eq!(g2.held_since(SliceKey(100)), Some(2));
        assert_eq!(g2.held_since(SliceKey(u64::MAX)), Some(1));
        // Generation 3 loses [0, 50); generation 4 takes it back: held since 4.
        let g3 = Ownership::next(Some(&g2), &assignment(3, &[0, 50, 150, 200], &[1, 0, 1, 0]), 0);
        let g4 = Ownership::next(Some(&g3), &assignment(4, &[0, 150, 200], &[0, 1, 0]), 0);
        assert_eq!(g4.held_since(SliceKey(10)), Some(4));
        assert_eq!(g4.held_since(SliceKey(60)), Some(1));
        // A skipped generation breaks continuity.
        let g6 = Ownership::next(Some(&g4), &assignment(6, &[0, 150, 200], &[0, 1, 0]), 0);
        assert_eq!(g6.held_since(SliceKey(60)), Some(6));
    }

    #[test]
    fn changes_name_what_was_acquired_and_released_and_what_was_lost_and_taken_back() {
        let g1 = Ownership::next(None, &assignment(1, &[0, 100, 200], &[0, 1, 0]), 0);
        let first = g1.changes_since(None);
        assert_eq!(first.from, None);
        assert_eq!(spans(&first.acquired), [(0, Some(100)), (200, None)]);
        assert!(first.released.is_empty());
        let g2 = Ownership::next(Some(&g1), &assignment(2, &[0, 50, 200], &[1, 0, 1]), 0);
        let g3 = Ownership::next(Some(&g2), &assignment(3, &[0, 200], &[0, 1]), 0);
        // Seen from 1 straight to 3: [0, 50) was lost in 2 and is back; [200, ..) is gone.
        let c = g3.changes_since(Some(&g1));
        assert_eq!((c.from, c.to), (Some(1), 3));
        assert_eq!(spans(&c.acquired), [(0, Some(50)), (100, Some(200))]);
        assert_eq!(spans(&c.released), [(0, Some(50)), (200, None)]);
    }

    #[test]
    fn warming_ranges_are_announced_and_releases_remembered_with_their_time() {
        let at = Instant::now();
        let g1 = Ownership::next_at(None, &assignment(1, &[0, 100, 200], &[0, 1, 0]), 0, at);
        let step = Assignment::new(
            2,
            vec![
                Slice::new(SliceKey(0), vec![0]),
                Slice::new(SliceKey(100), vec![1]).with_warming([0]),
                Slice::new(SliceKey(200), vec![0]).with_warming([2]),
            ],
        )
        .unwrap();
        let g2 = Ownership::next_at(Some(&g1), &step, 0, at);
        assert_eq!(g2.warming(), [Warming { range: step.range(1), owners: vec![1] }]);
        let c = g2.changes_since(Some(&g1));
        assert!(c.is_empty(), "warming is neither acquired nor released");
        assert_eq!(c.warming, g2.warming());
        // The switch: [100, 200) acquired, [200, ..) released at `later`.
        let later = at + std::time::Duration::from_secs(5);
        let g3 = Ownership::next_at(Some(&g2), &assignment(3, &[0, 200], &[0, 2]), 0, later);
        assert!(g3.warming().is_empty());
        assert_eq!(g3.released_at(SliceKey(300)), Some(later));
        assert_eq!(g3.released_at(SliceKey(150)), None, "held");
        assert_eq!(g1.released_at(SliceKey(150)), None, "never held");
    }

    #[test]
    fn pieces_stay_bounded_over_many_generations() {
        // A slice held throughout while its neighbours' boundaries move every generation.
        let mut own = Ownership::next(None, &assignment(1, &[0, 1000], &[0, 1]), 0);
        for g in 2..500u64 {
            let cut = 1 + (g * 37) % 998;
            let a = if g % 2 == 0 {
                assignment(g, &[0, cut, 1000], &[0, 0, 1])
            } else {
                assignment(g, &[0, 1000], &[0, 1])
            };
            own = Ownership::next(Some(&own), &a, 0);
            assert!(own.pieces.len() <= 2 * 2 + 16, "generation {g}: {} pieces", own.pieces.len());
            assert_eq!(own.held_since(SliceKey(0)), Some(1));
        }
    }
}
