//! Exclusive ownership on the backend's side (see `docs/exclusive.md`): what this task
//! believes it owns, until when it may believe it, and the [`KeyHandle`]s an application
//! takes to act on a key only while it owns it.
//!
//! The belief is changed only by the lease driver ([`LeaseHolder`], feature `exclusive`),
//! in the protocol's order: narrowed before the hold that allows less is written, widened
//! after the hold that allows more is written. It always ends at the lease's deadline,
//! whatever the driver is doing: every check reads the clock.

#[cfg(feature = "exclusive")]
mod holder;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use steady_slice::guard::Hold;
use steady_slice::{KeyRange, SliceKey};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::ownership::Ownership;

#[cfg(feature = "exclusive")]
pub use holder::{ExclusiveConfig, LeaseHolder};

/// Until when one etcd lease is known to live: the sending of the last renewal etcd
/// answered plus the TTL it granted, less the clock margin. Shared by every check of the
/// tenure; renewals move it later, [`LeaseClock::end`] ends it at once.
#[derive(Debug)]
pub(crate) struct LeaseClock {
    origin: Instant,
    /// Nanoseconds after `origin`.
    until: AtomicU64,
    /// Set by [`LeaseClock::end`], for good.
    ended: AtomicBool,
}

impl LeaseClock {
    pub(crate) fn new(until: Instant) -> Self {
        let origin = Instant::now();
        let clock = Self { origin, until: AtomicU64::new(0), ended: AtomicBool::new(false) };
        clock.extend(until);
        clock
    }

    /// Moves the deadline to `until` if that is later (a renewal answered out of order
    /// never shortens nor lengthens it wrongly: each is a lower bound of etcd's expiry).
    pub(crate) fn extend(&self, until: Instant) {
        let nanos = until.saturating_duration_since(self.origin).as_nanos().min(u128::from(u64::MAX)) as u64;
        self.until.fetch_max(nanos, Ordering::AcqRel);
    }

    /// Ends trust in the lease now, for good.
    pub(crate) fn end(&self) {
        self.ended.store(true, Ordering::Release);
    }

    /// The deadline.
    pub(crate) fn until(&self) -> Instant {
        self.origin + std::time::Duration::from_nanos(self.until.load(Ordering::Acquire))
    }

    /// Whether the lease may be trusted at `now`.
    pub(crate) fn trusted(&self, now: Instant) -> bool {
        let nanos = now.saturating_duration_since(self.origin).as_nanos();
        nanos < u128::from(self.until.load(Ordering::Acquire)) && !self.ended.load(Ordering::Acquire)
    }
}

/// What this task believes at one moment.
#[derive(Debug)]
pub(crate) struct Belief {
    /// The lease tenure it belongs to (each new lease is a new epoch): a handle taken in
    /// one tenure is never valid in another.
    pub(crate) epoch: u64,
    /// The tenure's lease; `None`: nothing is believed.
    pub(crate) clock: Option<Arc<LeaseClock>>,
    /// The hold it rests on, as written in etcd.
    pub(crate) hold: Option<Hold>,
    /// Exactly the keys believed, each with the generation since which it has been
    /// believed without a break.
    pub(crate) ownership: Arc<Ownership>,
}

impl Belief {
    /// The generation since which `key` has been believed without a break, if it is
    /// believed at `now`.
    pub(crate) fn held_since(&self, key: SliceKey, now: Instant) -> Option<u64> {
        let clock = self.clock.as_ref()?;
        if !clock.trusted(now) {
            return None;
        }
        self.ownership.held_since(key)
    }
}

/// A Slicelet's exclusive state: the belief, and a signal of its changes.
#[derive(Debug)]
pub(crate) struct Exclusive {
    belief: ArcSwap<Belief>,
    /// Counts belief changes, to wake [`KeyHandle::ended`].
    changes: watch::Sender<u64>,
    /// Serialises changes (one driver writes; a stopped one's last `forget` may race it).
    writing: Mutex<()>,
}

impl Exclusive {
    pub(crate) fn new() -> Self {
        let nothing = Ownership::believed(None, 0, &[], Instant::now());
        let belief = Belief { epoch: 0, clock: None, hold: None, ownership: Arc::new(nothing) };
        Self {
            belief: ArcSwap::from_pointee(belief),
            changes: watch::Sender::new(0),
            writing: Mutex::new(()),
        }
    }

    pub(crate) fn belief(&self) -> arc_swap::Guard<Arc<Belief>> {
        self.belief.load()
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Believes exactly `ranges` (ascending, disjoint) on `hold` in tenure `epoch` under
    /// `clock`, labelled `generation`; returns the new ownership. Continuity carries over
    /// from the belief before only within the same tenure.
    pub(crate) fn set(
        &self,
        epoch: u64,
        clock: Arc<LeaseClock>,
        hold: Option<Hold>,
        generation: u64,
        ranges: &[KeyRange],
    ) -> Arc<Ownership> {
        let _writing = self.writing.lock().unwrap_or_else(|p| p.into_inner());
        let before = self.belief.load_full();
        let carried = (before.epoch == epoch && before.clock.is_some()).then_some(&*before.ownership);
        let ownership = Arc::new(Ownership::believed(carried, generation, ranges, Instant::now()));
        let belief = Belief { epoch, clock: Some(clock), hold, ownership: ownership.clone() };
        self.belief.store(Arc::new(belief));
        self.changes.send_modify(|n| *n += 1);
        ownership
    }

    /// Believes nothing any more (a tenure ended, or the driver stopped); returns the
    /// empty ownership.
    pub(crate) fn forget(&self) -> Arc<Ownership> {
        let _writing = self.writing.lock().unwrap_or_else(|p| p.into_inner());
        let before = self.belief.load_full();
        let generation = before.ownership.generation();
        let ownership =
            Arc::new(Ownership::believed(Some(&before.ownership), generation, &[], Instant::now()));
        let belief = Belief { epoch: before.epoch, clock: None, hold: None, ownership: ownership.clone() };
        self.belief.store(Arc::new(belief));
        self.changes.send_modify(|n| *n += 1);
        ownership
    }
}

/// The keys in both `a` and `b` (each ascending and disjoint).
pub(crate) fn intersect(a: &[KeyRange], b: &[KeyRange]) -> Vec<KeyRange> {
    let end = |r: &KeyRange| r.end().map_or(1u128 << 64, |e| u128::from(e.get()));
    let (mut i, mut j) = (0, 0);
    let mut out = Vec::new();
    while i < a.len() && j < b.len() {
        let start = a[i].start().max(b[j].start());
        let stop = end(&a[i]).min(end(&b[j]));
        if u128::from(start.get()) < stop {
            out.push(KeyRange::new(start, (stop < 1 << 64).then_some(SliceKey(stop as u64))));
        }
        if end(&a[i]) <= end(&b[j]) {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

/// A key this task owns, for as long as it owns it: Slicer's slice key handle.
///
/// Take one with [`Slicelet::key_handle`](crate::Slicelet::key_handle) when a request for
/// the key arrives, do the work, and check [`KeyHandle::is_valid`] *before* making its
/// effects visible (answering, writing through to storage): if it is no longer valid,
/// another task may own the key now or soon, and what this task computed must be
/// dropped. Once invalid, a handle never becomes valid again, even if the key comes
/// back: take a new one (its [`KeyHandle::since`] tells whether state kept from before
/// is still the only copy).
///
/// In an exclusive job the handle is valid while the Slicelet believes, by the lease
/// protocol, that it owns the key without a break since the handle was taken: no other
/// task can believe it owns the key meanwhile. In an eventual job it is valid while the
/// assignments this task installed gave it the key without a break; other tasks may hold
/// it too (replicas, or a move spreading), so it is affinity, not exclusivity.
///
/// Cost: [`KeyHandle::is_valid`] is an atomic load, a clock read and a binary search over
/// the held ranges (see `docs/benchmarks.md`); no lock, no allocation.
#[derive(Debug, Clone)]
pub struct KeyHandle {
    pub(crate) key: SliceKey,
    pub(crate) since: u64,
    pub(crate) tenure: Tenure,
}

/// What a handle's validity is checked against.
#[derive(Debug, Clone)]
pub(crate) enum Tenure {
    /// An exclusive job: the belief, in one lease tenure.
    Exclusive { state: Arc<crate::State>, epoch: u64 },
    /// An eventual job: the installed assignments.
    Eventual { state: Arc<crate::State> },
}

impl KeyHandle {
    /// The key.
    pub fn key(&self) -> SliceKey {
        self.key
    }

    /// The generation since which this task has owned the key without a break (as
    /// [`Slicelet::held_since`](crate::Slicelet::held_since) said when the handle was
    /// taken): state for the key written at this generation or later is still the only
    /// copy.
    pub fn since(&self) -> u64 {
        self.since
    }

    /// Whether this task still owns the key, without a break since the handle was taken.
    pub fn is_valid(&self) -> bool {
        match &self.tenure {
            Tenure::Exclusive { state, epoch } => {
                let exclusive = state.exclusive.as_ref().expect("an exclusive handle has exclusive state");
                let belief = exclusive.belief();
                belief.epoch == *epoch
                    && belief.held_since(self.key, Instant::now()).is_some_and(|s| s <= self.since)
            }
            Tenure::Eventual { state } => state
                .ownership
                .borrow()
                .as_ref()
                .and_then(|o| o.held_since(self.key))
                .is_some_and(|s| s <= self.since),
        }
    }

    /// Resolves once the handle is no longer valid (at once if it is not): the key moved,
    /// the lease could not be renewed in time, or the Slicelet stopped holding leases.
    pub async fn ended(&self) {
        match &self.tenure {
            Tenure::Exclusive { state, .. } => {
                let exclusive = state.exclusive.as_ref().expect("an exclusive handle has exclusive state");
                let mut changes = exclusive.subscribe();
                while self.is_valid() {
                    let until = exclusive.belief().clock.as_ref().map(|c| c.until());
                    let Some(until) = until else { return };
                    tokio::select! {
                        changed = changes.changed() => if changed.is_err() { return },
                        () = tokio::time::sleep_until(until) => {}
                    }
                }
            }
            Tenure::Eventual { state } => {
                let mut installs = state.ownership.subscribe();
                while self.is_valid() {
                    if installs.changed().await.is_err() {
                        return;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn range(start: u64, end: Option<u64>) -> KeyRange {
        KeyRange::new(SliceKey(start), end.map(SliceKey))
    }

    #[test]
    fn intersections_keep_what_both_lists_cover() {
        let a = [range(0, Some(100)), range(200, None)];
        let b = [range(50, Some(250)), range(300, Some(400))];
        assert_eq!(intersect(&a, &b), [range(50, Some(100)), range(200, Some(250)), range(300, Some(400))]);
        assert_eq!(intersect(&a, &[]), []);
        assert_eq!(intersect(&[KeyRange::FULL], &a), a);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_clock_is_trusted_until_its_deadline_and_never_after_it_ends() {
        let now = Instant::now();
        let clock = LeaseClock::new(now + Duration::from_secs(2));
        assert!(clock.trusted(now));
        assert!(!clock.trusted(now + Duration::from_secs(2)), "the deadline itself is past");
        clock.extend(now + Duration::from_secs(1));
        assert_eq!(clock.until(), now + Duration::from_secs(2), "an older renewal never shortens it");
        clock.extend(now + Duration::from_secs(3));
        assert!(clock.trusted(now + Duration::from_millis(2500)));
        clock.end();
        assert!(!clock.trusted(now));
        clock.extend(now + Duration::from_secs(9));
        assert!(!clock.trusted(now), "a renewal answered after the end does not revive it");
    }
}
