//! Arbitrary bytes decode to a valid, canonically encoded assignment or a typed error,
//! never a panic. Run: `cd fuzz && cargo +nightly fuzz run assignment_decode`.
#![no_main]

use libfuzzer_sys::fuzz_target;

// The same check `slice/tests/decode.rs` runs on fixed seeds.
#[path = "../../slice/tests/support/decode_check.rs"]
mod decode_check;

fuzz_target!(|data: &[u8]| {
    decode_check::check_assignment_bytes(data);
});
