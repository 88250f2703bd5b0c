//! Between [`Assignment`] and its protobuf message, as `From`/`TryFrom` impls.

use steady_slice::{Assignment, AssignmentError, Slice, SliceKey};

use crate::assignment as proto;

impl From<&Assignment> for proto::AssignmentUpdate {
    fn from(a: &Assignment) -> Self {
        proto::AssignmentUpdate {
            generation: a.generation(),
            slices: a
                .slices()
                .iter()
                .map(|s| proto::Slice { start: s.start.get(), replicas: s.replicas.clone() })
                .collect(),
        }
    }
}

/// Validates a received message: the [`AssignmentError`] of the first problem (see
/// [`Assignment::new`]), or the assignment.
impl TryFrom<proto::AssignmentUpdate> for Assignment {
    type Error = AssignmentError;

    fn try_from(m: proto::AssignmentUpdate) -> Result<Self, AssignmentError> {
        Assignment::new(
            m.generation,
            m.slices.into_iter().map(|s| Slice { start: SliceKey(s.start), replicas: s.replicas }).collect(),
        )
    }
}

/// The protobuf message of an assignment.
#[deprecated(since = "0.1.0", note = "use `proto::AssignmentUpdate::from(&assignment)`")]
pub fn to_proto(a: &Assignment) -> proto::AssignmentUpdate {
    a.into()
}

/// Validates a received message.
///
/// # Errors
///
/// The [`AssignmentError`] of the first problem (see [`Assignment::new`]).
#[deprecated(since = "0.1.0", note = "use `Assignment::try_from(message)`")]
pub fn from_proto(m: proto::AssignmentUpdate) -> Result<Assignment, AssignmentError> {
    m.try_into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_assignment_survives_the_round_trip_and_an_invalid_message_is_named() {
        let a = Assignment::new(
            4,
            vec![
                Slice { start: SliceKey(0), replicas: vec![2, 1] },
                Slice { start: SliceKey(9), replicas: vec![3] },
            ],
        )
        .unwrap();
        let message = proto::AssignmentUpdate::from(&a);
        assert_eq!(Assignment::try_from(message), Ok(a));
        let empty = proto::AssignmentUpdate { generation: 1, slices: vec![] };
        assert_eq!(Assignment::try_from(empty), Err(AssignmentError::NoSlices));
    }
}
