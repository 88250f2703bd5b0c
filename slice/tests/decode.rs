//! The `assignment_decode` fuzz target's logic on fixed seeds: valid encodings with a
//! few bytes changed, and plain noise.

mod support {
    pub(crate) mod decode_check;
}

use steady_slice::{Assignment, Slice, SliceKey};
use steady_subset::prng::SplitMix64;
use support::decode_check::check_assignment_bytes;

#[test]
fn decode_fuzz_logic_holds_on_fixed_seeds() {
    let mut rng = SplitMix64::new(2026);
    let mut below = |n: u64| rng.below(n);
    for _ in 0..400 {
        let slices = below(5) + 1;
        let mut parts: Vec<Slice> = Vec::new();
        let mut start = 0u64;
        for _ in 0..slices {
            parts.push(Slice::new(SliceKey(start), vec![below(100) as u32]));
            start += below(1 << 40) + 1;
        }
        let mut bytes = Assignment::new(below(u64::MAX) + 1, parts).unwrap().encode();
        for _ in 0..below(4) {
            let at = below(bytes.len() as u64) as usize;
            bytes[at] = below(256) as u8;
        }
        check_assignment_bytes(&bytes);
        let noise: Vec<u8> = (0..below(64)).map(|_| below(256) as u8).collect();
        check_assignment_bytes(&noise);
    }
    check_assignment_bytes(&[]);
    check_assignment_bytes(b"STAS\x01");
}
