//! The heap a Watch client's decoding takes, measured: an `AssignmentUpdate` message is
//! read into an assignment ([`steady_proto::decode_update`], what the client's codec
//! calls) with a peak of at most 4 times the message's size, whatever the message.
//!
//! Before messages were read straight into steady-slice's types, prost's structs (56
//! bytes a slice, grown by doubling) took, as this allocator counts them: 13.1 times a
//! message of `MAX_SLICES + 1` slices (184 MiB for 14 MiB) before it was refused, 42
//! times a message of 2^20 empty slices, 6.3 times one slice of 4 million replicas, and
//! a `MAX_SLICES` round trip 7.6 times the encoded size (106 MiB).
//!
//! One test in its own binary: the counting allocator (steady-testing's) is this binary's,
//! and no other test allocates while it measures.

use steady_proto::{decode_update, encode_update, UpdateError};
use steady_slice::{Assignment, AssignmentError, Slice, SliceKey, MAX_SLICES};
use steady_testing::alloc_count::{peak_of, CountingAllocator};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

const MIB: f64 = (1 << 20) as f64;

/// What decoding may take whatever the input: scratch of a few KiB.
const SLACK: usize = 64 << 10;

/// The peak, checked against `times` the input (and [`SLACK`]) and reported.
fn check(what: &str, input: usize, peak: usize, times: usize) {
    let ratio = peak as f64 / input as f64;
    eprintln!(
        "{what}: {:.1} MiB in, peak {:.1} MiB = {peak} bytes ({ratio:.2}x)",
        input as f64 / MIB,
        peak as f64 / MIB
    );
    assert!(peak <= times * input + SLACK, "{what}: peak {peak} bytes for {input} in ({ratio:.2}x)");
}

/// `n` slices evenly spread, one replica each: the common case, and the densest valid
/// encoding (14 bytes a slice).
fn slices(n: usize) -> impl Iterator<Item = Slice> {
    let step = u64::MAX / n as u64;
    (0..n).map(move |i| Slice::new(SliceKey(i as u64 * step), [(i % 100) as u32]))
}

/// `n` as a protobuf varint.
fn varint(mut n: usize) -> Vec<u8> {
    let mut out = Vec::new();
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
    out
}

/// A slice starting at 0 with `n` one-byte replicas, packed, with its key and length.
fn wide_slice(n: usize) -> Vec<u8> {
    let replicas = [&[0x12][..], &varint(n), &(0..n).map(|t| (t % 100) as u8).collect::<Vec<_>>()].concat();
    [&[0x12][..], &varint(replicas.len()), &replicas].concat()
}

/// A message of generation 7 and `slices` (each with its key and length).
fn message(slices: &[Vec<u8>]) -> Vec<u8> {
    [&[0x08, 7][..], &slices.concat()].concat()
}

#[test]
fn decoding_takes_at_most_four_times_the_message() {
    // The allocator counts (a binary without it would measure nothing).
    let (_, peak) = peak_of(|| std::hint::black_box(vec![0u8; 1 << 20]));
    assert!(peak >= 1 << 20, "the counting allocator is not installed: {peak}");
    let a = Assignment::new(7, slices(MAX_SLICES).collect()).unwrap();
    // MAX_SLICES + 1 slices: an `Assignment` cannot hold them, so the message is the
    // encoding of MAX_SLICES slices with one more appended (the same bytes prost writes).
    let mut over = encode_update(&a).to_vec();
    over.extend_from_slice(&[0x12, 0x0c, 0x09]);
    over.extend_from_slice(&u64::MAX.to_le_bytes());
    over.extend_from_slice(&[0x12, 0x01, 0x05]);
    let (refused, peak) = peak_of(|| decode_update(&over));
    assert_eq!(refused, Err(UpdateError::Invalid(AssignmentError::TooManySlices { count: MAX_SLICES + 1 })));
    // Refused before a slice is built: nothing but the counting.
    check("MAX_SLICES + 1 slices, refused", over.len(), peak, 0);
    drop(over);

    // The round trip of the largest assignment: its encoding, then its decoding, while
    // the assignment is held (as a Distributor holds it while it encodes it).
    let (encoded, peak) = peak_of(|| {
        let bytes = encode_update(&a);
        assert_eq!(decode_update(&bytes).as_ref(), Ok(&a));
        bytes.len()
    });
    check("MAX_SLICES round trip", encoded, peak, 4);
    drop(a);

    // The most slices a message can carry for its size: 2^20 empty ones (2 bytes each),
    // refused at the first, which has no replica.
    let empty = message(&[[0x12, 0].repeat(MAX_SLICES)]);
    let (refused, peak) = peak_of(|| decode_update(&empty));
    assert_eq!(refused, Err(UpdateError::Invalid(AssignmentError::NoReplicas { slice: 0 })));
    check("2^20 empty slices", empty.len(), peak, 4);
    drop(empty);

    // The most tasks a message can carry for its size: one slice of 4 million one-byte
    // replicas (4 bytes each once read: the bound's 4).
    let tasks = 4_000_000;
    let wide = message(&[wide_slice(tasks)]);
    let (refused, peak) = peak_of(|| decode_update(&wide));
    assert_eq!(
        refused,
        Err(UpdateError::Invalid(AssignmentError::TooManyReplicas { slice: 0, count: tasks }))
    );
    check("one slice of 4,000,000 replicas", wide.len(), peak, 4);
    drop(wide);

    // Both: a slice of 2 million replicas, then 2^20 - 1 empty slices. Room is reserved for
    // the slices large enough to be valid (here the first only), not for as many as the
    // message's size could hold: that would be 2.5 times the message on top of the 2
    // the replicas take.
    let empty_slices = [0x12, 0].repeat(MAX_SLICES - 1);
    let mixed = message(&[wide_slice(2_000_000), empty_slices]);
    let (refused, peak) = peak_of(|| decode_update(&mixed));
    assert_eq!(
        refused,
        Err(UpdateError::Invalid(AssignmentError::TooManyReplicas { slice: 0, count: 2_000_000 }))
    );
    check("2,000,000 replicas, then 2^20 - 1 empty slices", mixed.len(), peak, 4);
}
