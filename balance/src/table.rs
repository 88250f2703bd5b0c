//! The immutable routing table the control task publishes and requests read.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use steady_subset::prng::SplitMix64;
use tokio::sync::watch;

use crate::endpoint::Endpoint;
use crate::slices::SliceTable;

/// What requests route over: the ready members of the subset, in preference order.
///
/// Built by the control task and swapped in whole; a request reads whichever table is
/// current when it starts and never waits for the control task. (Keyed routing will
/// add the assignment's slice table here.)
#[derive(Debug)]
pub(crate) struct RoutingTable<S> {
    /// Bumped on every publication.
    pub(crate) version: u64,
    /// Connected, healthy members, in the frontend's preference order.
    pub(crate) members: Vec<Arc<Endpoint<S>>>,
    /// The subset the control task wants (members and stand-ins, ready or not).
    pub(crate) wanted: Vec<usize>,
    /// Connections outside the subset (affinity connections for keyed requests).
    pub(crate) affinity: Vec<Arc<Endpoint<S>>>,
    /// The assignment in force, as this frontend routes it; `None` before the first.
    pub(crate) slices: Option<SliceTable<S>>,
}

/// Two loads closer than this ratio count as a tie: the second draw is taken over the
/// first only when its load is at most `TIE_RATIO` times the first's.
///
/// Why: at high concurrency the in-flight count of a connection moves in bursts (HTTP/2
/// delivers many responses in one read), so small differences between two connections
/// are mostly timing. Following them sends the requests issued right after a burst back
/// to the connection the burst came from, and requests then travel in clumps: over 4
/// loopback servers at concurrency 256 this made p99 two to three times round-robin's,
/// and a 25% tie band brought it back to round-robin's (see the README's throughput
/// notes). A slow or overloaded backend shows as a large difference and is still
/// avoided. The price: in-flight counts of 4 against 5 (or 8 against 10) are a tie
/// too, and with Peak EWMA so are latency estimates within 25% of each other.
const TIE_RATIO: f64 = 0.75;

/// Power of two choices over `members`: two distinct random ones, the less loaded
/// unless their loads are within [`TIE_RATIO`] of each other, in which case either
/// (both draws are uniformly random). `None` when there are none.
#[inline]
pub(crate) fn p2c<'a, S>(
    members: &'a [Arc<Endpoint<S>>],
    rng: &mut SplitMix64,
) -> Option<&'a Arc<Endpoint<S>>> {
    let n = members.len();
    match n {
        0 => None,
        1 => members.first().filter(|e| !e.is_broken()),
        _ => {
            let i = rng.below(n as u64) as usize;
            let mut j = rng.below(n as u64 - 1) as usize;
            if j >= i {
                j += 1;
            }
            let (a, b) = (&members[i], &members[j]);
            // A broken endpoint's load is infinite: it loses to any healthy one.
            let best = if b.load() <= a.load() * TIE_RATIO { b } else { a };
            if best.is_broken() {
                // Both draws failed a call already (the control task has not yet
                // published a table without them): any healthy member will do.
                return members.iter().find(|e| !e.is_broken());
            }
            Some(best)
        }
    }
}

/// A generator for one request-side handle, seeded without touching shared state:
/// a per-thread counter mixed with the thread's identity.
pub(crate) fn fresh_rng() -> SplitMix64 {
    use std::cell::Cell;
    use std::hash::{BuildHasher, RandomState};
    thread_local! {
        static NEXT: Cell<u64> = Cell::new(RandomState::new().hash_one(std::thread::current().id()));
    }
    let seed = NEXT.with(|n| {
        let v = n.get();
        n.set(v.wrapping_add(1));
        v
    });
    SplitMix64::new(steady_subset::hash::mix64(seed))
}

impl<S> RoutingTable<S> {
    pub(crate) fn empty() -> Self {
        Self { version: 0, members: Vec::new(), wanted: Vec::new(), affinity: Vec::new(), slices: None }
    }

    /// A member other than connection `avoid` (p2c among the rest), for a request
    /// that could not be sent on `avoid`.
    pub(crate) fn pick_other(&self, avoid: u64, rng: &mut SplitMix64) -> Option<Arc<Endpoint<S>>> {
        let others: Vec<Arc<Endpoint<S>>> = self.members.iter().filter(|e| e.id != avoid).cloned().collect();
        p2c(&others, rng).cloned()
    }

    /// Power of two choices over the subset's ready members.
    #[inline]
    pub(crate) fn pick(&self, rng: &mut SplitMix64) -> Option<&Arc<Endpoint<S>>> {
        p2c(&self.members, rng)
    }
}

/// Counters that outlive connections.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) opened: AtomicU64,
    pub(crate) closed: AtomicU64,
    pub(crate) connect_failures: AtomicU64,
    pub(crate) ejections: AtomicU64,
    pub(crate) no_backend: AtomicU64,
    pub(crate) assignments_accepted: AtomicU64,
    pub(crate) assignments_stale: AtomicU64,
    pub(crate) assignments_rejected: AtomicU64,
    pub(crate) keyed_fallbacks: AtomicU64,
    pub(crate) no_replica: AtomicU64,
    pub(crate) affinity_opened: AtomicU64,
    /// Requests and failures of connections already closed (live ones count on their endpoint).
    pub(crate) closed_requests: AtomicU64,
    pub(crate) closed_failures: AtomicU64,
    pub(crate) closed_keyed: AtomicU64,
}

impl Counters {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// What the request side and the control task share.
#[derive(Debug)]
pub(crate) struct Shared<S> {
    pub(crate) table: ArcSwap<RoutingTable<S>>,
    /// The current table's version, for requests waiting for a ready backend.
    pub(crate) versions: watch::Sender<u64>,
    pub(crate) counters: Counters,
    /// Connections open, including draining ones (maintained by the control task).
    pub(crate) open: AtomicU64,
    /// How long a request waits for a backend (to be ready, or to exist).
    pub(crate) no_backend_wait: std::time::Duration,
}

impl<S> Shared<S> {
    pub(crate) fn new(no_backend_wait: std::time::Duration) -> Self {
        Self {
            no_backend_wait,
            table: ArcSwap::from_pointee(RoutingTable::empty()),
            versions: watch::Sender::new(0),
            counters: Counters::default(),
            open: AtomicU64::new(0),
        }
    }

    /// Swaps in a new table and wakes requests waiting for one.
    pub(crate) fn publish(&self, table: RoutingTable<S>) {
        let version = table.version;
        self.table.store(Arc::new(table));
        self.versions.send_replace(version);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Load;
    use tokio::sync::mpsc;

    fn table(loads: &[usize]) -> RoutingTable<()> {
        let (tx, _rx) = mpsc::unbounded_channel();
        let members = loads
            .iter()
            .enumerate()
            .map(|(i, &l)| {
                let ep = Endpoint::new(i, i as u64, (), Load::InFlight, tx.clone(), std::sync::Weak::new());
                ep.in_flight.store(l, Ordering::Relaxed);
                Arc::new(ep)
            })
            .collect();
        RoutingTable { version: 1, members, wanted: vec![], affinity: vec![], slices: None }
    }

    fn picks(loads: &[usize], draws: usize) -> Vec<usize> {
        let t = table(loads);
        let mut rng = SplitMix64::new(7);
        let mut picks = vec![0; loads.len()];
        for _ in 0..draws {
            picks[t.pick(&mut rng).unwrap().task] += 1;
        }
        picks
    }

    #[test]
    fn loads_within_the_tie_band_are_picked_evenly() {
        // 60 against 64, and 49 against 64 (just inside the band): a coin toss.
        for loads in [[64, 60], [64, 49]] {
            let p = picks(&loads, 4000);
            assert!(p[0] > 1800 && p[1] > 1800, "{loads:?}: {p:?}");
        }
    }

    #[test]
    fn a_clearly_less_loaded_member_always_wins() {
        // Beyond the band the lighter one every time: at low loads a difference of one.
        for loads in [[64, 47], [1, 0], [4, 3], [10, 2]] {
            let p = picks(&loads, 1000);
            let lighter = if loads[0] < loads[1] { 0 } else { 1 };
            assert_eq!(p[lighter], 1000, "{loads:?}: {p:?}");
        }
    }

    #[test]
    fn a_broken_member_loses_to_any_healthy_one() {
        let t = table(&[0, 500, 0]);
        // Members 0 and 2 failed a call (idle, but broken): only member 1 is picked.
        for broken in [&t.members[0], &t.members[2]] {
            crate::endpoint::InFlight::start(broken.clone()).failed();
        }
        let mut rng = SplitMix64::new(3);
        for _ in 0..300 {
            assert_eq!(t.pick(&mut rng).unwrap().task, 1);
        }
    }

    #[test]
    fn p2c_never_picks_the_most_loaded_of_loads_beyond_the_band() {
        let t = table(&[5, 0, 9]);
        let mut rng = SplitMix64::new(1);
        let mut picks = [0; 3];
        for _ in 0..3000 {
            picks[t.pick(&mut rng).unwrap().task] += 1;
        }
        // 9 against 5 and 9 against 0 are beyond the band: the busiest loses every
        // comparison; the idlest wins both of its pairs.
        assert_eq!(picks[2], 0);
        assert!(picks[1] > 1800 && picks[0] > 800, "{picks:?}");
        assert!(table(&[]).pick(&mut rng).is_none());
        assert_eq!(table(&[4]).pick(&mut rng).unwrap().task, 0);
    }
}
