//! Checks shared by steady's tests and its `subset_input` fuzz target (the assignment
//! decoder's check lives with `steady-slice`, in `slice/tests/support/decode_check.rs`).
//!
//! The fuzz targets in `fuzz/` (a workspace of their own, run with cargo-fuzz on
//! nightly) call these functions with arbitrary bytes; the ordinary tests call them on
//! fixed seeds, so the logic runs in CI even though the fuzzer does not.

#![deny(unsafe_code)]
#![warn(missing_docs)]

use steady_subset::{Algorithm, SubsetError, Subsetting, MAX_BACKENDS};

/// Reads a little-endian `u64` from `bytes` at `at`, padding with zeros.
fn word(bytes: &[u8], at: usize) -> u64 {
    let mut buf = [0u8; 8];
    for (i, b) in buf.iter_mut().enumerate() {
        *b = bytes.get(at + i).copied().unwrap_or(0);
    }
    u64::from_le_bytes(buf)
}

/// Decodes `(algorithm, frontend, backends, size, lot size)` from fuzz bytes and checks
/// every subset invariant: no panic; `N > MAX_BACKENDS` is the typed error; otherwise
/// `min(k, N)` distinct members below `N`, the same on a second call, and for ordered
/// algorithms the prefix of the order.
///
/// Backends are mostly kept small (below 2^16) so the fuzzer spends its time on shapes,
/// not on shuffling millions of tasks, but the top bit of the selector lets any `usize`
/// through to exercise the limit.
///
/// # Panics
///
/// When an invariant does not hold: that is the finding.
pub fn check_subset_input(bytes: &[u8]) {
    let selector = word(bytes, 0);
    let frontend = word(bytes, 8) as usize;
    let raw_backends = word(bytes, 16) as usize;
    let size = word(bytes, 24) as usize;
    let backends = if selector >> 63 == 1 { raw_backends } else { raw_backends % (1 << 16) };
    let size = if selector >> 62 & 1 == 1 { size } else { size % 1024 };

    // Every named algorithm (the default, rocksteadier-decimal, included), then both lot
    // designs with any lot size below 40 and any seed.
    let named = Algorithm::NAMES.len();
    let lot_size = (selector >> 8) as usize % 40;
    let lots = match (selector % (named as u64 + 2)) as usize {
        i if i < named => Ok(Algorithm::all().swap_remove(i)),
        i if i == named => steady_subset::Rocksteadier::with_lot_size(lot_size)
            .map(|r| Algorithm::Rocksteadier(r.with_seed(selector >> 16))),
        _ => steady_subset::DecimalRocksteadier::with_lot_size(lot_size)
            .map(|r| Algorithm::DecimalRocksteadier(r.with_seed(selector >> 16))),
    };
    let algorithm = match lots {
        Ok(a) => a,
        Err(SubsetError::InvalidLotSize { lot_size: 0, .. }) => return,
        Err(e) => panic!("lot size below 40 rejected: {e}"),
    };

    let subset = match algorithm.subset(frontend, backends, size) {
        Err(SubsetError::TooManyBackends { backends: b, max }) => {
            assert!(b == backends && max == MAX_BACKENDS && backends > MAX_BACKENDS);
            return;
        }
        Err(e) => panic!("unexpected error {e}"),
        Ok(s) => s,
    };
    assert!(backends <= MAX_BACKENDS);
    assert_eq!(subset.len(), size.min(backends));
    assert!(subset.iter().all(|&b| b < backends));
    let mut sorted = subset.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), subset.len(), "duplicate members");
    assert_eq!(algorithm.subset(frontend, backends, size).unwrap(), subset);
    if let Some(order) = algorithm.order(frontend, backends).unwrap() {
        let prefix: Vec<usize> = order.take(subset.len()).collect();
        assert_eq!(prefix, subset, "the subset is not the prefix of the order");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use steady_subset::prng::SplitMix64;

    #[test]
    fn subset_fuzz_logic_holds_on_fixed_seeds() {
        let mut rng = SplitMix64::new(2026);
        for _ in 0..400 {
            let mut bytes = [0u8; 32];
            for chunk in bytes.chunks_mut(8) {
                chunk.copy_from_slice(&rng.next().to_le_bytes());
            }
            check_subset_input(&bytes);
        }
        check_subset_input(&[]);
        check_subset_input(&[0xff; 32]);
        check_subset_input(&[0x80; 5]);
    }
}
