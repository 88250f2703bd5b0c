//! The pick policy: power of two choices, with a tie band, over one list of endpoints.

use std::sync::Arc;

use steady_subset::prng::SplitMix64;

use super::endpoint::Endpoint;

/// Two loads closer than this ratio count as a tie: the second draw is taken over the
/// first only when its load is at most `TIE_RATIO` times the first's.
///
/// Why a band, and what it costs: `docs/balancer.md#the-tie-band` (the runs:
/// `docs/benchmarks.md#the-tie-band-measured`).
const TIE_RATIO: f64 = 0.75;

/// Power of two choices over `members`: two distinct random ones, the less loaded
/// unless their loads are within [`TIE_RATIO`] of each other, in which case either
/// (both draws are uniformly random). A broken endpoint loses to any healthy one.
/// Members in slow start or on probation are held back (see [`gated`]).
/// `None` when there are none (or the only one is broken).
#[inline]
pub(crate) fn p2c<'a, S>(
    members: &'a [Arc<Endpoint<S>>],
    rng: &mut SplitMix64,
) -> Option<&'a Arc<Endpoint<S>>> {
    let n = members.len();
    match n {
        0 => None,
        // The only member: nothing to hold it back for.
        1 => members.first().filter(|e| !e.is_broken()),
        _ => {
            let i = rng.below(n as u64) as usize;
            let mut j = rng.below(n as u64 - 1) as usize;
            if j >= i {
                j += 1;
            }
            let (a, b) = (&members[i], &members[j]);
            // One read per member says it may take the request (not broken, not held back):
            // one atomic load, compared with the open state.
            if !a.gate().is_open() || !b.gate().is_open() {
                return gated(members, a, b, rng);
            }
            Some(if b.load() <= a.load() * TIE_RATIO { b } else { a })
        }
    }
}

/// Both draws are held back or broken (the control task has not yet published a table
/// without them): any healthy member will do, preferably one not held back.
#[cold]
fn any_healthy<S>(members: &[Arc<Endpoint<S>>]) -> Option<&Arc<Endpoint<S>>> {
    members
        .iter()
        .find(|e| !e.is_broken() && e.gate().serves())
        .or_else(|| members.iter().find(|e| !e.is_broken()))
}

/// The pick when a draw is held back: a member in slow start (a gate with a share)
/// takes a pick that draws it with the chance its gate says, else counts as infinitely
/// loaded; a member on probation waiting for its probe is as attractive as an idle
/// one, and takes the request only if it wins and claims the probe; one whose probe is
/// in flight is held back. When both draws are held back, a slow-starting one still
/// serves (a slow start only shifts load between members), and probation members only when
/// nothing else can.
#[cold]
#[inline(never)]
fn gated<'a, S>(
    members: &'a [Arc<Endpoint<S>>],
    a: &'a Arc<Endpoint<S>>,
    b: &'a Arc<Endpoint<S>>,
    rng: &mut SplitMix64,
) -> Option<&'a Arc<Endpoint<S>>> {
    let mut admitted_load = |e: &Endpoint<S>| -> f64 {
        let gate = e.gate();
        if gate.is_open() {
            e.load()
        } else if gate.is_probe_waiting() {
            0.0
        } else if gate.slow_start_share().is_some_and(|share| share.admits(rng)) {
            e.load()
        } else {
            // Probe in flight, or broken, or a slow start's draw lost.
            f64::INFINITY
        }
    };
    let (la, lb) = (admitted_load(a), admitted_load(b));
    let (best, other) = if lb <= la * TIE_RATIO { (b, a) } else { (a, b) };
    let best_load = if std::ptr::eq(best, b) { lb } else { la };
    if best_load.is_finite() {
        if !best.gate().is_probe_waiting() || best.try_probe() {
            return Some(best);
        }
        // Another request claimed the probe first.
        let other_load = if std::ptr::eq(other, b) { lb } else { la };
        if other_load.is_finite() && other.gate().serves() {
            return Some(other);
        }
    }
    // Both held back: a healthy one not on probation, the better draw first.
    [best, other].into_iter().find(|e| !e.is_broken() && e.gate().serves()).or_else(|| any_healthy(members))
}

/// Power of two choices over the `members` that `keep` accepts. Allocates: the slow
/// paths only (a request moving off a member, a hedged attempt).
pub(crate) fn p2c_where<'a, S: 'a>(
    members: impl IntoIterator<Item = &'a Arc<Endpoint<S>>>,
    keep: impl Fn(&Endpoint<S>) -> bool,
    rng: &mut SplitMix64,
) -> Option<Arc<Endpoint<S>>> {
    let kept: Vec<Arc<Endpoint<S>>> = members.into_iter().filter(|e| keep(e)).cloned().collect();
    p2c(&kept, rng).cloned()
}

/// Power of two choices over `members` other than connection `avoid`, for a request
/// that could not be sent on `avoid`.
pub(crate) fn p2c_other<S>(
    members: &[Arc<Endpoint<S>>],
    avoid: u64,
    rng: &mut SplitMix64,
) -> Option<Arc<Endpoint<S>>> {
    p2c_where(members, |e| e.id != avoid, rng)
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;
    use crate::classify::Outcome;

    fn members(loads: &[usize]) -> Vec<Arc<Endpoint<()>>> {
        loads
            .iter()
            .enumerate()
            .map(|(i, &l)| {
                let ep = Endpoint::detached(i, i as u64, ());
                ep.calls.in_flight.store(l, Ordering::Relaxed);
                Arc::new(ep)
            })
            .collect()
    }

    fn picks(loads: &[usize], draws: usize) -> Vec<usize> {
        let m = members(loads);
        let mut rng = SplitMix64::new(7);
        let mut picks = vec![0; loads.len()];
        for _ in 0..draws {
            picks[p2c(&m, &mut rng).unwrap().task] += 1;
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
        let m = members(&[0, 500, 0]);
        // Members 0 and 2 failed a call (idle, but broken): only member 1 is picked.
        for broken in [&m[0], &m[2]] {
            broken.record(Outcome::Transport);
        }
        let mut rng = SplitMix64::new(3);
        for _ in 0..300 {
            assert_eq!(p2c(&m, &mut rng).unwrap().task, 1);
        }
    }

    #[test]
    fn p2c_never_picks_the_most_loaded_of_loads_beyond_the_band() {
        let m = members(&[5, 0, 9]);
        let mut rng = SplitMix64::new(1);
        let mut picks = [0; 3];
        for _ in 0..3000 {
            picks[p2c(&m, &mut rng).unwrap().task] += 1;
        }
        // 9 against 5 and 9 against 0 are beyond the band: the busiest loses every
        // comparison; the idlest wins both of its pairs.
        assert_eq!(picks[2], 0);
        assert!(picks[1] > 1800 && picks[0] > 800, "{picks:?}");
        assert!(p2c(&members(&[]), &mut rng).is_none());
        assert_eq!(p2c(&members(&[4]), &mut rng).unwrap().task, 0);
    }

    #[test]
    fn a_request_that_could_not_be_sent_avoids_its_connection() {
        let m = members(&[0, 9]);
        let mut rng = SplitMix64::new(5);
        for _ in 0..100 {
            assert_eq!(p2c_other(&m, 0, &mut rng).unwrap().task, 1);
        }
        assert!(p2c_other(&m[..1], 0, &mut rng).is_none());
    }
}
