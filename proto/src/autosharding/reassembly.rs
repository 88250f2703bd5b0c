//! The client's side of an assignment: chunks collected until their metadata arrives,
//! then validated by the gRFC's rules and answered with an ack.
//!
//! The rules, in order:
//! 1. The generation must be above every generation accepted before; a stale one is
//!    rejected (`accepted: false`) and dropped.
//! 2. A slice must have `start < end` and endpoint indices inside the endpoint list; and
//!    must not overlap a slice before it (by start). A slice that breaks a rule is
//!    dropped: its keys become a gap.
//! 3. Gaps between the remaining slices (and before the first, after the last) are filled
//!    with slices of no endpoint, so the result covers every key, sorted, contiguous.
//! 4. If no slice remains, the assignment is rejected; otherwise it is accepted, and the
//!    ack's `error_message` names what was dropped or filled (at most 512 characters).

use std::fmt::Write as _;

use super::v1::{AssignmentAck, AssignmentChunk, AssignmentMetadata};
use super::MAX_ACK_MESSAGE_CHARS;

/// The default bound on the chunks of one assignment a client buffers (64 MiB of encoded
/// messages): past it, the assignment is refused instead of growing memory.
pub const DEFAULT_MAX_ASSIGNMENT_BYTES: usize = 64 * 1024 * 1024;

/// A validated assignment: slices covering every key, sorted, each ending where the next
/// starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// Its generation.
    pub generation: i64,
    /// The slices, from the empty key to the open end.
    pub slices: Vec<ReceivedSlice>,
    /// The whole endpoint list (the slices index into it).
    pub endpoints: Vec<String>,
}

/// One slice of a [`Received`] assignment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedSlice {
    /// Its first key (inclusive).
    pub start: Vec<u8>,
    /// Its end (exclusive); `None`: through the largest key.
    pub end: Option<Vec<u8>>,
    /// Its endpoints, as indices into [`Received::endpoints`]; empty for a gap the client
    /// filled or a slice the server gave no endpoint.
    pub endpoints: Vec<usize>,
}

/// What a client does with an assignment's metadata: send `ack`, and use `assignment`
/// when there is one.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The ack to send.
    pub ack: AssignmentAck,
    /// The accepted assignment (`None`: rejected; the previous one stays).
    pub assignment: Option<Received>,
}

/// A client's chunks of the assignment being received, and the newest generation it
/// accepted.
#[derive(Debug, Clone)]
pub struct Reassembly {
    chunks: Vec<AssignmentChunk>,
    bytes: usize,
    max_bytes: usize,
    overflowed: bool,
    latest: i64,
}

impl Default for Reassembly {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_ASSIGNMENT_BYTES)
    }
}

impl Reassembly {
    /// Buffers at most `max_bytes` of one assignment's chunks (by encoded size).
    pub fn new(max_bytes: usize) -> Self {
        Self { chunks: Vec::new(), bytes: 0, max_bytes, overflowed: false, latest: 0 }
    }

    /// The newest generation accepted (0: none): what a reconnecting client sends as its
    /// `latest_generation`.
    pub fn latest_generation(&self) -> i64 {
        self.latest
    }

    /// Forgets the chunks of an assignment not yet closed (a stream ended mid-way: the
    /// next stream sends whole assignments again). The newest generation is kept.
    pub fn restart(&mut self) {
        self.chunks.clear();
        self.bytes = 0;
        self.overflowed = false;
    }

    /// Takes one chunk. Past the byte bound the chunk is dropped and the assignment it
    /// belongs to will be rejected at its metadata.
    pub fn chunk(&mut self, chunk: AssignmentChunk) {
        use prost::Message;
        let len = chunk.encoded_len();
        if self.overflowed || self.bytes + len > self.max_bytes {
            self.overflowed = true;
            self.chunks.clear();
            return;
        }
        self.bytes += len;
        self.chunks.push(chunk);
    }

    /// Closes the assignment the chunks since the last metadata make, validates it and
    /// says what to answer.
    pub fn finish(&mut self, metadata: AssignmentMetadata) -> Outcome {
        let generation = metadata.generation;
        let chunks = std::mem::take(&mut self.chunks);
        let overflowed = std::mem::replace(&mut self.overflowed, false);
        self.bytes = 0;
        let reject = |message: String| Outcome {
            ack: AssignmentAck { generation, accepted: false, error_message: bounded(message) },
            assignment: None,
        };
        if overflowed {
            return reject(format!("assignment larger than the client's bound of {} bytes", self.max_bytes));
        }
        if generation <= self.latest {
            return reject(format!("stale generation {generation}: already accepted {}", self.latest));
        }
        let endpoints: Vec<String> =
            chunks.iter().flat_map(|c| c.endpoints.iter().map(|e| e.endpoint.clone())).collect();
        let mut problems = Problems::default();
        let mut slices: Vec<ReceivedSlice> = Vec::new();
        for assigned in chunks.into_iter().flat_map(|c| c.slice_assignments) {
            let Some(slice) = assigned.slice else {
                problems.note("a slice assignment without a slice");
                continue;
            };
            if slice.end_key.as_ref().is_some_and(|end| *end <= slice.start_key) {
                problems.note("a slice whose end is not after its start");
                continue;
            }
            let indices: Option<Vec<usize>> = assigned
                .endpoints
                .iter()
                .map(|e| usize::try_from(e.endpoint_index).ok().filter(|&i| i < endpoints.len()))
                .collect();
            let Some(indices) = indices else {
                problems.note("an endpoint index outside the endpoint list");
                continue;
            };
            slices.push(ReceivedSlice { start: slice.start_key, end: slice.end_key, endpoints: indices });
        }
        // Sorted by start (stable: of two slices with one start, the first sent wins).
        slices.sort_by(|a, b| a.start.cmp(&b.start));
        let mut kept: Vec<ReceivedSlice> = Vec::with_capacity(slices.len() + 2);
        for slice in slices {
            let overlaps = kept.last().is_some_and(|last| match &last.end {
                None => true,
                Some(end) => slice.start < *end,
            });
            if overlaps {
                problems.note("a slice overlapping another");
                continue;
            }
            kept.push(slice);
        }
        if kept.is_empty() {
            problems.note("no usable slice");
            return reject(problems.message());
        }
        let filled = fill_gaps(kept, &mut problems);
        self.latest = generation;
        Outcome {
            ack: AssignmentAck { generation, accepted: true, error_message: problems.message() },
            assignment: Some(Received { generation, slices: filled, endpoints }),
        }
    }
}

/// `slices` (sorted, not overlapping) with every gap filled by a slice of no endpoint.
fn fill_gaps(slices: Vec<ReceivedSlice>, problems: &mut Problems) -> Vec<ReceivedSlice> {
    let mut out: Vec<ReceivedSlice> = Vec::with_capacity(slices.len() + 2);
    let mut covered_to: Option<Vec<u8>> = Some(Vec::new());
    for slice in slices {
        let Some(from) = covered_to else { break };
        if slice.start > from {
            problems.note("a gap between slices, filled with no endpoint");
            out.push(ReceivedSlice { start: from, end: Some(slice.start.clone()), endpoints: Vec::new() });
        }
        covered_to = slice.end.clone();
        out.push(slice);
    }
    if let Some(from) = covered_to {
        problems.note("a gap between slices, filled with no endpoint");
        out.push(ReceivedSlice { start: from, end: None, endpoints: Vec::new() });
    }
    out
}

/// The problems found, each kind counted once in the message.
#[derive(Debug, Default)]
struct Problems {
    kinds: Vec<(&'static str, usize)>,
}

impl Problems {
    fn note(&mut self, kind: &'static str) {
        match self.kinds.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, n)) => *n += 1,
            None => self.kinds.push((kind, 1)),
        }
    }

    fn message(&self) -> String {
        let mut out = String::new();
        for (i, (kind, n)) in self.kinds.iter().enumerate() {
            let _ = write!(out, "{}{kind} (x{n})", if i > 0 { "; " } else { "" });
        }
        bounded(out)
    }
}

/// `message` cut to the protocol's 512 characters.
pub fn bounded(message: String) -> String {
    if message.chars().count() <= MAX_ACK_MESSAGE_CHARS {
        return message;
    }
    message.chars().take(MAX_ACK_MESSAGE_CHARS).collect()
}

#[cfg(test)]
mod tests {
    use super::super::v1::{EndpointState, PerSliceEndpointState, Slice, SliceAssignment};
    use super::*;

    /// A slice as `(start, end, endpoint indices)`.
    type Triple = (Vec<u8>, Option<Vec<u8>>, Vec<usize>);

    fn slice(start: &[u8], end: Option<&[u8]>, endpoints: &[i32]) -> SliceAssignment {
        SliceAssignment {
            slice: Some(Slice { start_key: start.to_vec(), end_key: end.map(<[u8]>::to_vec) }),
            endpoints: endpoints.iter().map(|&i| PerSliceEndpointState { endpoint_index: i }).collect(),
        }
    }

    fn chunk(names: &[&str], slices: Vec<SliceAssignment>) -> AssignmentChunk {
        AssignmentChunk {
            endpoints: names.iter().map(|n| EndpointState { endpoint: (*n).to_owned() }).collect(),
            slice_assignments: slices,
        }
    }

    #[test]
    fn chunks_combine_endpoints_in_order_and_slices_in_any_order() {
        let mut r = Reassembly::default();
        r.chunk(chunk(&["a", "b"], vec![slice(b"m", None, &[2])]));
        r.chunk(chunk(&["c"], vec![slice(b"", Some(b"m"), &[0, 1])]));
        let out = r.finish(AssignmentMetadata { generation: 4 });
        assert_eq!(out.ack, AssignmentAck { generation: 4, accepted: true, error_message: String::new() });
        let got = out.assignment.unwrap();
        assert_eq!(got.endpoints, ["a", "b", "c"]);
        assert_eq!(
            got.slices,
            [
                ReceivedSlice { start: vec![], end: Some(b"m".to_vec()), endpoints: vec![0, 1] },
                ReceivedSlice { start: b"m".to_vec(), end: None, endpoints: vec![2] },
            ]
        );
        assert_eq!(r.latest_generation(), 4);
    }

    #[test]
    fn a_stale_generation_is_rejected_and_the_latest_stays() {
        let mut r = Reassembly::default();
        r.chunk(chunk(&["a"], vec![slice(b"", None, &[0])]));
        assert!(r.finish(AssignmentMetadata { generation: 5 }).ack.accepted);
        r.chunk(chunk(&["a"], vec![slice(b"", None, &[0])]));
        let out = r.finish(AssignmentMetadata { generation: 5 });
        assert!(!out.ack.accepted && out.assignment.is_none());
        assert!(out.ack.error_message.contains("stale generation 5"), "{}", out.ack.error_message);
        assert_eq!(r.latest_generation(), 5);
    }

    #[test]
    fn invalid_slices_become_gaps_and_gaps_are_filled_with_no_endpoint() {
        let mut r = Reassembly::default();
        r.chunk(chunk(
            &["a", "b"],
            vec![
                slice(b"b", Some(b"d"), &[0]),
                slice(b"c", Some(b"e"), &[1]), // overlaps the one before
                slice(b"f", Some(b"f"), &[1]), // empty
                slice(b"g", Some(b"h"), &[9]), // index outside the list
                slice(b"h", Some(b"k"), &[1]),
            ],
        ));
        let out = r.finish(AssignmentMetadata { generation: 1 });
        assert!(out.ack.accepted);
        for kind in ["overlapping", "end is not after", "outside the endpoint list", "gap"] {
            assert!(out.ack.error_message.contains(kind), "{kind}: {}", out.ack.error_message);
        }
        let ranges: Vec<Triple> =
            out.assignment.unwrap().slices.into_iter().map(|s| (s.start, s.end, s.endpoints)).collect();
        assert_eq!(
            ranges,
            [
                (b"".to_vec(), Some(b"b".to_vec()), vec![]),
                (b"b".to_vec(), Some(b"d".to_vec()), vec![0]),
                (b"d".to_vec(), Some(b"h".to_vec()), vec![]),
                (b"h".to_vec(), Some(b"k".to_vec()), vec![1]),
                (b"k".to_vec(), None, vec![]),
            ]
        );
    }

    #[test]
    fn no_usable_slice_and_an_overlong_assignment_are_rejected() {
        let mut r = Reassembly::new(200);
        r.chunk(chunk(&["a"], vec![slice(b"x", Some(b"a"), &[0])]));
        let out = r.finish(AssignmentMetadata { generation: 2 });
        assert!(!out.ack.accepted);
        assert!(out.ack.error_message.contains("no usable slice"));
        let long = "n".repeat(300);
        r.chunk(chunk(&[long.as_str()], vec![slice(b"", None, &[0])]));
        let out = r.finish(AssignmentMetadata { generation: 3 });
        assert!(!out.ack.accepted && out.ack.error_message.contains("larger than"), "{:?}", out.ack);
        // The bound held nothing back for the next one.
        r.chunk(chunk(&["a"], vec![slice(b"", None, &[0])]));
        assert!(r.finish(AssignmentMetadata { generation: 3 }).ack.accepted);
    }

    #[test]
    fn an_ack_message_is_at_most_512_characters() {
        assert_eq!(bounded("é".repeat(600)).chars().count(), 512);
        assert_eq!(bounded("short".to_owned()), "short");
    }
}
