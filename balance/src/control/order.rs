//! The order in which a frontend prefers backends, for every algorithm.

use std::collections::HashSet;

use steady_subset::{Algorithm, Subsetting};

/// The frontend's order of backends: the algorithm's preference order when it has
/// one; otherwise its subset of size `k` followed by the other backends in ascending
/// order from the last member (a fixed, documented fallback for stand-ins).
pub(super) fn candidate_order(
    algorithm: &Algorithm,
    frontend: usize,
    backends: usize,
    k: usize,
) -> Box<dyn Iterator<Item = usize> + Send> {
    match algorithm.order(frontend, backends) {
        Ok(Some(order)) => Box::new(order),
        Ok(None) => {
            let subset = algorithm.subset(frontend, backends, k).unwrap_or_default();
            let members: HashSet<usize> = subset.iter().copied().collect();
            let from = subset.last().map_or(0, |&b| b + 1);
            let rest = (0..backends)
                .map(move |i| (from + i) % backends.max(1))
                .filter(move |b| !members.contains(b));
            Box::new(subset.into_iter().chain(rest))
        }
        // Larger than MAX_BACKENDS: no subset can be computed (the caller keeps the
        // subset it has).
        Err(error) => {
            tracing::error!(%error, "cannot compute the subset: keeping the current one");
            Box::new(std::iter::empty())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fallback_order_starts_with_the_subset_and_covers_every_backend() {
        let d = Algorithm::from_name("deterministic").unwrap();
        let order: Vec<usize> = candidate_order(&d, 3, 30, 5).collect();
        assert_eq!(&order[..5], &d.subset(3, 30, 5).unwrap()[..]);
        let mut sorted = order.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..30).collect::<Vec<_>>());
        let r = Algorithm::default();
        let order: Vec<usize> = candidate_order(&r, 3, 30, 5).collect();
        assert_eq!(&order[..5], &r.subset(3, 30, 5).unwrap()[..]);
    }
}
