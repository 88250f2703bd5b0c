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
//! Decoding checks every length against the bytes left before allocating, rejects
//! trailing bytes, and then validates the assignment as [`Assignment::new`] does, so
//! any input gives either a valid assignment or a typed error, never a panic.

use crate::assignment::{Assignment, AssignmentError, Slice, MAX_REPLICAS, MAX_SLICES};
use crate::slice_key::SliceKey;

const MAGIC: &[u8; 4] = b"STAS";
const VERSION: u8 = 1;

impl Assignment {
    /// The assignment in the version-1 wire format.
    pub fn encode(&self) -> Vec<u8> {
        let size = 17 + self.slices().iter().map(|s| 10 + 4 * s.replicas.len()).sum::<usize>();
        let mut out = Vec::with_capacity(size);
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        out.extend_from_slice(&self.generation().to_le_bytes());
        out.extend_from_slice(&(self.slices().len() as u32).to_le_bytes());
        for slice in self.slices() {
            out.extend_from_slice(&slice.start.get().to_le_bytes());
            out.extend_from_slice(&(slice.replicas.len() as u16).to_le_bytes());
            for task in &slice.replicas {
                out.extend_from_slice(&task.to_le_bytes());
            }
        }
        out
    }

    /// Reads an assignment in the version-1 wire format.
    ///
    /// # Errors
    ///
    /// [`AssignmentError::Malformed`] for a bad magic, version, truncated or trailing
    /// bytes, or counts above the limits; otherwise whatever [`Assignment::new`] finds.
    pub fn decode(bytes: &[u8]) -> Result<Self, AssignmentError> {
        let mut r = Reader { bytes, at: 0 };
        if r.take(4)? != MAGIC {
            return Err(r.malformed("not an assignment (bad magic)"));
        }
        if r.u8()? != VERSION {
            return Err(r.malformed("unsupported version"));
        }
        let generation = r.u64()?;
        let count = r.u32()? as usize;
        if count > MAX_SLICES {
            return Err(AssignmentError::TooManySlices { count });
        }
        // Each slice takes at least 10 bytes: do not trust the count further than that.
        if count > r.left() / 10 {
            return Err(r.malformed("slice count larger than the bytes that follow"));
        }
        let mut slices = Vec::with_capacity(count);
        for slice in 0..count {
            let start = SliceKey(r.u64()?);
            let n = r.u16()? as usize;
            if n > MAX_REPLICAS {
                return Err(AssignmentError::TooManyReplicas { slice, count: n });
            }
            let mut replicas = Vec::with_capacity(n.min(r.left() / 4));
            for _ in 0..n {
                replicas.push(r.u32()?);
            }
            slices.push(Slice { start, replicas });
        }
        if r.left() != 0 {
            return Err(r.malformed("trailing bytes"));
        }
        Assignment::new(generation, slices)
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn malformed(&self, reason: &'static str) -> AssignmentError {
        AssignmentError::Malformed { offset: self.at, reason }
    }

    fn left(&self) -> usize {
        self.bytes.len() - self.at
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], AssignmentError> {
        if self.left() < n {
            return Err(self.malformed("truncated"));
        }
        let out = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8, AssignmentError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, AssignmentError> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2 bytes")))
    }

    fn u32(&mut self) -> Result<u32, AssignmentError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }

    fn u64(&mut self) -> Result<u64, AssignmentError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wire_format_is_frozen() {
        let a = Assignment::new(
            7,
            vec![
                Slice { start: SliceKey(0), replicas: vec![1, 2] },
                Slice { start: SliceKey(1 << 63), replicas: vec![3] },
            ],
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
    fn malformed_bytes_are_typed_errors() {
        let good = Assignment::single(1, vec![4]).unwrap().encode();
        for cut in 0..good.len() {
            assert!(
                matches!(Assignment::decode(&good[..cut]), Err(AssignmentError::Malformed { .. })),
                "{cut}"
            );
        }
        let mut trailing = good.clone();
        trailing.push(0);
        assert_eq!(
            Assignment::decode(&trailing),
            Err(AssignmentError::Malformed { offset: good.len(), reason: "trailing bytes" })
        );
        let mut bad_version = good.clone();
        bad_version[4] = 2;
        assert!(matches!(
            Assignment::decode(&bad_version),
            Err(AssignmentError::Malformed { offset: 5, .. })
        ));
        // A huge slice count with few bytes behind it is refused before allocating.
        let header = &good[..13];
        let huge = [header, &u32::MAX.to_le_bytes()].concat();
        assert_eq!(
            Assignment::decode(&huge),
            Err(AssignmentError::TooManySlices { count: u32::MAX as usize })
        );
        let short = [header, &1000u32.to_le_bytes(), &[0; 30]].concat();
        assert!(matches!(Assignment::decode(&short), Err(AssignmentError::Malformed { offset: 17, .. })));
    }
}
