//! The spilling half of the routing table: for a zone-aware frontend whose zone cannot
//! take all its requests, the other zones' members and the share of requests each gets.

use std::sync::Arc;

use steady_core::Zone;
use steady_subset::prng::SplitMix64;

use super::endpoint::Endpoint;
use super::pick::{p2c, p2c_other};

/// The connected members of one zone's subset, in preference order.
pub(crate) type Pool<S> = Vec<Arc<Endpoint<S>>>;

/// Where unkeyed requests go when some leave the frontend's zone: a uniform 64-bit draw
/// below `local_below` stays in the zone; above it, the first zone whose `bound` is
/// above the draw takes it (the last zone takes the rest of the range).
///
/// One draw and a scan of a few zones per request; only tables of spilling frontends
/// have one, so the common case pays one branch.
#[derive(Debug)]
pub(crate) struct Spill<S> {
    local_below: u64,
    zones: Vec<SpillZone<S>>,
}

/// One zone requests spill to.
#[derive(Debug)]
pub(crate) struct SpillZone<S> {
    /// Draws below this (and at or above the previous zone's bound) come here.
    bound: u64,
    pub(crate) zone: Zone,
    /// Its share of unkeyed requests.
    pub(crate) share: f64,
    /// Its subset's connected members, in preference order.
    pub(crate) members: Pool<S>,
}

/// `share` of the 64-bit draw range, saturating.
fn scaled(share: f64) -> u64 {
    // 2^64 as a float; the cast saturates at u64::MAX.
    (share.clamp(0.0, 1.0) * 18_446_744_073_709_551_616.0) as u64
}

impl<S> Spill<S> {
    /// Spill that keeps `local` of the requests in the zone and sends the rest to
    /// `zones` by their shares (which sum with `local` to 1). `None` when nothing
    /// spills.
    pub(crate) fn new(local: f64, zones: Vec<(Zone, f64, Pool<S>)>) -> Option<Self> {
        if zones.is_empty() || local >= 1.0 {
            return None;
        }
        let mut cumulative = local;
        let zones = zones
            .into_iter()
            .map(|(zone, share, members)| {
                cumulative += share;
                SpillZone { bound: scaled(cumulative), zone, share, members }
            })
            .collect();
        Some(Self { local_below: scaled(local), zones })
    }

    /// The share of requests that stays in the zone.
    pub(crate) fn local_share(&self) -> f64 {
        self.local_below as f64 / 18_446_744_073_709_551_616.0
    }

    /// The zones spilled to.
    pub(crate) fn zones(&self) -> &[SpillZone<S>] {
        &self.zones
    }

    /// Picks for one unkeyed request: the pool its draw falls in, then power of two
    /// choices there; when that pool has no ready member, any pool that has one (the
    /// local one first). Kept out of line: the table's pick, which every request of every
    /// balancer runs, stays as small as without zones.
    #[inline(never)]
    pub(crate) fn pick<'a>(
        &'a self,
        local: &'a [Arc<Endpoint<S>>],
        rng: &mut SplitMix64,
    ) -> Option<&'a Arc<Endpoint<S>>> {
        let draw = rng.next();
        let pool = if draw < self.local_below {
            local
        } else {
            self.zones.iter().find(|z| draw < z.bound).or(self.zones.last()).map_or(local, |z| &z.members)
        };
        p2c(pool, rng).or_else(|| self.any(local, rng))
    }

    /// A pick from the first pool with a ready member, the local one first.
    #[cold]
    fn any<'a>(
        &'a self,
        local: &'a [Arc<Endpoint<S>>],
        rng: &mut SplitMix64,
    ) -> Option<&'a Arc<Endpoint<S>>> {
        std::iter::once(local)
            .chain(self.zones.iter().map(|z| &z.members[..]))
            .find_map(|pool| p2c(pool, rng))
    }

    /// For a request that could not be sent on connection `avoid`: a pick from the pool
    /// its draw falls in, without `avoid`, else from any pool. Allocates: the slow path.
    pub(crate) fn pick_other(
        &self,
        local: &[Arc<Endpoint<S>>],
        avoid: u64,
        rng: &mut SplitMix64,
    ) -> Option<Arc<Endpoint<S>>> {
        let draw = rng.next();
        let pool = if draw < self.local_below {
            local
        } else {
            self.zones.iter().find(|z| draw < z.bound).or(self.zones.last()).map_or(local, |z| &z.members)
        };
        p2c_other(pool, avoid, rng).or_else(|| {
            std::iter::once(local)
                .chain(self.zones.iter().map(|z| &z.members[..]))
                .find_map(|pool| p2c_other(pool, avoid, rng))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(first: usize, n: usize) -> Vec<Arc<Endpoint<()>>> {
        (first..first + n).map(|t| Arc::new(Endpoint::detached(t, t as u64, ()))).collect()
    }

    fn zone(label: &str) -> Zone {
        Zone::new(label).unwrap()
    }

    #[test]
    fn requests_divide_between_the_zones_by_their_shares() {
        let local = pool(0, 4);
        let spill = Spill::new(
            2.0 / 3.0,
            vec![(zone("b"), 1.0 / 6.0, pool(10, 4)), (zone("c"), 1.0 / 6.0, pool(20, 4))],
        )
        .unwrap();
        let mut rng = SplitMix64::new(11);
        let mut counts = [0usize; 3];
        let draws = 60_000;
        for _ in 0..draws {
            counts[spill.pick(&local, &mut rng).unwrap().task / 10] += 1;
        }
        let share = |n: usize| n as f64 / draws as f64;
        assert!((share(counts[0]) - 2.0 / 3.0).abs() < 0.01, "{counts:?}");
        assert!((share(counts[1]) - 1.0 / 6.0).abs() < 0.01, "{counts:?}");
        assert!((share(counts[2]) - 1.0 / 6.0).abs() < 0.01, "{counts:?}");
        assert!((spill.local_share() - 2.0 / 3.0).abs() < 1e-9);
    }

    #[test]
    fn a_pool_without_ready_members_hands_its_requests_to_one_that_has_some() {
        // Everything is meant to spill to b, which has nothing connected yet: c serves.
        let spill =
            Spill::new(0.0, vec![(zone("b"), 1.0, Vec::new()), (zone("c"), 0.0, pool(20, 2))]).unwrap();
        let mut rng = SplitMix64::new(3);
        for _ in 0..100 {
            assert_eq!(spill.pick(&[], &mut rng).unwrap().task / 10, 2);
        }
        assert!(Spill::new(0.0, vec![(zone("b"), 1.0, Vec::<Arc<Endpoint<()>>>::new())])
            .unwrap()
            .pick(&[], &mut rng)
            .is_none());
        // Nothing spills: no spill at all.
        assert!(Spill::new(1.0, vec![(zone("b"), 0.0, pool(10, 1))]).is_none());
        assert!(Spill::<()>::new(0.5, Vec::new()).is_none());
    }

    #[test]
    fn a_refused_request_goes_anywhere_but_its_connection() {
        let local = pool(0, 1);
        let spill = Spill::new(0.5, vec![(zone("b"), 0.5, pool(10, 1))]).unwrap();
        let mut rng = SplitMix64::new(5);
        for _ in 0..100 {
            assert_eq!(spill.pick_other(&local, 0, &mut rng).unwrap().task, 10);
            assert_eq!(spill.pick_other(&local, 10, &mut rng).unwrap().task, 0);
        }
    }
}
