//! [`KeyedLoadBound`]: bounded-load routing for keyed requests, the tail's guard while a
//! new hot key waits for the Assigner to move or replicate it.

use steady_core::ConfigError;

/// Bounded-load keyed routing (after "Consistent Hashing with Bounded Loads", Mirrokni,
/// Thorup and Zadimoghaddam, as Google Cloud Pub/Sub, HAProxy and Envoy use it).
///
/// A keyed request goes to its slice's replica as usual, unless this frontend already
/// has more than `factor` times the mean requests in flight per connection, plus
/// `floor`, in flight on that replica: then to the first candidate under that bound, in
/// this order: the slice's other replicas; then ([`KeyedSpill::Neighbour`]) the replicas
/// of the following slices of the assignment, up to [`MAX_NEIGHBOUR_STEPS`] slices on, so
/// that a slice's spilled keys land on one warm backend rather than everywhere; then
/// power of two choices over every connected replica. The mean is over the connected
/// replicas of the assignment in force (each once), counting this frontend's requests
/// only; a task the assignment does not name (one draining out of it, say) never gets a
/// spilled request.
///
/// What it trades: a spilled request reaches a backend the assignment does not name (a
/// miss there the first time, counted as misrouted by a Slicelet, and served: the
/// client's generation header tells the Slicelet the client is not behind); in return
/// no replica queues far beyond the others in the second or two before load reports
/// reach the Assigner. With nothing hot, nothing spills: the owner is over the bound
/// only when it has more than `floor` requests in flight from this frontend *and* more
/// than `factor` times the mean. The count of spilled requests is
/// [`BalanceStats::keyed_spilled`](crate::BalanceStats::keyed_spilled).
///
/// Cost: one more read of the picked replica's in-flight count per keyed request; the
/// mean is computed (one read per connection) only when that count is over `floor`.
///
/// ```
/// use steady_balance::{BalanceConfig, KeyedLoadBound};
///
/// let config = BalanceConfig::new(0, 8).with_keyed_load_bound(KeyedLoadBound::new(1.5, 2));
/// config.validate()?;
/// assert!(BalanceConfig::new(0, 8).with_keyed_load_bound(KeyedLoadBound::new(0.5, 2)).validate().is_err());
/// # Ok::<(), steady_balance::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct KeyedLoadBound {
    /// `c`: a replica is over the bound above `c` times the mean in flight (plus
    /// `floor`). At least 1; Envoy's default is 1.5.
    pub factor: f64,
    /// Requests in flight on a replica that never count as over the bound, however
    /// idle the others are (so that a quiet fleet does not spill).
    pub floor: u32,
    /// Where a request goes when its slice's replicas are all over the bound.
    pub spill: KeyedSpill,
}

/// The most slices past its own a spilled keyed request looks at for a replica under
/// the bound ([`KeyedSpill::Neighbour`]) before it falls back to every connected replica.
pub const MAX_NEIGHBOUR_STEPS: usize = 8;

/// Where a keyed request goes when every replica of its slice is over the bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyedSpill {
    /// To the first replica under the bound among the following slices' (up to
    /// [`MAX_NEIGHBOUR_STEPS`] slices on), then as [`KeyedSpill::Subset`]: a slice's
    /// spilled keys land on one backend, which caches them (the default).
    #[default]
    Neighbour,
    /// Power of two choices over every connected replica: the spilled keys go everywhere.
    Subset,
}

impl KeyedLoadBound {
    /// The bound `factor` times the mean in flight plus `floor`, spilling to the
    /// neighbouring slices' replicas.
    pub fn new(factor: f64, floor: u32) -> Self {
        Self { factor, floor, spill: KeyedSpill::Neighbour }
    }

    /// Sets where requests spill.
    pub fn with_spill(mut self, spill: KeyedSpill) -> Self {
        self.spill = spill;
        self
    }

    /// Checks the values: `factor` a number in `1.0..=100.0`, `floor` at most 1,000,000.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field (`keyed_load_bound.factor`, `.floor`).
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if !(self.factor.is_finite() && (1.0..=100.0).contains(&self.factor)) {
            return Err(ConfigError::new("keyed_load_bound.factor", self.factor, "a number in 1.0..=100.0"));
        }
        super::check("keyed_load_bound.floor", self.floor, 0, 1_000_000, "0..=1000000")
    }
}

impl Default for KeyedLoadBound {
    /// `factor` 1.5 (Envoy's default), `floor` 2, spilling to the neighbouring slices.
    fn default() -> Self {
        Self::new(1.5, 2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_out_of_range_name_their_field() {
        assert!(KeyedLoadBound::default().validate().is_ok());
        assert!(KeyedLoadBound::new(1.0, 0).validate().is_ok());
        for (bound, field) in [
            (KeyedLoadBound::new(0.99, 2), "keyed_load_bound.factor"),
            (KeyedLoadBound::new(f64::NAN, 2), "keyed_load_bound.factor"),
            (KeyedLoadBound::new(f64::INFINITY, 2), "keyed_load_bound.factor"),
            (KeyedLoadBound::new(101.0, 2), "keyed_load_bound.factor"),
            (KeyedLoadBound::new(1.5, 1_000_001), "keyed_load_bound.floor"),
        ] {
            assert_eq!(bound.validate().unwrap_err().field(), field, "{bound:?}");
        }
    }
}
