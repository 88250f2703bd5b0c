//! Consistent subsetting: frontends and backends at hashed positions on a ring.

use crate::hash::hash_pair;
use crate::{check_backends, take_prefix, PreferenceOrder, SubsetError, Subsetting};

/// Frontends and backends sit at pseudo-random positions on a circle; a frontend
/// takes the backends it meets walking clockwise from its own position.
///
/// # Specification (frozen)
///
/// Frontend `m` sits at `hash_pair(hash_pair(seed, 0), m)` and backend `n` at
/// `hash_pair(hash_pair(seed, 1), n)` (positions as fractions of `2^64`). The order
/// starts at the first backend whose position is at or after the frontend's (ties by
/// index) and goes clockwise, wrapping once.
///
/// Properties: positions do not depend on `N`, so a one-task resize changes at most
/// one member of any subset. But balance is no better than random (a backend's load
/// is proportional to the arc before it), and the first member fixes the rest, so at
/// most `N` distinct subsets exist. Answering one frontend sorts all `N` positions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Consistent {
    /// A fleet-wide salt (default 0).
    pub seed: u64,
}

impl Subsetting for Consistent {
    fn name(&self) -> &'static str {
        "consistent"
    }

    fn subset_into(
        &self,
        frontend: usize,
        backends: usize,
        size: usize,
        out: &mut Vec<usize>,
    ) -> Result<(), SubsetError> {
        take_prefix(self, frontend, backends, size, out)
    }

    fn job_subsets(
        &self,
        frontends: usize,
        backends: usize,
        size: usize,
    ) -> Result<Vec<Vec<usize>>, SubsetError> {
        check_backends(backends)?;
        let ring = self.ring(backends);
        Ok((0..frontends).map(|m| self.walk(&ring, m, size).collect()).collect())
    }
}

impl Consistent {
    /// The backends `0..backends` sorted by ring position (ties by index).
    fn ring(&self, backends: usize) -> Vec<(u64, usize)> {
        let backend_key = hash_pair(self.seed, 1);
        let mut ring: Vec<(u64, usize)> =
            (0..backends).map(|n| (hash_pair(backend_key, n as u64), n)).collect();
        ring.sort_unstable();
        ring
    }

    /// Frontend `frontend`'s first `size` backends, walking `ring` clockwise.
    fn walk<'a>(
        &self,
        ring: &'a [(u64, usize)],
        frontend: usize,
        size: usize,
    ) -> impl Iterator<Item = usize> + 'a {
        let frontend_pos = hash_pair(hash_pair(self.seed, 0), frontend as u64);
        let start = ring.partition_point(|&(pos, _)| pos < frontend_pos);
        ring[start..].iter().chain(&ring[..start]).take(size).map(|&(_, n)| n)
    }
}

impl PreferenceOrder for Consistent {
    type Order = std::vec::IntoIter<usize>;

    fn order(&self, frontend: usize, backends: usize) -> Result<Self::Order, SubsetError> {
        check_backends(backends)?;
        let ring = self.ring(backends);
        Ok(self.walk(&ring, frontend, backends).collect::<Vec<_>>().into_iter())
    }
}
