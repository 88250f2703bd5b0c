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
                .map(|s| proto::Slice {
                    start: s.start.get(),
                    replicas: s.replicas().to_vec(),
                    warming: s.warming().to_vec(),
                })
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
            m.slices
                .into_iter()
                .map(|s| Slice::new(SliceKey(s.start), s.replicas).with_warming(s.warming))
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_assignment_survives_the_round_trip_and_an_invalid_message_is_named() {
        let a = Assignment::new(
            4,
            vec![Slice::new(SliceKey(0), vec![2, 1]).with_warming([4]), Slice::new(SliceKey(9), vec![3])],
        )
        .unwrap();
        let message = proto::AssignmentUpdate::from(&a);
        assert_eq!(Assignment::try_from(message), Ok(a));
        let empty = proto::AssignmentUpdate { generation: 1, slices: vec![] };
        assert_eq!(Assignment::try_from(empty), Err(AssignmentError::NoSlices));
    }

    /// The protobuf bytes are a frozen contract too: field 3 (`warming`) is new, and a
    /// slice without warming tasks encodes as it did before it existed.
    #[test]
    fn the_protobuf_encoding_is_frozen() {
        use prost::Message;
        let hex = |a: &Assignment| -> String {
            proto::AssignmentUpdate::from(a).encode_to_vec().iter().map(|b| format!("{b:02x}")).collect()
        };
        let plain =
            Assignment::new(4, vec![Slice::new(SliceKey(0), vec![2, 1]), Slice::new(SliceKey(9), vec![3])])
                .unwrap();
        assert_eq!(hex(&plain), "08041204 12020201 120c 090900000000000000 120103".replace(' ', ""));
        let warming = Assignment::new(4, vec![Slice::new(SliceKey(0), vec![2]).with_warming([5])]).unwrap();
        assert_eq!(hex(&warming), "08041206 120102 1a0105".replace(' ', ""));
    }
}
