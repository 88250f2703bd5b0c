//! Round-robin subsetting: consecutive backends, frontend after frontend.

use crate::{check_backends, SubsetError, Subsetting};

/// Frontend `m` takes the `k` backends starting at `(m × k) mod N`, wrapping around.
///
/// Properties: ideal balance (a backend gets its next connection only after every
/// other backend has one), but only `N / gcd(k, N)` distinct subsets, every subset is
/// a block of consecutive task numbers (a rolling restart of `k` tasks can take out a
/// whole subset), and the start depends on `k` and `N`, so resizing moves everything.
/// Not a [`crate::PreferenceOrder`].
///
/// The order of the list is `start, start+1, ...` (mod `N`). Frozen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RoundRobin;

impl Subsetting for RoundRobin {
    fn name(&self) -> &'static str {
        "round-robin"
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
        if backends == 0 {
            return Ok(());
        }
        let n = backends as u128;
        // (m × k) mod N without overflow for any m and k.
        let start = ((frontend as u128 % n) * (size as u128 % n) % n) as usize;
        out.extend((0..size.min(backends)).map(|i| (start + i) % backends));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reproduces_the_articles_table_one() {
        // N = 10, k = 4: frontends 0..5 get {0..3}, {4..7}, {8,9,0,1}, {2..5}, {6..9}.
        let got: Vec<Vec<usize>> = (0..5).map(|m| RoundRobin.subset(m, 10, 4).unwrap()).collect();
        assert_eq!(
            got,
            [vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9, 0, 1], vec![2, 3, 4, 5], vec![6, 7, 8, 9]]
        );
        // Frontend 5 repeats frontend 0: only N / gcd(k, N) = 5 distinct subsets.
        assert_eq!(RoundRobin.subset(5, 10, 4).unwrap(), [0, 1, 2, 3]);
    }

    #[test]
    fn huge_indices_do_not_overflow() {
        let s = RoundRobin.subset(usize::MAX, 7, usize::MAX).unwrap();
        assert_eq!(s.len(), 7);
    }
}
