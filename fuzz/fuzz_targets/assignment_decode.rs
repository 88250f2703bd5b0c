//! Arbitrary bytes decode to a valid, canonically encoded assignment or a typed error,
//! never a panic. Run: `cd fuzz && cargo +nightly fuzz run assignment_decode`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    steady_tests::check_assignment_bytes(data);
});
