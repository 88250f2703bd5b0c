//! The spill rule: what share of a zone-aware frontend's unkeyed requests stays in its
//! zone, and how the rest divides among the other zones.
//!
//! Each zone's *demand* is its share of the frontends (every frontend is taken to send
//! alike), its *capacity* its share of the serving backends (none while it is down). A
//! zone whose capacity covers its demand keeps every request. One that falls short keeps
//! `capacity / demand` of its requests, as many as its backends can take at the job's
//! mean load, and spills the rest to the zones with a surplus (capacity above demand),
//! in proportion to that surplus. When every frontend follows the rule, each zone's
//! backends receive exactly the zone's capacity share of all requests (so every backend
//! the mean load), and the requests that cross a zone are exactly the sum of the deficits:
//! no routing that balances the backends crosses less. This is Envoy's zone-aware rule.

use std::collections::BTreeMap;

use steady_core::{Zone, ZoneSizes};

/// The most zones one frontend spills to at a time: each costs a subset of connections,
/// so a fleet of many small zones could otherwise make one frontend connect to all of
/// them. Past it, the zones with the largest shares take the spill, shares rescaled.
pub(crate) const MAX_SPILL_ZONES: usize = 8;

/// Where a frontend's unkeyed requests go.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Shares {
    /// The share that stays in the frontend's zone, in `0.0..=1.0`.
    pub(crate) local: f64,
    /// The other zones' shares (positive), by zone label; with `local` they sum to 1.
    pub(crate) remote: Vec<(Zone, f64)>,
}

impl Shares {
    /// Every request stays in the zone.
    pub(crate) fn all_local() -> Self {
        Self { local: 1.0, remote: Vec::new() }
    }
}

/// The shares of a frontend in zone `local`, which has `local_demand` frontends
/// (whatever `demand` says of it), with `demand` frontends in the other zones and
/// `capacity` backends per zone (a zone counted down has 0).
///
/// With no usable backend anywhere, everything stays local (requests then wait for the
/// local zone, as they would without zones).
pub(crate) fn shares(
    local: &Zone,
    local_demand: usize,
    demand: &ZoneSizes,
    capacity: &BTreeMap<Zone, usize>,
) -> Shares {
    let local_demand = local_demand.max(1);
    let total_demand = (demand.total() - demand.get(local) + local_demand) as f64;
    let total_capacity: usize = capacity.values().sum();
    if total_capacity == 0 {
        return Shares::all_local();
    }
    let total_capacity = total_capacity as f64;
    let demand_share = |zone: &Zone| {
        let frontends = if zone == local { local_demand } else { demand.get(zone) };
        frontends as f64 / total_demand
    };
    let capacity_share = |zone: &Zone| capacity.get(zone).copied().unwrap_or(0) as f64 / total_capacity;
    let (local_demand, local_capacity) = (demand_share(local), capacity_share(local));
    // Every share is one integer ratio, correctly rounded: equal ratios are equal floats,
    // so a zone whose capacity matches its demand exactly spills nothing (not 1e-16).
    if local_capacity >= local_demand {
        return Shares::all_local();
    }
    let kept = local_capacity / local_demand;
    let surplus: Vec<(Zone, f64)> = capacity
        .keys()
        .filter(|zone| *zone != local)
        .map(|zone| (zone.clone(), (capacity_share(zone) - demand_share(zone)).max(0.0)))
        .collect();
    let total_surplus: f64 = surplus.iter().map(|(_, s)| s).sum();
    // The deficits and surpluses of all zones cancel, so a zone short of capacity always
    // finds a surplus elsewhere; should rounding leave none, capacity decides instead.
    let weights: Vec<(Zone, f64)> = if total_surplus > f64::EPSILON {
        surplus
    } else {
        capacity.keys().filter(|z| *z != local).map(|z| (z.clone(), capacity_share(z))).collect()
    };
    if weights.iter().all(|(_, w)| *w <= 0.0) {
        return Shares::all_local();
    }
    let mut weights: Vec<(Zone, f64)> = weights.into_iter().filter(|(_, w)| *w > 0.0).collect();
    if weights.len() > MAX_SPILL_ZONES {
        // The largest first (ties by label, so every frontend agrees), then by label.
        weights.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        weights.truncate(MAX_SPILL_ZONES);
        weights.sort_by(|a, b| a.0.cmp(&b.0));
    }
    let total_weight: f64 = weights.iter().map(|(_, w)| w).sum();
    let remote = weights.into_iter().map(|(zone, w)| (zone, (1.0 - kept) * w / total_weight)).collect();
    Shares { local: kept, remote }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn zone(i: usize) -> Zone {
        Zone::new(&format!("z{i}")).unwrap()
    }

    fn sizes(n: &[usize]) -> ZoneSizes {
        n.iter().enumerate().map(|(i, &n)| (zone(i), n)).collect()
    }

    fn capacity(n: &[usize]) -> BTreeMap<Zone, usize> {
        n.iter().enumerate().map(|(i, &n)| (zone(i), n)).collect()
    }

    #[test]
    fn a_zone_short_of_backends_spills_its_excess_to_the_zones_with_a_surplus() {
        // Frontends 6/3/3 (demand 50/25/25%), backends 4/4/4 (33.3% each): zone 0 keeps
        // two thirds and spills a sixth to each of the others; they keep everything.
        let demand = sizes(&[6, 3, 3]);
        let backends = capacity(&[4, 4, 4]);
        let s = shares(&zone(0), 6, &demand, &backends);
        assert!((s.local - 2.0 / 3.0).abs() < 1e-12, "{s:?}");
        assert_eq!(s.remote.len(), 2);
        for (_, share) in &s.remote {
            assert!((share - 1.0 / 6.0).abs() < 1e-12, "{s:?}");
        }
        assert_eq!(shares(&zone(1), 3, &demand, &backends), Shares::all_local());
    }

    #[test]
    fn capacity_that_matches_demand_spills_nothing_whatever_the_rounding() {
        // 6 of 15 frontends and 4 of 10 backends; 1 of 3 and 3 of 9; 7 of 21 and 5 of 15.
        for (f, b) in [([6, 6, 3], [4, 4, 2]), ([1, 1, 1], [3, 3, 3]), ([7, 7, 7], [5, 5, 5])] {
            for z in 0..3 {
                assert_eq!(
                    shares(&zone(z), f[z], &sizes(&f), &capacity(&b)),
                    Shares::all_local(),
                    "{f:?} {b:?}"
                );
            }
        }
    }

    #[test]
    fn a_zone_without_backends_spills_everything_by_surplus() {
        let s = shares(&zone(0), 6, &sizes(&[6, 3, 3]), &capacity(&[0, 4, 2]));
        // Capacity 0/66.7/33.3%, demand 50/25/25%: surpluses 41.7 and 8.3 points.
        assert_eq!(s.local, 0.0);
        assert_eq!(s.remote.iter().map(|(z, _)| z.clone()).collect::<Vec<_>>(), [zone(1), zone(2)]);
        assert!((s.remote[0].1 - 5.0 / 6.0).abs() < 1e-12, "{s:?}");
        assert!((s.remote[1].1 - 1.0 / 6.0).abs() < 1e-12, "{s:?}");
    }

    #[test]
    fn nothing_usable_anywhere_stays_local_and_the_local_zone_counts_its_frontends() {
        assert_eq!(shares(&zone(0), 1, &sizes(&[1, 1]), &capacity(&[0, 0])), Shares::all_local());
        // This frontend's zone is missing from the sizes and counts one frontend of 3,
        // with one backend of 3: covered.
        let demand = ZoneSizes::new().with(zone(1), 2);
        assert_eq!(shares(&zone(0), 1, &demand, &capacity(&[1, 2])), Shares::all_local());
        // Counted as 4 of 6 instead, it falls short.
        assert!(shares(&zone(0), 4, &demand, &capacity(&[1, 2])).local < 1.0);
    }

    #[test]
    fn a_frontend_spills_to_at_most_a_few_zones_the_largest_surpluses_first() {
        // One zone of 10 frontends and no backend; 12 zones of one backend and no
        // frontend, and zone 13 with 5 backends: the largest surplus and 7 of the others.
        let mut f = vec![0; 14];
        f[0] = 10;
        let mut b = vec![1; 14];
        b[0] = 0;
        b[13] = 5;
        let s = shares(&zone(0), 10, &sizes(&f), &capacity(&b));
        assert_eq!(s.remote.len(), MAX_SPILL_ZONES);
        assert!(s.remote.iter().any(|(z, _)| *z == zone(13)));
        let sum: f64 = s.remote.iter().map(|(_, x)| x).sum();
        assert!((sum - 1.0).abs() < 1e-12 && s.local == 0.0, "{s:?}");
        let big = s.remote.iter().find(|(z, _)| *z == zone(13)).unwrap().1;
        assert!((big - 5.0 / 12.0).abs() < 1e-12, "{s:?}");
    }

    /// Per zone: (frontends, usable backends).
    fn fleets() -> impl Strategy<Value = Vec<(usize, usize)>> {
        prop::collection::vec((0usize..50, 0usize..50), 1..=MAX_SPILL_ZONES)
            .prop_filter("some frontend and some backend", |z| {
                z.iter().any(|&(f, _)| f > 0) && z.iter().any(|&(_, b)| b > 0)
            })
    }

    proptest! {
        /// Every frontend's shares sum to one; when every zone's frontends follow the
        /// rule, each zone's backends receive exactly their capacity share of all
        /// requests (every backend the mean load), and the share that crosses a zone is
        /// the least any balanced routing needs: the sum of the zones' deficits.
        #[test]
        fn the_rule_balances_backends_and_crosses_zones_no_more_than_needed(fleet in fleets()) {
            let demand: ZoneSizes = fleet.iter().enumerate().map(|(i, &(f, _))| (zone(i), f)).collect();
            let backends: BTreeMap<Zone, usize> =
                fleet.iter().enumerate().map(|(i, &(_, b))| (zone(i), b)).collect();
            let (total_f, total_b) = (demand.total() as f64, backends.values().sum::<usize>() as f64);
            let mut received = vec![0.0; fleet.len()];
            let mut crossing = 0.0;
            for (i, &(frontends, _)) in fleet.iter().enumerate() {
                if frontends == 0 {
                    continue;
                }
                let s = shares(&zone(i), frontends, &demand, &backends);
                let sum = s.local + s.remote.iter().map(|(_, x)| x).sum::<f64>();
                prop_assert!((sum - 1.0).abs() < 1e-9, "{s:?}");
                prop_assert!((0.0..=1.0).contains(&s.local));
                let zone_demand = frontends as f64 / total_f;
                received[i] += zone_demand * s.local;
                for (z, share) in &s.remote {
                    prop_assert!(*share > 0.0 && backends[z] > 0, "{z} gets {share} with no backend");
                    let j: usize = z.as_str()[1..].parse().unwrap();
                    received[j] += zone_demand * share;
                    crossing += zone_demand * share;
                }
            }
            let mut deficits = 0.0;
            for (i, &(frontends, b)) in fleet.iter().enumerate() {
                let capacity = b as f64 / total_b;
                prop_assert!((received[i] - capacity).abs() < 1e-9, "zone {i}: {} of {capacity}", received[i]);
                deficits += (frontends as f64 / total_f - capacity).max(0.0);
            }
            prop_assert!((crossing - deficits).abs() < 1e-9, "{crossing} crossing, {deficits} needed");
        }
    }
}
