//! Between [`Assignment`] and its protobuf message.

use steady_balance::{Assignment, AssignmentError, Slice, SliceKey};

use crate::proto;

/// The protobuf message of an assignment.
pub fn to_proto(a: &Assignment) -> proto::AssignmentUpdate {
    proto::AssignmentUpdate {
        generation: a.generation(),
        slices: a
            .slices()
            .iter()
            .map(|s| proto::Slice { start: s.start.get(), replicas: s.replicas.clone() })
            .collect(),
    }
}

/// Validates a received message.
///
/// # Errors
///
/// The [`AssignmentError`] of the first problem (see [`Assignment::new`]).
pub fn from_proto(m: proto::AssignmentUpdate) -> Result<Assignment, AssignmentError> {
    Assignment::new(
        m.generation,
        m.slices.into_iter().map(|s| Slice { start: SliceKey(s.start), replicas: s.replicas }).collect(),
    )
}
