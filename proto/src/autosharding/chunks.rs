//! The server's side of an assignment: an [`Assignment`] as A119 responses, chunks of
//! bounded size closed by the assignment's metadata.

use std::collections::BTreeMap;

use prost::bytes::Bytes;
use prost::Message;
use steady_slice::Assignment;

use super::keys::{key_bytes, start_bytes};
use super::v1::{
    AssignmentChunk, AssignmentMetadata, EndpointState, PerSliceEndpointState, Slice, SliceAssignment,
    WatchShardingAssignmentResponse,
};

/// The default bound on one chunk's encoded size (64 KiB): far below every gRPC
/// implementation's default message limit (4 MiB), so a client never refuses one.
pub const DEFAULT_MAX_CHUNK_BYTES: usize = 64 * 1024;

/// The smallest chunk bound [`responses`] takes: room for one slice with its largest
/// replica set, or one long endpoint name.
pub const MIN_MAX_CHUNK_BYTES: usize = 8 * 1024;

/// An assignment as the messages a server sends for it: one or more chunks (each at most
/// `max_chunk_bytes` encoded, though never less than [`MIN_MAX_CHUNK_BYTES`]), then the
/// metadata with its generation.
///
/// The endpoint list names every task that serves at least one slice (warming tasks are
/// not sent: clients send them nothing), in ascending task order, each named by `name`;
/// it comes first, in as many chunks as it needs, and the slices follow. Slice `i`
/// covers `[start_i, start_{i+1})` as 8-byte big-endian keys, the first one from the
/// empty key and the last one open-ended (see [`keys`](super::keys)).
///
/// A generation above `i64::MAX` (never reached: one a millisecond lasts 292 million
/// years) is sent as `i64::MAX`.
pub fn responses(
    assignment: &Assignment,
    mut name: impl FnMut(u32) -> String,
    max_chunk_bytes: usize,
) -> Vec<WatchShardingAssignmentResponse> {
    let slices = assignment.slices();
    let mut index: BTreeMap<u32, i32> = BTreeMap::new();
    for slice in slices {
        for &task in slice.replicas() {
            index.insert(task, 0);
        }
    }
    for (i, position) in index.values_mut().enumerate() {
        *position = i32::try_from(i).expect("at most 2^24 tasks");
    }
    let mut chunks = Chunks::new(max_chunk_bytes);
    for &task in index.keys() {
        let endpoint = EndpointState { endpoint: name(task) };
        chunks.make_room(endpoint.encoded_len());
        chunks.current.endpoints.push(endpoint);
    }
    for (i, slice) in slices.iter().enumerate() {
        let end = slices.get(i + 1).map(|next| key_bytes(next.start).to_vec());
        let assigned = SliceAssignment {
            slice: Some(Slice { start_key: start_bytes(slice.start), end_key: end }),
            endpoints: slice
                .replicas()
                .iter()
                .map(|task| PerSliceEndpointState { endpoint_index: index[task] })
                .collect(),
        };
        chunks.make_room(assigned.encoded_len());
        chunks.current.slice_assignments.push(assigned);
    }
    let mut out = chunks.finish();
    let generation = i64::try_from(assignment.generation()).unwrap_or(i64::MAX);
    out.push(WatchShardingAssignmentResponse {
        metadata: Some(AssignmentMetadata { generation }),
        ..Default::default()
    });
    out
}

/// [`responses`], each message encoded: what a server sends every client as it is.
pub fn encoded_responses(
    assignment: &Assignment,
    name: impl FnMut(u32) -> String,
    max_chunk_bytes: usize,
) -> Vec<Bytes> {
    responses(assignment, name, max_chunk_bytes).iter().map(|r| Bytes::from(r.encode_to_vec())).collect()
}

/// Chunks being filled, each closed when the next entry would take it past the bound.
struct Chunks {
    max: usize,
    done: Vec<WatchShardingAssignmentResponse>,
    current: AssignmentChunk,
    size: usize,
}

impl Chunks {
    fn new(max_chunk_bytes: usize) -> Self {
        let max = max_chunk_bytes.max(MIN_MAX_CHUNK_BYTES);
        Self { max, done: Vec::new(), current: AssignmentChunk::default(), size: 0 }
    }

    /// Makes room in the current chunk for an entry of `len` encoded bytes (plus its tag
    /// and length, and the chunk's own framing in the response).
    fn make_room(&mut self, len: usize) {
        let added = len + 6;
        if self.size + added + 6 > self.max && self.size > 0 {
            let full = std::mem::take(&mut self.current);
            self.done.push(WatchShardingAssignmentResponse { chunk: Some(full), ..Default::default() });
            self.size = 0;
        }
        self.size += added;
    }

    fn finish(mut self) -> Vec<WatchShardingAssignmentResponse> {
        self.done.push(WatchShardingAssignmentResponse { chunk: Some(self.current), ..Default::default() });
        self.done
    }
}

#[cfg(test)]
mod tests {
    use steady_slice::{Slice as SteadySlice, SliceKey};

    use super::*;

    /// A slice as `(start, end, endpoint indices)`.
    type Triple<I> = (Vec<u8>, Option<Vec<u8>>, Vec<I>);

    fn three_slices() -> Assignment {
        Assignment::new(
            9,
            vec![
                SteadySlice::new(SliceKey(0), vec![2]),
                SteadySlice::new(SliceKey(1 << 62), vec![0, 2]).with_warming([5]),
                SteadySlice::new(SliceKey(1 << 63), vec![7]),
            ],
        )
        .unwrap()
    }

    #[test]
    fn an_assignment_is_its_endpoints_then_its_slices_then_its_generation() {
        let out = responses(&three_slices(), |t| format!("task-{t}"), DEFAULT_MAX_CHUNK_BYTES);
        assert_eq!(out.len(), 2, "one chunk and the metadata");
        let chunk = out[0].chunk.as_ref().unwrap();
        let names: Vec<&str> = chunk.endpoints.iter().map(|e| e.endpoint.as_str()).collect();
        assert_eq!(names, ["task-0", "task-2", "task-7"], "warming task 5 is not sent");
        let slices: Vec<Triple<i32>> = chunk
            .slice_assignments
            .iter()
            .map(|s| {
                let slice = s.slice.clone().unwrap();
                (slice.start_key, slice.end_key, s.endpoints.iter().map(|e| e.endpoint_index).collect())
            })
            .collect();
        let quarter = key_bytes(SliceKey(1 << 62)).to_vec();
        let half = key_bytes(SliceKey(1 << 63)).to_vec();
        assert_eq!(
            slices,
            [
                (vec![], Some(quarter.clone()), vec![1]),
                (quarter, Some(half.clone()), vec![0, 1]),
                (half, None, vec![2]),
            ]
        );
        assert_eq!(out[1].metadata, Some(AssignmentMetadata { generation: 9 }));
        assert!(out.iter().all(|r| [r.config.is_some(), r.chunk.is_some(), r.metadata.is_some()]
            .iter()
            .filter(|&&set| set)
            .count()
            == 1));
    }

    #[test]
    fn a_large_assignment_is_split_into_chunks_within_the_bound() {
        let slices: Vec<SteadySlice> = (0..20_000u64)
            .map(|i| {
                SteadySlice::new(
                    SliceKey(i * (u64::MAX / 20_000)),
                    vec![(i % 300) as u32, 300 + (i % 7) as u32],
                )
            })
            .collect();
        let assignment = Assignment::new(3, slices).unwrap();
        let out = encoded_responses(&assignment, |t| format!("10.0.{}.{}:8080", t / 256, t % 256), 16 * 1024);
        assert!(out.len() > 10, "{} messages", out.len());
        for message in &out {
            assert!(message.len() <= 16 * 1024, "{} bytes", message.len());
        }
        let decoded: Vec<WatchShardingAssignmentResponse> =
            out.iter().map(|b| WatchShardingAssignmentResponse::decode(b.clone()).unwrap()).collect();
        let chunks: Vec<&AssignmentChunk> = decoded.iter().filter_map(|r| r.chunk.as_ref()).collect();
        assert_eq!(chunks.iter().map(|c| c.slice_assignments.len()).sum::<usize>(), 20_000);
        assert_eq!(chunks.iter().map(|c| c.endpoints.len()).sum::<usize>(), 307);
        assert_eq!(decoded.last().unwrap().metadata, Some(AssignmentMetadata { generation: 3 }));
    }

    /// The bytes of a small assignment's messages, frozen: they are the protocol's.
    #[test]
    fn the_encoding_is_frozen() {
        let assignment = Assignment::new(
            5,
            vec![SteadySlice::new(SliceKey(0), vec![1]), SteadySlice::new(SliceKey(1 << 63), vec![0, 1])],
        )
        .unwrap();
        let out = encoded_responses(&assignment, |t| format!("t{t}"), DEFAULT_MAX_CHUNK_BYTES);
        let hex = |b: &Bytes| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        assert_eq!(
            out.iter().map(hex).collect::<Vec<_>>(),
            [
                // chunk { slices { slice { end_key: 80 00.. } endpoints { index 1 } }
                //         slices { slice { start_key: 80 00.. } endpoints { index 0 } endpoints { index 1 } }
                //         endpoints { "t0" } endpoints { "t1" } }
                "12320a100a0a12088000000000000000120208010a120a0a0a08800000000000000012001202080112040a0274301204\
                 0a027431"
                    .replace(' ', ""),
                // metadata { generation: 5 }
                "1a020805".to_owned(),
            ]
        );
    }
}
