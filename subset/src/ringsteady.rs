//! Ringsteady subsetting: consistent subsetting on the van der Corput ring.

use crate::ring::{position, RingOrder};
use crate::{check_backends, take_prefix, PreferenceOrder, SubsetError, Subsetting};

/// Frontends and backends sit on the van der Corput ring ([`crate::ring`]); a frontend
/// takes the backends it meets walking clockwise from its own position.
///
/// # Specification (frozen)
///
/// Frontend `m` sits at `position(m) = m.reverse_bits()` (as a `u64`). The order is
/// the ring order of the backends `0..N` ([`crate::ring`]) starting at rank `s` and
/// wrapping once, where
///
/// * with **backend scaling** (the default, [`Ringsteady::new`]) the backend of rank `r`
///   is moved to exactly `r / N` of the circle, so `s = ceil(position(m) × N / 2^64) mod N`;
/// * **unscaled** ([`Ringsteady::unscaled`]) backend `n` stays at `position(n)`, so `s` is
///   the rank of the first backend at or after `position(m)` (0 if none).
///
/// Properties: spread is guaranteed (consecutive task numbers sit far apart, so a
/// block of restarting tasks hits each subset evenly); balance is good, and backend
/// scaling makes it converge to ideal when frontends outnumber backends; only `N`
/// distinct subsets. Unscaled, positions never move, so a one-task resize changes at
/// most one member; scaling moves every backend slightly on a resize, which costs a
/// little churn (measured in the tests). One frontend costs `O(k log N)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ringsteady {
    backend_scaling: bool,
}

impl Ringsteady {
    /// Ringsteady with backend scaling (the article's final form).
    pub const fn new() -> Self {
        Self { backend_scaling: true }
    }

    /// Ringsteady without backend scaling: backends stay at their van der Corput positions.
    pub const fn unscaled() -> Self {
        Self { backend_scaling: false }
    }

    /// Whether backends are moved to evenly spaced positions.
    pub const fn backend_scaling(&self) -> bool {
        self.backend_scaling
    }
}

impl Default for Ringsteady {
    fn default() -> Self {
        Self::new()
    }
}

/// A frontend's Ringsteady preference order; see [`Ringsteady`].
#[derive(Debug, Clone)]
pub struct RingsteadyOrder(RingOrder);

impl Iterator for RingsteadyOrder {
    type Item = usize;

    #[inline]
    fn next(&mut self) -> Option<usize> {
        self.0.next().map(|b| b as usize)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.0.size_hint()
    }
}

impl ExactSizeIterator for RingsteadyOrder {}

impl Subsetting for Ringsteady {
    fn name(&self) -> &'static str {
        if self.backend_scaling {
            "ringsteady"
        } else {
            "ringsteady-unscaled"
        }
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
}

impl PreferenceOrder for Ringsteady {
    type Order = RingsteadyOrder;

    fn order(&self, frontend: usize, backends: usize) -> Result<RingsteadyOrder, SubsetError> {
        check_backends(backends)?;
        let n = backends as u64;
        let pos = position(frontend as u64);
        let order = if self.backend_scaling {
            // ceil(pos × N / 2^64): the first evenly spaced slot at or after pos.
            let start = (u128::from(pos) * u128::from(n)).div_ceil(1 << 64) as u64;
            RingOrder::from_rank(n, start)
        } else {
            RingOrder::from_position(n, pos)
        };
        Ok(RingsteadyOrder(order))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unscaled_frontend_m_starts_at_backend_m_when_m_is_below_n() {
        // Same sequence for both sides: with M = N every frontend starts at its own
        // number, so the subsets are distinct and perfectly balanced.
        for n in 1..40 {
            for m in 0..n {
                assert_eq!(Ringsteady::unscaled().subset(m, n, 1).unwrap(), [m], "n={n}");
            }
        }
    }

    #[test]
    fn scaled_and_unscaled_agree_when_n_is_a_power_of_two() {
        // With N = 2^j the van der Corput positions are already evenly spaced.
        for n in [1usize, 2, 4, 8, 16, 64] {
            for m in 0..100 {
                assert_eq!(
                    Ringsteady::new().subset(m, n, n).unwrap(),
                    Ringsteady::unscaled().subset(m, n, n).unwrap(),
                    "n={n} m={m}"
                );
            }
        }
    }
}
