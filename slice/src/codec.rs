//! The binary wire format of an [`Assignment`] (frozen).
//!
//! Version 1, all integers little-endian:
//!
//! ```text
//! magic        4 bytes   "STAS"
//! version      u8        1
//! generation   u64
//! slice count  u32
//! per slice:
//!   start      u64
//!   replicas   u16       count, then that many u32 task indices
//! ```
//!
//! Version 2 is version 1 with each slice's warming tasks after its replicas (`warming
//! u16` count, then that many u32 task indices). An assignment with no warming task is
//! always written as version 1, byte for byte what it was before version 2 existed, so
//! readers that know only version 1 keep reading every assignment outside a handover;
//! one with warming tasks is written as version 2, which such readers refuse by name
//! ([`Malformed::UnsupportedVersion`]) and keep their last good assignment.
//!
//! Decoding checks every length against the bytes left before allocating, rejects
//! trailing bytes, and validates the assignment as [`Assignment::new`] does, so any
//! input gives either a valid assignment or a typed error, never a panic. The two kinds
//! of error stay apart: [`DecodeError::Malformed`] for bytes that are not the format
//! (with the offset and the cause), [`DecodeError::Invalid`] for well-formed bytes that
//! carry an invalid assignment; bytes malformed anywhere are malformed, even after an
//! invalid slice.
//!
//! # Memory
//!
//! Slices are validated as they are read ([`AssignmentBuilder`]), and room is reserved
//! for no more slices than the bytes can hold valid ones (14 bytes each, 16 in version
//! 2), however many they announce, and a task takes as many bytes once read as on the
//! wire. A slice is 32 bytes once read, so decoding takes at most 2.6 times its input
//! (2.3 for the largest valid assignment) and a few KiB of scratch, and keeps nothing
//! once a slice is invalid. `tests/decode_memory.rs` measures it.

use std::fmt;

use crate::assignment::{Assignment, AssignmentBuilder, AssignmentError, MAX_REPLICAS, MAX_SLICES};
use crate::key::SliceKey;
use crate::slice::Slice;

const MAGIC: &[u8; 4] = b"STAS";
const VERSION: u8 = 1;
const VERSION_WARMING: u8 = 2;

/// Why bytes could not be decoded as an assignment.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeError {
    /// The bytes are not the wire format.
    Malformed {
        /// The byte offset where decoding stopped.
        offset: usize,
        /// What was wrong there.
        cause: Malformed,
    },
    /// The bytes are well formed, but the assignment they carry is invalid.
    Invalid(AssignmentError),
}

/// What was wrong with malformed bytes (see [`DecodeError::Malformed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Malformed {
    /// The first four bytes are not `STAS`.
    BadMagic,
    /// A version this library does not read.
    UnsupportedVersion(u8),
    /// The bytes end inside a field.
    Truncated,
    /// More slices than [`MAX_SLICES`].
    TooManySlices(u32),
    /// A slice count larger than the bytes that follow could hold.
    SliceCountBeyondInput(u32),
    /// A slice with more replicas than [`MAX_REPLICAS`].
    TooManyReplicas(u16),
    /// Bytes after the last slice.
    TrailingBytes,
}

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BadMagic => write!(f, "not an assignment (bad magic)"),
            Self::UnsupportedVersion(v) => {
                write!(f, "unsupported version {v} (this library reads {VERSION} and {VERSION_WARMING})")
            }
            Self::Truncated => write!(f, "truncated"),
            Self::TooManySlices(n) => write!(f, "{n} slices (limit {MAX_SLICES})"),
            Self::SliceCountBeyondInput(n) => {
                write!(f, "{n} slices announced, more than the bytes that follow hold")
            }
            Self::TooManyReplicas(n) => write!(f, "a slice with {n} replicas (limit {MAX_REPLICAS})"),
            Self::TrailingBytes => write!(f, "trailing bytes"),
        }
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Malformed { offset, cause } => write!(f, "malformed assignment at byte {offset}: {cause}"),
            Self::Invalid(e) => write!(f, "invalid assignment: {e}"),
        }
    }
}

impl std::error::Error for DecodeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Invalid(e) => Some(e),
            Self::Malformed { .. } => None,
        }
    }
}

impl From<AssignmentError> for DecodeError {
    fn from(e: AssignmentError) -> Self {
        Self::Invalid(e)
    }
}

impl Assignment {
    /// The assignment in the wire format: version 1, or version 2 when a slice has
    /// warming tasks.
    pub fn encode(&self) -> Vec<u8> {
        let warming = self.has_warming();
        let per_slice =
            |s: &Slice| 10 + 4 * s.replicas().len() + if warming { 2 + 4 * s.warming().len() } else { 0 };
        let size = 17 + self.slices().iter().map(per_slice).sum::<usize>();
        let mut out = Vec::with_capacity(size);
        out.extend_from_slice(MAGIC);
        out.push(if warming { VERSION_WARMING } else { VERSION });
        out.extend_from_slice(&self.generation().to_le_bytes());
        out.extend_from_slice(&(self.slices().len() as u32).to_le_bytes());
        let tasks = |out: &mut Vec<u8>, tasks: &[u32]| {
            out.extend_from_slice(&(tasks.len() as u16).to_le_bytes());
            for task in tasks {
                out.extend_from_slice(&task.to_le_bytes());
            }
        };
        for slice in self.slices() {
            out.extend_from_slice(&slice.start.get().to_le_bytes());
            tasks(&mut out, slice.replicas());
            if warming {
                tasks(&mut out, slice.warming());
            }
        }
        out
    }

    /// Reads an assignment in the wire format (version 1 or 2).
    ///
    /// # Errors
    ///
    /// [`DecodeError::Malformed`] for a bad magic or version, truncated or trailing
    /// bytes, or counts above the limits (at the offset of the field);
    /// [`DecodeError::Invalid`] with whatever [`Assignment::new`] finds in well-formed
    /// bytes.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader { bytes, at: 0 };
        if r.take(4)? != MAGIC {
            return Err(r.malformed_at(0, Malformed::BadMagic));
        }
        let version = r.u8()?;
        if version != VERSION && version != VERSION_WARMING {
            return Err(r.malformed_at(4, Malformed::UnsupportedVersion(version)));
        }
        let warming = version == VERSION_WARMING;
        let min_slice = if warming { 12 } else { 10 };
        let generation = r.u64()?;
        let count = r.u32()?;
        let count_at = r.at - 4;
        if count as usize > MAX_SLICES {
            return Err(r.malformed_at(count_at, Malformed::TooManySlices(count)));
        }
        // Each slice takes at least 10 bytes (12 in version 2): do not trust the count
        // further than that.
        if count as usize > r.left() / min_slice {
            return Err(r.malformed_at(count_at, Malformed::SliceCountBeyondInput(count)));
        }
        // Slices are validated as they are read, and a valid one takes at least 14 bytes
        // (16 in version 2: a replica's 4 more than the least): room is reserved for what
        // the bytes can hold, never more (32 bytes a slice: at most 2.3 times the input),
        // and nothing after the first invalid slice is kept. Reading goes on to
        // the end all the same, so that bytes malformed anywhere are `Malformed`.
        let mut building = AssignmentBuilder::new(generation, count as usize).map(|mut builder| {
            builder.reserve((count as usize).min(r.left() / (min_slice + 4)));
            builder
        });
        let mut tasks = Vec::new();
        for _ in 0..count {
            let start = SliceKey(r.u64()?);
            tasks.clear();
            let replicas = r.tasks(&mut tasks)?;
            if warming {
                r.tasks(&mut tasks)?;
            }
            if let Ok(builder) = &mut building {
                let slice = Slice::new(start, &tasks[..replicas]);
                let slice =
                    if tasks.len() == replicas { slice } else { slice.with_warming(&tasks[replicas..]) };
                if let Err(e) = builder.push(slice) {
                    // The slices read so far are dropped at once.
                    building = Err(e);
                }
            }
        }
        if r.left() != 0 {
            return Err(r.malformed_at(r.at, Malformed::TrailingBytes));
        }
        Ok(building?.finish()?)
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn malformed_at(&self, offset: usize, cause: Malformed) -> DecodeError {
        DecodeError::Malformed { offset, cause }
    }

    fn left(&self) -> usize {
        self.bytes.len() - self.at
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.left() < n {
            return Err(self.malformed_at(self.at, Malformed::Truncated));
        }
        let out = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2 bytes")))
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    /// A count (at most [`MAX_REPLICAS`]), then that many task indices, appended to
    /// `tasks` (scratch reused from slice to slice: at most `2 * MAX_REPLICAS` long);
    /// the count.
    fn tasks(&mut self, tasks: &mut Vec<u32>) -> Result<usize, DecodeError> {
        let n = self.u16()?;
        if n as usize > MAX_REPLICAS {
            return Err(self.malformed_at(self.at - 2, Malformed::TooManyReplicas(n)));
        }
        let n = n as usize;
        tasks.reserve(n.min(self.left() / 4));
        for _ in 0..n {
            tasks.push(self.u32()?);
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wire_format_is_frozen() {
        let a = Assignment::new(
            7,
            vec![Slice::new(SliceKey(0), vec![1, 2]), Slice::new(SliceKey(1 << 63), vec![3])],
        )
        .unwrap();
        let golden: Vec<u8> = [
            &b"STAS"[..],
            &[1],
            &7u64.to_le_bytes(),
            &2u32.to_le_bytes(),
            &0u64.to_le_bytes(),
            &2u16.to_le_bytes(),
            &1u32.to_le_bytes(),
            &2u32.to_le_bytes(),
            &(1u64 << 63).to_le_bytes(),
            &1u16.to_le_bytes(),
            &3u32.to_le_bytes(),
        ]
        .concat();
        assert_eq!(a.encode(), golden);
        assert_eq!(Assignment::decode(&golden).unwrap(), a);
    }

    #[test]
    fn warming_tasks_make_version_2_and_only_they_do() {
        let a = Assignment::new(
            8,
            vec![Slice::new(SliceKey(0), vec![1]).with_warming([5]), Slice::new(SliceKey(1 << 63), vec![3])],
        )
        .unwrap();
        let golden: Vec<u8> = [
            &b"STAS"[..],
            &[2],
            &8u64.to_le_bytes(),
            &2u32.to_le_bytes(),
            &0u64.to_le_bytes(),
            &1u16.to_le_bytes(),
            &1u32.to_le_bytes(),
            &1u16.to_le_bytes(),
            &5u32.to_le_bytes(),
            &(1u64 << 63).to_le_bytes(),
            &1u16.to_le_bytes(),
            &3u32.to_le_bytes(),
            &0u16.to_le_bytes(),
        ]
        .concat();
        assert_eq!(a.encode(), golden);
        assert_eq!(Assignment::decode(&golden).unwrap(), a);
        // Version 2 bytes without warming tasks read as the same assignment as version 1.
        let plain = Assignment::single(4, vec![2]).unwrap();
        let v2 = [&b"STAS"[..], &[2], &4u64.to_le_bytes(), &1u32.to_le_bytes(), &0u64.to_le_bytes()]
            .into_iter()
            .chain([&1u16.to_le_bytes()[..], &2u32.to_le_bytes(), &0u16.to_le_bytes()])
            .collect::<Vec<_>>()
            .concat();
        assert_eq!(Assignment::decode(&v2), Ok(plain.clone()));
        assert_eq!(plain.encode()[4], 1, "no warming task: written as version 1");
        // A warming task that is also a replica is refused as invalid, not malformed.
        let mut both = golden.clone();
        both[33..37].copy_from_slice(&1u32.to_le_bytes());
        assert_eq!(
            Assignment::decode(&both),
            Err(DecodeError::Invalid(AssignmentError::DuplicateWarming { slice: 0, task: 1 }))
        );
        // Truncated anywhere: a typed error, never a panic.
        for cut in 0..golden.len() {
            assert!(
                matches!(Assignment::decode(&golden[..cut]), Err(DecodeError::Malformed { .. })),
                "cut {cut}"
            );
        }
    }

    #[test]
    fn malformed_bytes_are_typed_errors_naming_the_field() {
        // magic 0..4, version 4, generation 5..13, count 13..17, start 17..25,
        // replica count 25..27, replica 27..31.
        let good = Assignment::single(1, vec![4]).unwrap().encode();
        assert_eq!(good.len(), 31);
        let malformed = |offset, cause| Err(DecodeError::Malformed { offset, cause });
        for cut in 0..good.len() {
            let expected = match cut {
                0..=3 => malformed(0, Malformed::Truncated),
                4 => malformed(4, Malformed::Truncated),
                5..=12 => malformed(5, Malformed::Truncated),
                13..=16 => malformed(13, Malformed::Truncated),
                // One slice needs at least 10 more bytes than there are.
                17..=26 => malformed(13, Malformed::SliceCountBeyondInput(1)),
                _ => malformed(27, Malformed::Truncated),
            };
            assert_eq!(Assignment::decode(&good[..cut]), expected, "cut at {cut}");
        }
        let mut trailing = good.clone();
        trailing.push(0);
        assert_eq!(Assignment::decode(&trailing), malformed(31, Malformed::TrailingBytes));
        let mut bad_magic = good.clone();
        bad_magic[0] = b'X';
        assert_eq!(Assignment::decode(&bad_magic), malformed(0, Malformed::BadMagic));
        let mut bad_version = good.clone();
        bad_version[4] = 3;
        assert_eq!(Assignment::decode(&bad_version), malformed(4, Malformed::UnsupportedVersion(3)));
        let mut many_replicas = good.clone();
        many_replicas[25..27].copy_from_slice(&(MAX_REPLICAS as u16 + 1).to_le_bytes());
        assert_eq!(
            Assignment::decode(&many_replicas),
            malformed(25, Malformed::TooManyReplicas(MAX_REPLICAS as u16 + 1))
        );
        // A huge slice count with few bytes behind it is refused before allocating.
        let header = &good[..13];
        let huge = [header, &u32::MAX.to_le_bytes()].concat();
        assert_eq!(Assignment::decode(&huge), malformed(13, Malformed::TooManySlices(u32::MAX)));
        let short = [header, &1000u32.to_le_bytes(), &[0; 30]].concat();
        assert_eq!(Assignment::decode(&short), malformed(13, Malformed::SliceCountBeyondInput(1000)));
    }

    #[test]
    fn well_formed_bytes_of_an_invalid_assignment_are_a_validation_error() {
        let mut bytes = Assignment::single(1, vec![4]).unwrap().encode();
        // Slice 0 starting at 5 instead of 0.
        bytes[17] = 5;
        let error = Assignment::decode(&bytes).unwrap_err();
        assert_eq!(error, DecodeError::Invalid(AssignmentError::FirstStartNotZero { start: SliceKey(5) }));
        assert!(std::error::Error::source(&error).is_some());
        assert_eq!(error.to_string(), "invalid assignment: first slice starts at 0x0000000000000005, not 0");
        // Generation 0 (bytes 5..13) means "none": well formed, not an assignment.
        let mut zero = Assignment::single(1, vec![4]).unwrap().encode();
        zero[5..13].copy_from_slice(&0u64.to_le_bytes());
        assert_eq!(Assignment::decode(&zero), Err(DecodeError::Invalid(AssignmentError::ZeroGeneration)));
        // Slices are validated as they are read, but bytes malformed after an invalid
        // slice (or after a refused generation) are still malformed, as before.
        let two =
            Assignment::new(1, vec![Slice::new(SliceKey(0), [4]), Slice::new(SliceKey(9), [5])]).unwrap();
        let mut bytes = two.encode();
        bytes[17] = 5;
        assert!(matches!(Assignment::decode(&bytes), Err(DecodeError::Invalid(_))));
        bytes.pop();
        assert_eq!(
            Assignment::decode(&bytes),
            Err(DecodeError::Malformed { offset: 41, cause: Malformed::Truncated })
        );
        zero.push(0);
        assert_eq!(
            Assignment::decode(&zero),
            Err(DecodeError::Malformed { offset: 31, cause: Malformed::TrailingBytes })
        );
    }

    /// 1,000 slices of 10 bytes (no replica): as many as the bytes can hold, none of
    /// them valid. Refused at the first (nothing more is built), read to the end (bytes
    /// malformed further on are malformed).
    #[test]
    fn an_invalid_slice_stops_the_building_not_the_reading() {
        let header = &Assignment::single(1, vec![4]).unwrap().encode()[..13];
        let mut empty = [header, &1000u32.to_le_bytes(), &[0; 10_000]].concat();
        assert_eq!(
            Assignment::decode(&empty),
            Err(DecodeError::Invalid(AssignmentError::NoReplicas { slice: 0 }))
        );
        // The last slice announces a replica the bytes do not hold.
        let last = 17 + 999 * 10 + 8;
        empty[last..last + 2].copy_from_slice(&1u16.to_le_bytes());
        assert_eq!(
            Assignment::decode(&empty),
            Err(DecodeError::Malformed { offset: last + 2, cause: Malformed::Truncated })
        );
    }
}
