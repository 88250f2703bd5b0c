//! Golden vectors: the frozen contract of steady-slice.
//!
//! Every client and server of a fleet must hash a key to the same slice key and read the
//! same bytes as the same assignment, whichever version of steady each runs. This test
//! recomputes the slice keys and the wire encoding recorded in `tests/golden/slicing.txt`
//! and fails on any difference. A failure means the change breaks every mixed-version
//! fleet: do not "fix" it by regenerating. Regenerate only to add vectors, with
//! `STEADY_BLESS=1 cargo test -p steady-slice --test golden`, and check that the diff only
//! adds lines.

use std::fmt::Write as _;
use std::path::PathBuf;

use steady_slice::{Assignment, Slice, SliceKey};

use steady_testing::check_golden_file;

fn golden_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests").join("golden").join(name)
}

/// Compares `computed` with the golden file `name` (see [`check_golden_file`]).
fn check(name: &str, computed: String) {
    check_golden_file(&golden_path(name), &computed);
}

/// Slice keys of a few byte strings (0 to 200 bytes: XXH3 has a code path per size
/// range) and one assignment's wire encoding.
fn slicing_file() -> String {
    let mut out = String::from("# steady-balance golden slice keys and wire format (frozen contract).\n");
    let texts: Vec<String> = vec![
        String::new(),
        "a".into(),
        "abc".into(),
        "user:42".into(),
        "0123456789abcdef".into(),
        "x".repeat(17),
        "y".repeat(64),
        "z".repeat(129),
        "w".repeat(200),
        "ünïcödé ключ".into(),
    ];
    for t in &texts {
        writeln!(out, "slice_key {:?}: {:#018x}", t, SliceKey::of(t).get()).unwrap();
    }
    let a = Assignment::new(
        9,
        vec![
            Slice::new(SliceKey(0), vec![3, 1]),
            Slice::new(SliceKey(1 << 40), vec![7]),
            Slice::new(SliceKey(u64::MAX), vec![0, 2, 4]),
        ],
    )
    .unwrap();
    let hex: String = a.encode().iter().map(|b| format!("{b:02x}")).collect();
    writeln!(out, "assignment v1: {hex}").unwrap();
    let handover = Assignment::new(
        10,
        vec![
            Slice::new(SliceKey(0), vec![3, 1]).with_warming([5]),
            Slice::new(SliceKey(1 << 40), vec![7]),
            Slice::new(SliceKey(u64::MAX), vec![0]).with_warming([6, 8]),
        ],
    )
    .unwrap();
    let hex: String = handover.encode().iter().map(|b| format!("{b:02x}")).collect();
    writeln!(out, "assignment v2 (warming tasks): {hex}").unwrap();
    out
}

#[test]
fn slice_keys_and_the_assignment_wire_format_match_the_golden_vectors() {
    check("slicing.txt", slicing_file());
}

/// Exclusive ownership's records, as stored in etcd.
fn guard_file() -> String {
    use steady_slice::guard::{Guard, Hold};
    let mut out = String::from("# steady exclusive ownership records (frozen contract).\n");
    for g in [
        Guard::Granted(1),
        Guard::Granted(u64::MAX),
        Guard::Recalling { from: 0, to: 1 },
        Guard::Recalling { from: 17, to: 18 },
    ] {
        writeln!(out, "guard {g:?}: {}", g.encode()).unwrap();
    }
    for h in [Hold::Full(17), Hold::Bridge { from: 17, to: 18 }] {
        writeln!(out, "hold {h:?}: {}", h.encode()).unwrap();
    }
    out
}

#[test]
fn exclusive_ownership_records_match_the_golden_file() {
    let computed = guard_file();
    check("guard.txt", computed.clone());
    // And every recorded value reads back as what it was written from.
    use steady_slice::guard::{Guard, Hold};
    for line in computed.lines().skip(1) {
        let (_, value) = line.rsplit_once(": ").unwrap();
        let read = Guard::decode(value.as_bytes())
            .map(|g| g.encode())
            .or_else(|_| Hold::decode(value.as_bytes()).map(|h| h.encode()));
        assert_eq!(read.as_deref(), Ok(value), "{line}");
    }
}
