//! The heap [`Assignment::decode`] takes, measured: less than 3 times its input (2.3
//! for the largest valid assignment: a slice is 32 bytes once read and at least 14 on
//! the wire), whatever count the input announces.
//!
//! Before slices were read into a 32-byte `Slice` and validated as they came, decoding
//! reserved 56 bytes for every slice announced and a vector for each slice's replicas:
//! 4.3 times a valid input, 5.6 times one announcing as many empty slices as its bytes
//! could hold.
//!
//! One test in its own binary: the counting allocator (steady-testing's) is this binary's,
//! and no other test allocates while it measures.

use steady_slice::{Assignment, AssignmentError, DecodeError, Malformed, Slice, SliceKey, MAX_SLICES};
use steady_testing::alloc_count::{peak_of, CountingAllocator};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// What decoding may take whatever the input: scratch of a few KiB.
const SLACK: usize = 64 << 10;

/// The peak, checked against `times` the input (and [`SLACK`]) and reported.
fn check(what: &str, input: usize, peak: usize, times: usize) {
    let ratio = peak as f64 / input as f64;
    let mib = |n: usize| n as f64 / (1 << 20) as f64;
    eprintln!("{what}: {:.1} MiB in, peak {:.1} MiB = {peak} bytes ({ratio:.2}x)", mib(input), mib(peak));
    assert!(peak <= times * input + SLACK, "{what}: peak {peak} bytes for {input} in ({ratio:.2}x)");
}

#[test]
fn decoding_takes_at_most_three_times_the_input() {
    // The allocator counts (a binary without it would measure nothing).
    let (_, peak) = peak_of(|| std::hint::black_box(vec![0u8; 1 << 20]));
    assert!(peak >= 1 << 20, "the counting allocator is not installed: {peak}");
    // The largest assignment, one replica a slice: the densest valid encoding.
    let step = u64::MAX / MAX_SLICES as u64;
    let a = Assignment::new(
        7,
        (0..MAX_SLICES).map(|i| Slice::new(SliceKey(i as u64 * step), [(i % 100) as u32])).collect(),
    )
    .unwrap();
    let bytes = a.encode();
    let (decoded, peak) = peak_of(|| Assignment::decode(&bytes));
    assert_eq!(decoded.as_ref(), Ok(&a));
    check("MAX_SLICES slices", bytes.len(), peak, 3);
    drop(decoded);
    drop(a);

    // As many slices as the bytes can hold, 10 bytes each with no replica: refused at
    // the first, with room reserved only for the valid slices the bytes could hold.
    let mut empty = bytes[..13].to_vec();
    empty.extend_from_slice(&(MAX_SLICES as u32).to_le_bytes());
    empty.resize(17 + 10 * MAX_SLICES, 0);
    let (refused, peak) = peak_of(|| Assignment::decode(&empty));
    assert_eq!(refused, Err(DecodeError::Invalid(AssignmentError::NoReplicas { slice: 0 })));
    check("2^20 empty slices", empty.len(), peak, 3);

    // Both: 100 valid slices of 1,024 replicas (kept: 4 bytes a task, as on the wire),
    // then 1 MiB of 10-byte slices (start 0, no replica: invalid), counted in the room
    // reserved: the most decoding takes for its input, 2.6 times.
    let wide: Vec<u32> = (0..1024).collect();
    let slices: Vec<Slice> = (0..100).map(|i| Slice::new(SliceKey(i << 32), &wide)).collect();
    let mut mixed = Assignment::new(7, slices).unwrap().encode();
    let count = 100 + (1 << 20) / 10;
    mixed[13..17].copy_from_slice(&(count as u32).to_le_bytes());
    mixed.resize(mixed.len() + 10 * (count - 100), 0);
    let (refused, peak) = peak_of(|| Assignment::decode(&mixed));
    assert!(matches!(refused, Err(DecodeError::Invalid(AssignmentError::NotIncreasing { slice: 100, .. }))));
    check("100 slices of 1,024 replicas, then 1 MiB of empty slices", mixed.len(), peak, 3);
    drop(mixed);

    // A count above the limit is refused before anything is read.
    let mut over = bytes;
    over[13..17].copy_from_slice(&(MAX_SLICES as u32 + 1).to_le_bytes());
    let (refused, peak) = peak_of(|| Assignment::decode(&over));
    assert_eq!(
        refused,
        Err(DecodeError::Malformed { offset: 13, cause: Malformed::TooManySlices(MAX_SLICES as u32 + 1) })
    );
    check("MAX_SLICES + 1 announced", over.len(), peak, 0);
}
