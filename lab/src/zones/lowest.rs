//! The lowest cross-zone share a phase allows, from its demand and capacity alone.
//!
//! Every frontend sends the same request rate, so a zone's share of the demand is its
//! share of the frontends; every serving backend should take the same share of the
//! requests (busiest / mean = 1), so a zone's share of the capacity is its share of the
//! serving backends. A zone can then answer locally at most the smaller of the two; the
//! rest of its demand must cross to another zone. Summed over the zones:
//!
//! ```text
//! lowest = sum over zones z of max(0, demand share(z) - capacity share(z))
//! ```
//!
//! (The surplus zones' spare capacity equals the deficit zones' excess, so the sum is
//! reachable.) Three zones with frontends 6/3/3 and backends 4/4/4: zone a has 50% of the
//! demand and 33.3% of the capacity, 16.7% must cross.

/// The lowest share of requests (0 to 1) that crosses a zone boundary when each zone
/// has `(frontends, serving backends)` of `zones` and every serving backend takes an
/// even share. `None` when there is no frontend or no serving backend at all (nothing to
/// route, or nothing to route to).
pub(crate) fn lowest_cross_zone(zones: &[(usize, usize)]) -> Option<f64> {
    let demand: usize = zones.iter().map(|z| z.0).sum();
    let capacity: usize = zones.iter().map(|z| z.1).sum();
    if demand == 0 || capacity == 0 {
        return None;
    }
    let excess = zones
        .iter()
        .map(|&(frontends, backends)| {
            (frontends as f64 / demand as f64 - backends as f64 / capacity as f64).max(0.0)
        })
        .sum::<f64>();
    Some(excess)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(got: Option<f64>, expected: f64) -> bool {
        got.is_some_and(|g| (g - expected).abs() < 1e-9)
    }

    #[test]
    fn the_busiest_zone_s_excess_demand_must_cross() {
        // Steady state: a has half the demand and a third of the capacity.
        assert!(close(lowest_cross_zone(&[(6, 4), (3, 4), (3, 4)]), 1.0 / 6.0));
        // Zone a's backends down: all of a's half crosses.
        assert!(close(lowest_cross_zone(&[(6, 0), (3, 4), (3, 4)]), 0.5));
        // Zone b's frontends doubled: a and b have 40% each against a third.
        assert!(close(lowest_cross_zone(&[(6, 4), (6, 4), (3, 4)]), 2.0 * (0.4 - 1.0 / 3.0)));
        // Then zone c's backends halved: capacity 40/40/20 matches demand 40/40/20.
        assert!(close(lowest_cross_zone(&[(6, 4), (6, 4), (3, 2)]), 0.0));
    }

    #[test]
    fn matching_shares_cross_nothing_and_an_empty_side_routes_nothing() {
        assert!(close(lowest_cross_zone(&[(3, 4), (3, 4), (3, 4)]), 0.0));
        assert!(close(lowest_cross_zone(&[(5, 7)]), 0.0));
        // A zone without frontends only adds capacity.
        assert!(close(lowest_cross_zone(&[(4, 2), (0, 2)]), 0.5));
        assert_eq!(lowest_cross_zone(&[(0, 4), (0, 4)]), None);
        assert_eq!(lowest_cross_zone(&[(6, 0), (3, 0)]), None);
        assert_eq!(lowest_cross_zone(&[]), None);
    }
}
