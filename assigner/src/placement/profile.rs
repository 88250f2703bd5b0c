//! [`TaskProfile`]: where a task sits (its failure domains) and how much load it takes.

use crate::error::AssignError;

/// The longest domain label (a zone or a rack), in bytes: as `steady-core`'s zones, so a
/// label fits a DNS name, a registry record and a metric label alike.
pub const MAX_DOMAIN_LEN: usize = 63;

/// A task's failure domains and capacity, as a [`crate::Placement`] needs them.
///
/// * `zone`, `rack`: the failure domains the task sits in (labels of 1 to
///   [`MAX_DOMAIN_LEN`] bytes of `[A-Za-z0-9._-]`); `None` is one shared *unlabelled*
///   domain, so tasks without a zone never count as spread over zones.
/// * `capacity`: the task's share of load relative to others (a task with capacity 2 takes
///   twice the load of one with capacity 1); finite and above zero. Every assigner that
///   balances load balances load over capacity, and imbalance is the busiest task's
///   load over capacity against the job's total load over total capacity.
///
/// A rack is within its zone: rack `r1` of zone `a` and rack `r1` of zone `b` are two
/// racks, and a task with no rack label is in its zone's one unlabelled rack.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskProfile {
    /// The task's zone, if known.
    pub zone: Option<String>,
    /// The task's rack, if known.
    pub rack: Option<String>,
    /// The load the task takes relative to others (default 1).
    pub capacity: f64,
}

impl Default for TaskProfile {
    /// No zone, no rack, capacity 1: what every task is unless told otherwise.
    fn default() -> Self {
        Self { zone: None, rack: None, capacity: 1.0 }
    }
}

impl TaskProfile {
    /// A task in `zone`, no rack, capacity 1.
    pub fn in_zone(zone: impl Into<String>) -> Self {
        Self { zone: Some(zone.into()), ..Self::default() }
    }

    /// With `rack`.
    pub fn rack(mut self, rack: impl Into<String>) -> Self {
        self.rack = Some(rack.into());
        self
    }

    /// With `capacity`.
    pub fn capacity(mut self, capacity: f64) -> Self {
        self.capacity = capacity;
        self
    }

    /// Checks the labels and the capacity of task `task`'s profile.
    ///
    /// # Errors
    ///
    /// [`AssignError::BadProfile`] naming the field.
    pub fn validate(&self, task: u32) -> Result<(), AssignError> {
        let bad = |field| AssignError::BadProfile { task, field };
        if !(self.capacity.is_finite() && self.capacity > 0.0) {
            return Err(bad("capacity"));
        }
        if self.zone.as_deref().is_some_and(|z| !valid_label(z)) {
            return Err(bad("zone"));
        }
        if self.rack.as_deref().is_some_and(|r| !valid_label(r)) {
            return Err(bad("rack"));
        }
        Ok(())
    }
}

/// Whether `label` is a valid zone or rack label.
pub(crate) fn valid_label(label: &str) -> bool {
    (1..=MAX_DOMAIN_LEN).contains(&label.len())
        && label.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_are_validated_by_field() {
        assert!(TaskProfile::default().validate(0).is_ok());
        assert!(TaskProfile::in_zone("us-east1-b").rack("r.12_a").capacity(2.5).validate(0).is_ok());
        let field = |p: TaskProfile| match p.validate(7) {
            Err(AssignError::BadProfile { task: 7, field }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(field(TaskProfile::default().capacity(0.0)), "capacity");
        assert_eq!(field(TaskProfile::default().capacity(f64::NAN)), "capacity");
        assert_eq!(field(TaskProfile::default().capacity(-1.0)), "capacity");
        assert_eq!(field(TaskProfile::in_zone("")), "zone");
        assert_eq!(field(TaskProfile::in_zone("a b")), "zone");
        assert_eq!(field(TaskProfile::in_zone("z".repeat(64))), "zone");
        assert_eq!(field(TaskProfile::default().rack("r/1")), "rack");
    }
}
