//! The `AssignmentUpdate` message written from and read into steady-slice's types
//! directly, without prost's generated structs in between: [`encode_update`],
//! [`decode_update`], and the Watch client's codec that reads with it.
//!
//! Why: the generated `assignment::Slice` takes 56 bytes and two vectors a slice, and
//! prost grows the message's vector of them by doubling as it reads. A watcher reading a
//! message of `MAX_SLICES + 1` slices (14 MiB) held 128 to 184 MiB before refusing it
//! (counting a vector's reallocation in place or not), and a message of 2^20 empty
//! slices (2 MiB) 56 to 84 MiB.

use std::fmt;

use prost::bytes::{Buf, BufMut, Bytes};
use prost::encoding::{self, DecodeContext, WireType};
use prost::{DecodeError, Message};
use steady_slice::{Assignment, AssignmentBuilder, AssignmentError, Slice, SliceKey};
use tonic::codec::{Codec, DecodeBuf, Decoder};
use tonic::Status;

use crate::assignment::WatchRequest;

/// The fewest bytes the fields of a valid slice take: one replica (a key and a byte,
/// unpacked), and for every slice but the first a start (a key and 8 bytes: only the
/// first starts at 0, the one start protobuf leaves out). With its own key and length, a
/// valid slice other than the first takes at least 13 bytes of the message.
const MIN_FIRST_SLICE_FIELDS: u64 = 2;
const MIN_SLICE_FIELDS: u64 = 11;

/// How many tasks a slice may have for [`decode_update`] to read them on the stack
/// instead of into a vector of their own.
const STACK_TASKS: usize = 8;

/// Field numbers (`proto/assignment.proto`).
const GENERATION: u32 = 1;
const SLICES: u32 = 2;
const START: u32 = 1;
const REPLICAS: u32 = 2;
const WARMING: u32 = 3;

/// Why bytes are not an assignment: [`decode_update`]'s error.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum UpdateError {
    /// The bytes are not an `AssignmentUpdate` message (what prost's decoder refuses).
    Malformed(DecodeError),
    /// A well-formed message carrying an invalid assignment: the first problem, as
    /// [`Assignment::new`] names it.
    Invalid(AssignmentError),
}

impl fmt::Display for UpdateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Malformed(e) => write!(f, "malformed AssignmentUpdate message: {e}"),
            Self::Invalid(e) => write!(f, "invalid assignment: {e}"),
        }
    }
}

impl std::error::Error for UpdateError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Malformed(e) => Some(e),
            Self::Invalid(e) => Some(e),
        }
    }
}

impl From<DecodeError> for UpdateError {
    fn from(e: DecodeError) -> Self {
        Self::Malformed(e)
    }
}

/// `assignment`'s `AssignmentUpdate` message, encoded: what every Watch stream sends.
///
/// The bytes prost writes for `AssignmentUpdate::from(assignment)` (a frozen contract:
/// golden vectors and a comparison with prost's encoder pin them), written in one
/// allocation of exactly their size, without copying the assignment into messages first.
pub fn encode_update(assignment: &Assignment) -> Bytes {
    let generation = assignment.generation();
    let len = if generation == 0 { 0 } else { encoding::uint64::encoded_len(GENERATION, &generation) }
        + assignment
            .slices()
            .iter()
            .map(|s| {
                let body = slice_len(s);
                encoding::key_len(SLICES) + encoding::encoded_len_varint(body as u64) + body
            })
            .sum::<usize>();
    let mut out = Vec::with_capacity(len);
    if generation != 0 {
        encoding::uint64::encode(GENERATION, &generation, &mut out);
    }
    for s in assignment.slices() {
        encoding::encode_key(SLICES, WireType::LengthDelimited, &mut out);
        encoding::encode_varint(slice_len(s) as u64, &mut out);
        encode_slice(s.start.get(), s.replicas(), s.warming(), &mut out);
    }
    debug_assert_eq!(out.len(), len);
    Bytes::from(out)
}

/// The encoded length of a `Slice` message's fields.
fn slice_len(s: &Slice) -> usize {
    let start = s.start.get();
    (if start == 0 { 0 } else { encoding::fixed64::encoded_len(START, &start) })
        + encoding::uint32::encoded_len_packed(REPLICAS, s.replicas())
        + encoding::uint32::encoded_len_packed(WARMING, s.warming())
}

/// A `Slice` message's fields, as the generated code writes them (a start of 0 and empty
/// lists left out, lists packed).
fn encode_slice(start: u64, replicas: &[u32], warming: &[u32], out: &mut impl BufMut) {
    if start != 0 {
        encoding::fixed64::encode(START, &start, out);
    }
    encoding::uint32::encode_packed(REPLICAS, replicas, out);
    encoding::uint32::encode_packed(WARMING, warming, out);
}

/// Reads an `AssignmentUpdate` message into a validated [`Assignment`]: what the Watch
/// client ([`crate::watch_assignments`]) does with every message it receives.
///
/// It accepts exactly what prost's generated decoder followed by `Assignment::try_from`
/// accepts, with the same errors: unknown fields are skipped, task lists may come packed
/// or not, the last generation wins, and a message malformed anywhere is
/// [`UpdateError::Malformed`] even when a slice before the malformation is invalid
/// (tests compare the two on mutated and random messages).
///
/// # Memory
///
/// At most 4 times the message's size (and a few KiB of scratch), whatever the message:
/// prost's structs took up to 42 times, for a message of empty slices.
///
/// A first pass frames the top-level fields, counting the slices, the ones large enough
/// to be valid, and keeping the generation: a message of more than
/// [`MAX_SLICES`](steady_slice::MAX_SLICES) slices, or of generation 0, or of none, is
/// refused before a slice is built. Room is reserved once, for the slices large enough to
/// be valid (at least 13 bytes each, the first aside). The second pass builds each
/// [`Slice`] straight from its bytes (its tasks counted first, then read into room of
/// exactly their number, or none of their own for up to five) and validates it as it
/// comes ([`AssignmentBuilder`]), so only valid slices are kept and nothing is built
/// after an invalid one. Each slice's bytes pay for what it takes: 32 bytes of slice for
/// at least 13, 4 bytes a task for at least 1. `tests/decode_memory.rs` measures it.
///
/// # Errors
///
/// [`UpdateError::Malformed`] for bytes prost's decoder refuses; else
/// [`UpdateError::Invalid`] with the first problem [`Assignment::new`] would find.
pub fn decode_update(bytes: &[u8]) -> Result<Assignment, UpdateError> {
    let head = Head::read(bytes, Slices::Frame)?;
    let mut builder = match AssignmentBuilder::new(head.generation, head.slices) {
        Ok(builder) => builder,
        // Refused before reading a slice, but only if the slices are well formed: a
        // message malformed anywhere is malformed, as prost has it.
        Err(e) => {
            Head::read(bytes, Slices::Check)?;
            return Err(UpdateError::Invalid(e));
        }
    };
    builder.reserve(head.plausible);
    let ctx = DecodeContext::default();
    let mut buf = bytes;
    let mut invalid = None;
    while buf.has_remaining() {
        let (tag, wire_type) = encoding::decode_key(&mut buf)?;
        match tag {
            GENERATION => encoding::uint64::merge(wire_type, &mut 0, &mut buf, ctx.clone())?,
            SLICES if invalid.is_none() => {
                let slice = read_slice(wire_type, &mut buf, ctx.clone()).map_err(at_slices)?;
                if let Err(e) = builder.push(slice) {
                    // Nothing more is built, but the rest must still be well formed.
                    invalid = Some(e);
                }
            }
            SLICES => {
                encoding::message::merge(wire_type, &mut SliceFields::default(), &mut buf, ctx.clone())
                    .map_err(at_slices)?;
            }
            _ => encoding::skip_field(wire_type, tag, &mut buf, ctx.clone())?,
        }
    }
    match invalid {
        Some(e) => Err(UpdateError::Invalid(e)),
        None => builder.finish().map_err(UpdateError::Invalid),
    }
}

/// One slice's message: its tasks counted on a copy of the bytes, then read into room of
/// exactly their number.
fn read_slice(wire_type: WireType, buf: &mut &[u8], ctx: DecodeContext) -> Result<Slice, DecodeError> {
    let mut counted = SliceFields::default();
    encoding::message::merge(wire_type, &mut counted, &mut { *buf }, ctx.clone())?;
    let (replicas, len) = (counted.replicas, counted.replicas + counted.warming);
    let mut stack = [0u32; STACK_TASKS];
    let mut heap = Vec::new();
    let tasks = if len <= STACK_TASKS {
        &mut stack[..len]
    } else {
        heap.resize(len, 0);
        &mut heap[..]
    };
    let mut fields = SliceFields { fill: Some((tasks, replicas)), ..SliceFields::default() };
    encoding::message::merge(wire_type, &mut fields, buf, ctx)?;
    let start = SliceKey(fields.start);
    Ok(if len <= STACK_TASKS {
        let slice = Slice::new(start, &stack[..replicas]);
        if len == replicas {
            slice
        } else {
            slice.with_warming(&stack[replicas..len])
        }
    } else {
        Slice::from_tasks(start, heap, replicas)
    })
}

/// What a first pass over a message finds.
#[derive(Debug)]
struct Head {
    /// The last generation field's value (0 when there is none), as protobuf has it.
    generation: u64,
    /// How many slices the message holds.
    slices: usize,
    /// How many of them are large enough to be valid (counted when slices are only
    /// framed): no more can be kept.
    plausible: usize,
}

/// How [`Head::read`] passes over slices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slices {
    /// Only their framing: their length fits in the message.
    Frame,
    /// Read in full (and dropped), so that a malformed one is found.
    Check,
}

impl Head {
    fn read(mut buf: &[u8], slices: Slices) -> Result<Head, DecodeError> {
        let ctx = DecodeContext::default();
        let mut head = Head { generation: 0, slices: 0, plausible: 0 };
        while buf.has_remaining() {
            let (tag, wire_type) = encoding::decode_key(&mut buf)?;
            match tag {
                GENERATION => encoding::uint64::merge(wire_type, &mut head.generation, &mut buf, ctx.clone())
                    .map_err(|e| at(e, "AssignmentUpdate", "generation"))?,
                SLICES => {
                    let fields = buf;
                    match slices {
                        Slices::Frame => encoding::check_wire_type(WireType::LengthDelimited, wire_type)
                            .and_then(|()| encoding::skip_field(wire_type, tag, &mut buf, ctx.clone())),
                        Slices::Check => encoding::message::merge(
                            wire_type,
                            &mut SliceFields::default(),
                            &mut buf,
                            ctx.clone(),
                        ),
                    }
                    .map_err(at_slices)?;
                    // The slice's length, read again now that it is known to be well formed.
                    let len = encoding::decode_varint(&mut { fields }).unwrap_or(0);
                    let least = if head.slices == 0 { MIN_FIRST_SLICE_FIELDS } else { MIN_SLICE_FIELDS };
                    head.plausible += usize::from(len >= least);
                    head.slices += 1;
                }
                _ => encoding::skip_field(wire_type, tag, &mut buf, ctx.clone())?,
            }
        }
        Ok(head)
    }
}

/// A decoding error, placed as prost's generated code places it.
fn at(mut e: DecodeError, message: &'static str, field: &'static str) -> DecodeError {
    e.push(message, field);
    e
}

fn at_slices(e: DecodeError) -> DecodeError {
    at(e, "AssignmentUpdate", "slices")
}

/// A `Slice` message's fields as [`decode_update`] reads them, twice over the same
/// bytes: first counting the tasks (`fill` is `None`), then writing them into room of
/// exactly that size: replicas first, then warming tasks. A hand-written
/// [`prost::Message`] so that prost's own framing, skipping and nesting limit apply.
#[derive(Debug, Default)]
struct SliceFields<'a> {
    start: u64,
    /// How many replicas were read.
    replicas: usize,
    /// How many warming tasks were read.
    warming: usize,
    /// When filling: the room for every task, and how many replicas come first.
    fill: Option<(&'a mut [u32], usize)>,
}

impl SliceFields<'_> {
    fn put(&mut self, field: u32, task: u32) {
        let (read, offset) = match field {
            REPLICAS => (&mut self.replicas, 0),
            _ => (&mut self.warming, self.fill.as_ref().map_or(0, |(_, replicas)| *replicas)),
        };
        if let Some((tasks, replicas)) = &mut self.fill {
            // The counting pass read the same bytes: every task has its place. A replica
            // beyond the count would be a warming task's place, so it is checked too.
            if field != REPLICAS || *read < *replicas {
                if let Some(place) = tasks.get_mut(offset + *read) {
                    *place = task;
                }
            }
        }
        *read += 1;
    }

    /// A `repeated uint32` field, packed or not, as prost reads one.
    fn merge_tasks(
        &mut self,
        field: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        let one = |fields: &mut Self, wire_type, buf: &mut _, ctx| {
            let mut task = 0u32;
            encoding::uint32::merge(wire_type, &mut task, buf, ctx)?;
            fields.put(field, task);
            Ok(())
        };
        if wire_type == WireType::LengthDelimited {
            encoding::merge_loop(self, buf, ctx, |fields, buf, ctx| one(fields, WireType::Varint, buf, ctx))
        } else {
            encoding::check_wire_type(WireType::Varint, wire_type)?;
            one(self, wire_type, buf, ctx)
        }
    }

    /// The tasks read (none while counting): replicas, then warming tasks.
    fn tasks(&self) -> (&[u32], &[u32]) {
        match &self.fill {
            Some((tasks, replicas)) => tasks.split_at((*replicas).min(tasks.len())),
            None => (&[], &[]),
        }
    }
}

impl Message for SliceFields<'_> {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        let (replicas, warming) = self.tasks();
        encode_slice(self.start, replicas, warming, buf);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        match tag {
            START => encoding::fixed64::merge(wire_type, &mut self.start, buf, ctx)
                .map_err(|e| at(e, "Slice", "start")),
            REPLICAS => self.merge_tasks(tag, wire_type, buf, ctx).map_err(|e| at(e, "Slice", "replicas")),
            WARMING => self.merge_tasks(tag, wire_type, buf, ctx).map_err(|e| at(e, "Slice", "warming")),
            _ => encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        let (replicas, warming) = self.tasks();
        (if self.start == 0 { 0 } else { encoding::fixed64::encoded_len(START, &self.start) })
            + encoding::uint32::encoded_len_packed(REPLICAS, replicas)
            + encoding::uint32::encoded_len_packed(WARMING, warming)
    }

    fn clear(&mut self) {
        self.start = 0;
        self.replicas = 0;
        self.warming = 0;
        if let Some((tasks, _)) = &mut self.fill {
            tasks.fill(0);
        }
    }
}

/// The Watch client's codec: requests as prost writes them, responses read by
/// [`decode_update`] into what the client's stream yields. A malformed response is the
/// `INTERNAL` status prost's codec gives it; an invalid assignment is an item.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct WatchCodec;

/// [`WatchCodec`]'s decoder.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct UpdateDecoder;

impl Decoder for UpdateDecoder {
    type Item = Result<Assignment, AssignmentError>;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, Status> {
        // tonic holds the whole message in one buffer: taking it copies nothing.
        let bytes = src.copy_to_bytes(src.remaining());
        match decode_update(&bytes) {
            Ok(assignment) => Ok(Some(Ok(assignment))),
            Err(UpdateError::Invalid(e)) => Ok(Some(Err(e))),
            Err(UpdateError::Malformed(e)) => Err(Status::internal(e.to_string())),
        }
    }
}

impl Codec for WatchCodec {
    type Encode = WatchRequest;
    type Decode = Result<Assignment, AssignmentError>;
    type Encoder = tonic_prost::ProstEncoder<WatchRequest>;
    type Decoder = UpdateDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        tonic_prost::ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        UpdateDecoder
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;
    use steady_subset::prng::SplitMix64;

    use super::*;
    use crate::assignment as proto;

    /// What the generated code and `TryFrom` make of `bytes`, in [`decode_update`]'s terms.
    fn by_prost(bytes: &[u8]) -> Result<Assignment, UpdateError> {
        let message = proto::AssignmentUpdate::decode(bytes)?;
        Assignment::try_from(message).map_err(UpdateError::Invalid)
    }

    /// `decode_update` and prost agree on `bytes`: the same assignment, the same
    /// validation error, or both find them malformed (where prost names the problem
    /// its own way).
    fn agree(bytes: &[u8]) -> Result<Assignment, UpdateError> {
        let ours = decode_update(bytes);
        match (&ours, &by_prost(bytes)) {
            (Err(UpdateError::Malformed(_)), Err(UpdateError::Malformed(_))) => {}
            (ours, theirs) => assert_eq!(ours, theirs, "{bytes:02x?}"),
        }
        ours
    }

    fn random_assignment(rng: &mut SplitMix64) -> Assignment {
        let n = 1 + rng.below(6) as usize;
        let mut start = 0u64;
        let mut slices = Vec::new();
        for _ in 0..n {
            // Tasks 0..40 (one-byte varints) or up to MAX_TASK, 1 to 9 replicas and
            // sometimes warming tasks: inline and boxed slices both.
            let wide = rng.below(2) == 0;
            let mut tasks: Vec<u32> = Vec::new();
            let want = 1 + rng.below(9) as usize + rng.below(3) as usize;
            while tasks.len() < want {
                let t = if wide { rng.below(u64::from(steady_slice::MAX_TASK) + 1) } else { rng.below(40) }
                    as u32;
                if !tasks.contains(&t) {
                    tasks.push(t);
                }
            }
            let replicas = 1 + rng.below(tasks.len() as u64) as usize;
            slices.push(Slice::from_tasks(SliceKey(start), tasks, replicas));
            let bits = rng.below(58);
            start += 1 + rng.below(1 << bits);
        }
        let bits = rng.below(63);
        Assignment::new(1 + rng.below(1 << bits), slices).unwrap()
    }

    #[test]
    fn the_bytes_written_are_prosts() {
        let mut rng = SplitMix64::new(39);
        for _ in 0..2000 {
            let a = random_assignment(&mut rng);
            let bytes = encode_update(&a);
            assert_eq!(bytes, proto::AssignmentUpdate::from(&a).encode_to_vec(), "{a:?}");
            assert_eq!(decode_update(&bytes), Ok(a.clone()));
            assert_eq!(agree(&bytes), Ok(a));
        }
    }

    /// Valid messages with bytes changed, cut or added, and plain noise: the same verdict
    /// as prost's, every time.
    #[test]
    fn every_message_reads_as_prost_reads_it() {
        let mut rng = SplitMix64::new(2039);
        let (mut ok, mut invalid, mut malformed) = (0, 0, 0);
        for round in 0..20_000 {
            let mut bytes = encode_update(&random_assignment(&mut rng)).to_vec();
            match round % 4 {
                0 => {
                    for _ in 0..1 + rng.below(3) {
                        let at = rng.below(bytes.len() as u64) as usize;
                        bytes[at] = rng.below(256) as u8;
                    }
                }
                1 => bytes.truncate(rng.below(bytes.len() as u64 + 1) as usize),
                2 => {
                    let at = rng.below(bytes.len() as u64 + 1) as usize;
                    let noise: Vec<u8> = (0..rng.below(6)).map(|_| rng.below(256) as u8).collect();
                    bytes.splice(at..at, noise);
                }
                _ => bytes = (0..rng.below(40)).map(|_| rng.below(256) as u8).collect(),
            }
            match agree(&bytes) {
                Ok(_) => ok += 1,
                Err(UpdateError::Invalid(_)) => invalid += 1,
                Err(UpdateError::Malformed(_)) => malformed += 1,
            }
        }
        // Each verdict was reached often enough for the comparison to mean something.
        assert!(ok > 500 && invalid > 500 && malformed > 500, "{ok} {invalid} {malformed}");
    }

    /// Every way protobuf allows a message to be written that prost's encoder does not
    /// use: unpacked and split lists, repeated and explicit default fields, unknown
    /// fields of every wire type (groups too, as deep as prost's nesting limit).
    #[test]
    fn every_encoding_protobuf_allows_reads_as_prost_reads_it() {
        let key = |tag: u32, wire: u8| (tag << 3 | u32::from(wire)) as u8;
        let slice = |body: &[u8]| [&[key(2, 2), body.len() as u8][..], body].concat();
        // Start 0 written out, replicas unpacked, an unknown varint, warming split in two.
        let first = slice(
            &[
                &[key(1, 1)][..],
                &0u64.to_le_bytes(),
                &[key(2, 0), 3, key(9, 0), 0x80, 0x01, key(2, 0), 4],
                &[key(3, 2), 1, 5, key(3, 0), 6],
            ]
            .concat(),
        );
        // Packed replicas in two runs, unknown fixed32, fixed64 and bytes fields.
        let second = slice(
            &[
                &[key(1, 1)][..],
                &9u64.to_le_bytes(),
                &[key(2, 2), 2, 1, 2, key(2, 2), 1, 7],
                &[key(10, 5), 1, 2, 3, 4, key(11, 1), 0, 0, 0, 0, 0, 0, 0, 0, key(12, 2), 2, 0xff, 0xff],
            ]
            .concat(),
        );
        // Generation twice (the last counts), an unknown field between the slices.
        let message = [&[key(1, 0), 5][..], &first, &[key(7, 2), 1, 0], &second, &[key(1, 0), 6]].concat();
        let a = agree(&message).unwrap();
        assert_eq!(a.generation(), 6);
        assert_eq!(
            a.slices(),
            [Slice::new(SliceKey(0), [3, 4]).with_warming([5, 6]), Slice::new(SliceKey(9), [1, 2, 7]),]
        );
        // Wrong wire types for known fields are malformed, as prost has them.
        for bad in [
            [&[key(1, 2), 0][..], &first].concat(),
            [&[key(2, 0), 0][..], &first].concat(),
            [&[key(1, 0), 1][..], &slice(&[key(1, 0), 1, key(2, 0), 1])].concat(),
            [&[key(1, 0), 1][..], &slice(&[key(2, 5), 1, 0, 0, 0])].concat(),
            [&[key(1, 0), 1][..], &slice(&[key(2, 0), 1, key(4, 4)])].concat(),
        ] {
            assert!(matches!(agree(&bad), Err(UpdateError::Malformed(_))), "{bad:02x?}");
        }
        // Unknown groups nested around prost's limit, at the top and inside a slice.
        for depth in [1, 50, 98, 99, 100, 101] {
            let group: Vec<u8> = std::iter::repeat_n(key(20, 3), depth)
                .chain(std::iter::repeat_n(key(20, 4), depth))
                .collect();
            let top = [&[key(1, 0), 1][..], &slice(&[key(2, 0), 1]), &group].concat();
            agree(&top).ok();
            let inside = [&[key(1, 0), 1][..], &slice(&[&[key(2, 0), 1][..], &group].concat())].concat();
            agree(&inside).ok();
        }
    }

    /// A slice invalid before a malformed one: malformed, as prost has it (prost reads the
    /// whole message before anything is validated); and a message with too many slices,
    /// generation 0 or no slice is refused before a slice is built, but malformed if a
    /// slice is.
    #[test]
    fn malformed_anywhere_is_malformed() {
        let a = Assignment::new(3, vec![Slice::new(SliceKey(0), [1]), Slice::new(SliceKey(9), [2])]).unwrap();
        let mut bytes = encode_update(&a).to_vec();
        // Slice 0's replicas (field 2: `12 01 01`) become warming tasks (field 3): a
        // slice with no replica.
        assert_eq!(bytes[..7], [0x08, 3, 0x12, 3, 0x12, 1, 1]);
        bytes[4] = 0x1a;
        assert_eq!(agree(&bytes), Err(UpdateError::Invalid(AssignmentError::NoReplicas { slice: 0 })));
        // Now the last slice's replica list claims a byte more than the slice holds.
        let last = bytes.len() - 2;
        bytes[last] = 2;
        assert!(matches!(agree(&bytes), Err(UpdateError::Malformed(_))));
        for generation in [0, 7] {
            let mut empty = vec![0x08, generation];
            if generation == 0 {
                empty.truncate(0);
            }
            assert_eq!(
                agree(&empty),
                Err(UpdateError::Invalid(if generation == 0 {
                    AssignmentError::ZeroGeneration
                } else {
                    AssignmentError::NoSlices
                }))
            );
            // The same with a malformed slice: malformed.
            empty.extend_from_slice(&[0x12, 2, 0x10]);
            empty.push(0x80);
            assert!(matches!(agree(&empty), Err(UpdateError::Malformed(_))), "{empty:02x?}");
        }
    }

    #[test]
    fn errors_name_their_kind() {
        let malformed = decode_update(&[0x12, 5]).unwrap_err();
        assert!(malformed.to_string().starts_with("malformed AssignmentUpdate message: "), "{malformed}");
        assert!(std::error::Error::source(&malformed).is_some());
        let invalid = decode_update(&[0x08, 1]).unwrap_err();
        assert_eq!(invalid.to_string(), "invalid assignment: assignment has no slices");
    }
}
