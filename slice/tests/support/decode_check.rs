//! The check the `assignment_decode` fuzz target runs on arbitrary bytes (it includes
//! this file), and `tests/decode.rs` on fixed seeds, so the logic runs in CI although
//! the fuzzer does not.

use steady_slice::{Assignment, DecodeError, SliceKey};

/// Decodes arbitrary bytes as an assignment: never panics, and whatever decodes is a
/// valid assignment whose encoding is exactly those bytes (the format is canonical);
/// a malformed input names an offset inside the input.
///
/// # Panics
///
/// When that does not hold: that is the finding.
pub fn check_assignment_bytes(bytes: &[u8]) {
    match Assignment::decode(bytes) {
        Ok(assignment) => {
            assert_eq!(assignment.encode(), bytes, "decoding is not the inverse of encoding");
            assert!(!assignment.slices().is_empty());
            assert_eq!(assignment.slices()[0].start.get(), 0);
            for key in [0, u64::MAX, bytes.len() as u64] {
                let _ = assignment.slice_for(SliceKey(key));
            }
        }
        Err(DecodeError::Malformed { offset, .. }) => {
            assert!(offset <= bytes.len(), "offset {offset} past the input")
        }
        Err(_) => {}
    }
}
