//! A received A119 assignment as steady's [`Assignment`], by steady's stricter rule:
//! every key routed to at least one task.

use std::fmt;
use std::sync::Arc;

use steady_slice::{Assignment, AssignmentError, Slice, SliceKey};

use super::super::keys::slice_key_at;
use super::super::reassembly::Received;

/// How a client maps an A119 endpoint name to one of its task indices (`None`: a name it
/// does not know). Called once per endpoint of each assignment, never per request.
pub type EndpointNames = Arc<dyn Fn(&str) -> Option<u32> + Send + Sync>;

/// The default [`EndpointNames`]: a name that is a task index in decimal (`"7"`), and
/// nothing else (no sign, no spaces, no leading `+`).
pub fn decimal_index(name: &str) -> Option<u32> {
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    name.parse().ok()
}

/// Why a received assignment, valid by the protocol's rules, is not one steady can route
/// by. The client rejects it (its ack says `accepted: false` with this as the message)
/// and keeps the assignment in force.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Unroutable {
    /// Keys that no endpoint serves: a gap the client filled, or a slice the server
    /// assigned to no endpoint. A119 lets a client fail the requests to such keys; steady
    /// routes every key to a task, so it takes no such assignment.
    NoEndpoint {
        /// Where the keys start.
        start: SliceKey,
    },
    /// Keys whose every endpoint is a name this client cannot map to a task.
    UnknownEndpoints {
        /// Where the keys start.
        start: SliceKey,
        /// The first of those names (at most 64 characters of it).
        name: String,
    },
    /// The generation is not a positive number.
    Generation(i64),
    /// The slices make no valid steady assignment (too many slices or replicas, a task
    /// index above the largest).
    Invalid(AssignmentError),
}

impl fmt::Display for Unroutable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoEndpoint { start } => write!(
                f,
                "keys from {start} have no endpoint (a gap or an empty slice): this client routes every key"
            ),
            Self::UnknownEndpoints { start, name } => {
                write!(f, "keys from {start} have only endpoints this client does not know (\"{name}\")")
            }
            Self::Generation(generation) => write!(f, "generation {generation} is not positive"),
            Self::Invalid(error) => write!(f, "not a valid assignment for this client: {error}"),
        }
    }
}

impl std::error::Error for Unroutable {}

/// `received` as steady's assignment: each slice starts at its start key's place in
/// steady's key space ([`slice_key_at`]), and is served by the tasks its endpoints'
/// names map to by `names` (in the slice's order, repeats left out).
///
/// A slice that holds no 8-byte key (between two byte strings with no 8-byte key
/// between them, such as `"ab"` and `"ab\0"`) is left out: it routes nothing.
///
/// # Errors
///
/// [`Unroutable`]: a slice of keys left with no task, or what [`Assignment::new`]
/// refuses.
pub fn to_assignment(
    received: &Received,
    names: &dyn Fn(&str) -> Option<u32>,
) -> Result<Assignment, Unroutable> {
    let generation = u64::try_from(received.generation)
        .ok()
        .filter(|&g| g > 0)
        .ok_or(Unroutable::Generation(received.generation))?;
    let mut slices: Vec<Slice> = Vec::with_capacity(received.slices.len());
    let mut tasks: Vec<u32> = Vec::new();
    for slice in &received.slices {
        let Some(start) = slice_key_at(&slice.start) else { continue };
        let end = slice.end.as_ref().map(|end| slice_key_at(end));
        if matches!(end, Some(Some(end)) if end <= start) {
            continue;
        }
        tasks.clear();
        let mut unknown: Option<&str> = None;
        for &index in &slice.endpoints {
            let name = received.endpoints[index].as_str();
            match names(name) {
                Some(task) if !tasks.contains(&task) => tasks.push(task),
                Some(_) => {}
                None => unknown = unknown.or(Some(name)),
            }
        }
        if tasks.is_empty() {
            return Err(match unknown {
                Some(name) => Unroutable::UnknownEndpoints { start, name: name.chars().take(64).collect() },
                None => Unroutable::NoEndpoint { start },
            });
        }
        slices.push(Slice::new(start, &tasks));
    }
    Assignment::new(generation, slices).map_err(Unroutable::Invalid)
}

#[cfg(test)]
mod tests {
    use super::super::super::keys::key_bytes;
    use super::super::super::reassembly::ReceivedSlice;
    use super::*;

    /// A slice as `(start, end, endpoint indices)`.
    type Triple = (Vec<u8>, Option<Vec<u8>>, Vec<usize>);

    fn received(slices: Vec<Triple>, endpoints: &[&str]) -> Received {
        Received {
            generation: 7,
            slices: slices
                .into_iter()
                .map(|(start, end, endpoints)| ReceivedSlice { start, end, endpoints })
                .collect(),
            endpoints: endpoints.iter().map(|e| (*e).to_owned()).collect(),
        }
    }

    fn at(key: u64) -> Vec<u8> {
        key_bytes(SliceKey(key)).to_vec()
    }

    #[test]
    fn slices_start_where_their_keys_fall_and_names_become_tasks() {
        let r = received(
            vec![
                (vec![], Some(at(1 << 62)), vec![1, 0, 1]),
                (at(1 << 62), Some(vec![0x80]), vec![2]),
                (vec![0x80], None, vec![0]),
            ],
            &["4", "9", "12"],
        );
        let a = to_assignment(&r, &decimal_index).unwrap();
        assert_eq!(a.generation(), 7);
        let got: Vec<(SliceKey, Vec<u32>)> =
            a.slices().iter().map(|s| (s.start, s.replicas().to_vec())).collect();
        assert_eq!(
            got,
            [(SliceKey(0), vec![9, 4]), (SliceKey(1 << 62), vec![12]), (SliceKey(1 << 63), vec![4])],
            "repeats left out, order kept"
        );
    }

    #[test]
    fn a_slice_holding_no_eight_byte_key_routes_nothing_and_is_left_out() {
        let r = received(
            vec![
                (vec![], Some(b"ab".to_vec()), vec![0]),
                (b"ab".to_vec(), Some(b"ab\0".to_vec()), vec![]),
                (b"ab\0".to_vec(), None, vec![1]),
            ],
            &["0", "1"],
        );
        let a = to_assignment(&r, &decimal_index).unwrap();
        assert_eq!(a.slices().len(), 2);
        assert_eq!(a.slices()[1].start, slice_key_at(b"ab").unwrap());
        assert_eq!(a.slices()[1].replicas(), [1]);
    }

    #[test]
    fn keys_left_without_a_task_make_the_assignment_unroutable() {
        let gap = received(vec![(vec![], Some(vec![0x80]), vec![0]), (vec![0x80], None, vec![])], &["3"]);
        assert_eq!(
            to_assignment(&gap, &decimal_index),
            Err(Unroutable::NoEndpoint { start: SliceKey(1 << 63) })
        );
        let unknown = received(vec![(vec![], None, vec![0, 1])], &["backend-a", "x"]);
        let error = to_assignment(&unknown, &decimal_index).unwrap_err();
        assert_eq!(error, Unroutable::UnknownEndpoints { start: SliceKey(0), name: "backend-a".to_owned() });
        assert!(error.to_string().contains("does not know (\"backend-a\")"), "{error}");
        let mixed = received(vec![(vec![], None, vec![0, 1])], &["backend-a", "5"]);
        assert_eq!(
            to_assignment(&mixed, &decimal_index).unwrap().slices()[0].replicas(),
            [5],
            "a known name suffices"
        );
        let too_large = received(vec![(vec![], None, vec![0])], &["99999999"]);
        assert!(matches!(to_assignment(&too_large, &decimal_index), Err(Unroutable::Invalid(_))));
    }

    #[test]
    fn only_plain_decimal_names_are_indices() {
        assert_eq!(decimal_index("0"), Some(0));
        assert_eq!(decimal_index("42"), Some(42));
        for name in ["", "+1", "-1", " 1", "1.0", "0x1", "4294967296", "127.0.0.1:80"] {
            assert_eq!(decimal_index(name), None, "{name:?}");
        }
    }
}
