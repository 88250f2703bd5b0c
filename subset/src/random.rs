//! Random subsetting in the style of gRPC's (gRFC A68).

use crate::hash::hash_pair;
use crate::{check_backends, PreferenceOrder, SubsetError, Subsetting};

/// Each frontend orders the backends by a 64-bit hash of (its own seed, backend).
///
/// # Specification (frozen)
///
/// Frontend `m` has the key `f = hash_pair(seed, m)`; backend `n` has the rank key
/// `hash_pair(f, n)`. The preference order is the backends sorted by rank key
/// ascending, ties (which `hash_pair`'s bijectivity in its second argument rules out)
/// broken by index.
///
/// Properties: a backend's place in the order does not depend on `N`, so adding or
/// removing one backend changes at most one member of any subset, and growing `k`
/// only adds. Diversity is high. Balance is that of independent random choices: poor
/// when `M × k / N` is small (some backends get far more connections than others).
///
/// gRPC clients pick a fresh random seed per process; here the seed is derived from
/// the frontend index so that a frontend's subset survives its restart.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Random {
    /// A fleet-wide salt (default 0).
    pub seed: u64,
}

impl Random {
    fn sorted(&self, frontend: usize, backends: usize, size: usize) -> Vec<usize> {
        let key = hash_pair(self.seed, frontend as u64);
        let mut ranked: Vec<(u64, usize)> = (0..backends).map(|n| (hash_pair(key, n as u64), n)).collect();
        let size = size.min(backends);
        if size < backends && size > 0 {
            // Only the first `size` need sorting.
            ranked.select_nth_unstable(size - 1);
            ranked.truncate(size);
        } else {
            ranked.truncate(size);
        }
        ranked.sort_unstable();
        ranked.into_iter().map(|(_, n)| n).collect()
    }
}

impl Subsetting for Random {
    fn name(&self) -> &'static str {
        "random"
    }

    fn subset_into(
        &self,
        frontend: usize,
        backends: usize,
        size: usize,
        out: &mut Vec<usize>,
    ) -> Result<(), SubsetError> {
        check_backends(backends)?;
        out.clear();
        out.extend(self.sorted(frontend, backends, size));
        Ok(())
    }
}

impl PreferenceOrder for Random {
    type Order = std::vec::IntoIter<usize>;

    fn order(&self, frontend: usize, backends: usize) -> Result<Self::Order, SubsetError> {
        check_backends(backends)?;
        Ok(self.sorted(frontend, backends, backends).into_iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subset_is_the_prefix_of_the_order() {
        let r = Random::default();
        for k in 0..=12 {
            let order: Vec<usize> = r.order(5, 12).unwrap().collect();
            assert_eq!(r.subset(5, 12, k).unwrap(), order[..k]);
        }
    }
}
