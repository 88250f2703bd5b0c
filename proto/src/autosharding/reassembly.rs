//! The client's side of an assignment: chunks collected until their metadata arrives,
//! then validated by the gRFC's rules and answered with an ack.
//!
//! The rules, in order:
//! 1. The generation must be above every generation accepted before; a stale one is
//!    rejected (`accepted: false`) and dropped.
//! 2. A slice must have `start < end`, keys of at most [`MAX_SLICE_KEY_BYTES`] bytes and
//!    endpoint indices inside the endpoint list; and must not overlap a slice before it
//!    (by start). A slice that breaks a rule is dropped: its keys become a gap.
//! 3. Gaps between the remaining slices (and before the first, after the last) are filled
//!    with slices of no endpoint, so the result covers every key, sorted, contiguous.
//! 4. If no slice remains, the assignment is rejected; otherwise it is accepted, and the
//!    ack's `error_message` names what was dropped or filled (at most 512 characters).
//!
//! Before all that, the chunks are bounded as they arrive: by the memory they hold
//! decoded, by [`MAX_SLICES`] slice assignments and by [`MAX_ENDPOINTS`] endpoints. An
//! assignment past a bound is rejected at its metadata, its chunks dropped as soon as it
//! went past.

use std::fmt::Write as _;

use std::mem::size_of;

use steady_slice::MAX_SLICES;

use super::v1::{AssignmentAck, AssignmentChunk, AssignmentMetadata, EndpointState, SliceAssignment};
use super::{MAX_ACK_MESSAGE_CHARS, MAX_SLICE_KEY_BYTES};

/// The default bound on the memory the chunks of one assignment hold in a client (128
/// MiB, decoded: [`MAX_SLICES`] slices of 8-byte keys and one endpoint each fit):
/// past it, the assignment is refused instead of growing memory.
pub const DEFAULT_MAX_ASSIGNMENT_BYTES: usize = 128 * 1024 * 1024;

/// The most endpoints one assignment may list: past it, the assignment is refused.
pub const MAX_ENDPOINTS: usize = 1 << 20;

/// Which bound an assignment went past.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Overflow {
    Bytes,
    Slices,
    Endpoints,
}

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
    slices: usize,
    endpoints: usize,
    max_bytes: usize,
    max_slices: usize,
    max_endpoints: usize,
    overflowed: Option<Overflow>,
    latest: i64,
}

impl Default for Reassembly {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_ASSIGNMENT_BYTES)
    }
}

impl Reassembly {
    /// Buffers at most `max_bytes` of one assignment's chunks, counted by the memory
    /// they hold decoded ([`held_bytes`]: their vectors and strings, up to some 20 times
    /// their encoded size), and at most [`MAX_SLICES`] slice assignments and
    /// [`MAX_ENDPOINTS`] endpoints.
    pub fn new(max_bytes: usize) -> Self {
        Self {
            chunks: Vec::new(),
            bytes: 0,
            slices: 0,
            endpoints: 0,
            max_bytes,
            max_slices: MAX_SLICES,
            max_endpoints: MAX_ENDPOINTS,
            overflowed: None,
            latest: 0,
        }
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
        self.slices = 0;
        self.endpoints = 0;
        self.overflowed = None;
    }

    /// Takes `generation` as the newest accepted when it is older than the newest: the
    /// client could not use the newer ones (it could not route them) and, naming this
    /// one on its next stream, asks for the server's current assignment again.
    pub fn rewind_to(&mut self, generation: i64) {
        self.latest = self.latest.min(generation);
    }

    /// Takes one chunk. Past a bound (bytes held, slices, endpoints) the chunk is
    /// dropped with those before it, and the assignment they belong to will be rejected
    /// at its metadata.
    pub fn chunk(&mut self, chunk: AssignmentChunk) {
        if self.overflowed.is_some() {
            return;
        }
        self.bytes = self.bytes.saturating_add(held_bytes(&chunk));
        self.slices = self.slices.saturating_add(chunk.slice_assignments.len());
        self.endpoints = self.endpoints.saturating_add(chunk.endpoints.len());
        self.overflowed = if self.bytes > self.max_bytes {
            Some(Overflow::Bytes)
        } else if self.slices > self.max_slices {
            Some(Overflow::Slices)
        } else if self.endpoints > self.max_endpoints {
            Some(Overflow::Endpoints)
        } else {
            self.chunks.push(chunk);
            return;
        };
        self.chunks = Vec::new();
    }

    /// Closes the assignment the chunks since the last metadata make, validates it and
    /// says what to answer.
    pub fn finish(&mut self, metadata: AssignmentMetadata) -> Outcome {
        let generation = metadata.generation;
        let chunks = std::mem::take(&mut self.chunks);
        let overflowed = self.overflowed;
        self.restart();
        let reject = |message: String| Outcome {
            ack: AssignmentAck { generation, accepted: false, error_message: bounded(message) },
            assignment: None,
        };
        match overflowed {
            Some(Overflow::Bytes) => {
                return reject(format!(
                    "assignment larger than the client's bound of {} bytes",
                    self.max_bytes
                ))
            }
            Some(Overflow::Slices) => {
                return reject(format!(
                    "assignment of more than the client's bound of {} slices",
                    self.max_slices
                ))
            }
            Some(Overflow::Endpoints) => {
                return reject(format!(
                    "assignment of more than the client's bound of {} endpoints",
                    self.max_endpoints
                ))
            }
            None => {}
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
            if slice.start_key.len() > MAX_SLICE_KEY_BYTES
                || slice.end_key.as_ref().is_some_and(|end| end.len() > MAX_SLICE_KEY_BYTES)
            {
                problems.note("a slice key longer than 512 bytes");
                continue;
            }
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

/// The memory `chunk` holds decoded, and its indices once validated: its vectors'
/// capacities and its strings'. A slice assignment with empty keys takes a few bytes
/// encoded and some 100 here.
pub fn held_bytes(chunk: &AssignmentChunk) -> usize {
    let endpoints: usize =
        chunk.endpoints.iter().map(|e| size_of::<EndpointState>() + e.endpoint.capacity()).sum();
    let slices: usize = chunk
        .slice_assignments
        .iter()
        .map(|a| {
            let keys = a
                .slice
                .as_ref()
                .map_or(0, |s| s.start_key.capacity() + s.end_key.as_ref().map_or(0, Vec::capacity));
            size_of::<SliceAssignment>() + keys + a.endpoints.capacity() * size_of::<usize>()
        })
        .sum();
    size_of::<AssignmentChunk>() + endpoints + slices
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
        let mut r = Reassembly::new(1000);
        r.chunk(chunk(&["a"], vec![slice(b"x", Some(b"a"), &[0])]));
        let out = r.finish(AssignmentMetadata { generation: 2 });
        assert!(!out.ack.accepted);
        assert!(out.ack.error_message.contains("no usable slice"));
        let long = "n".repeat(1000);
        r.chunk(chunk(&[long.as_str()], vec![slice(b"", None, &[0])]));
        let out = r.finish(AssignmentMetadata { generation: 3 });
        assert!(!out.ack.accepted && out.ack.error_message.contains("larger than"), "{:?}", out.ack);
        // The bound held nothing back for the next one.
        r.chunk(chunk(&["a"], vec![slice(b"", None, &[0])]));
        assert!(r.finish(AssignmentMetadata { generation: 3 }).ack.accepted);
    }

    #[test]
    fn the_byte_bound_counts_what_chunks_hold_decoded_not_their_encoded_size() {
        use prost::Message;
        // 1,000 slice assignments of empty keys: some 6 bytes each encoded, 80 held.
        let many = chunk(&["a"], (0..1000).map(|_| slice(b"", None, &[0])).collect());
        assert!(many.encoded_len() < 10_000, "{}", many.encoded_len());
        assert!(held_bytes(&many) > 10 * many.encoded_len(), "{}", held_bytes(&many));
        let mut r = Reassembly::new(10_000);
        r.chunk(many);
        let out = r.finish(AssignmentMetadata { generation: 1 });
        assert!(!out.ack.accepted && out.ack.error_message.contains("10000 bytes"), "{:?}", out.ack);
        // A typical slice (8-byte keys, one endpoint) holds about 100 bytes: the default
        // bound takes the most slices an assignment may have.
        let typical = chunk(&[], vec![slice(&[1; 8], Some(&[2; 8]), &[0])]);
        let per_slice = held_bytes(&typical) - held_bytes(&chunk(&[], vec![]));
        assert!(per_slice * MAX_SLICES < DEFAULT_MAX_ASSIGNMENT_BYTES, "{per_slice}");
    }

    #[test]
    fn more_slices_or_endpoints_than_the_bounds_are_refused_at_the_metadata() {
        let mut r = Reassembly { max_slices: 3, max_endpoints: 2, ..Reassembly::default() };
        r.chunk(chunk(&["a"], vec![slice(b"", Some(b"b"), &[0]), slice(b"b", Some(b"c"), &[0])]));
        r.chunk(chunk(&["b"], vec![slice(b"c", Some(b"d"), &[0]), slice(b"d", None, &[0])]));
        let out = r.finish(AssignmentMetadata { generation: 1 });
        assert!(!out.ack.accepted && out.ack.error_message.contains("3 slices"), "{:?}", out.ack);
        r.chunk(chunk(&["a", "b"], vec![slice(b"", None, &[0])]));
        r.chunk(chunk(&["c"], vec![]));
        let out = r.finish(AssignmentMetadata { generation: 1 });
        assert!(!out.ack.accepted && out.ack.error_message.contains("2 endpoints"), "{:?}", out.ack);
        // At the bounds, taken.
        r.chunk(chunk(&["a", "b"], vec![slice(b"", Some(b"b"), &[0]), slice(b"b", None, &[1])]));
        assert!(r.finish(AssignmentMetadata { generation: 1 }).ack.accepted);
        assert_eq!((MAX_SLICES, MAX_ENDPOINTS), (1 << 20, 1 << 20));
        let defaults = Reassembly::default();
        assert_eq!((defaults.max_slices, defaults.max_endpoints), (MAX_SLICES, MAX_ENDPOINTS));
    }

    #[test]
    fn a_slice_with_a_key_longer_than_512_bytes_becomes_a_gap() {
        let long = [7u8; 513];
        let mut r = Reassembly::default();
        r.chunk(chunk(
            &["a"],
            vec![slice(b"", Some(&long), &[0]), slice(&long, Some(&[8]), &[0]), slice(&[8], None, &[0])],
        ));
        let out = r.finish(AssignmentMetadata { generation: 1 });
        assert!(out.ack.accepted);
        assert!(out.ack.error_message.contains("longer than 512 bytes (x2)"), "{}", out.ack.error_message);
        let got = out.assignment.unwrap();
        assert_eq!(got.slices.len(), 2, "{:?}", got.slices);
        assert_eq!(got.slices[0], ReceivedSlice { start: vec![], end: Some(vec![8]), endpoints: vec![] });
        let at_bound = [7u8; 512];
        r.chunk(chunk(&["a"], vec![slice(b"", Some(&at_bound), &[0]), slice(&at_bound, None, &[0])]));
        assert_eq!(r.finish(AssignmentMetadata { generation: 2 }).ack.error_message, "");
    }

    #[test]
    fn rewinding_asks_for_a_generation_again() {
        let mut r = Reassembly::default();
        r.chunk(chunk(&["a"], vec![slice(b"", None, &[0])]));
        assert!(r.finish(AssignmentMetadata { generation: 5 }).ack.accepted);
        r.rewind_to(3);
        assert_eq!(r.latest_generation(), 3);
        r.rewind_to(4);
        assert_eq!(r.latest_generation(), 3, "never forward");
        r.chunk(chunk(&["a"], vec![slice(b"", None, &[0])]));
        assert!(r.finish(AssignmentMetadata { generation: 5 }).ack.accepted, "taken again");
    }

    #[test]
    fn an_ack_message_is_at_most_512_characters() {
        assert_eq!(bounded("é".repeat(600)).chars().count(), 512);
        assert_eq!(bounded("short".to_owned()), "short");
    }
}
