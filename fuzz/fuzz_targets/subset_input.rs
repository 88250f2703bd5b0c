//! Arbitrary (algorithm, frontend, backends, size) never panic and always give a valid
//! subset or the typed error. Run: `cd fuzz && cargo +nightly fuzz run subset_input`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    steady_tests::check_subset_input(data);
});
