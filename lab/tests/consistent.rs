//! `steady-lab consistent`, the availability benchmark of exclusive ownership, run as a
//! user runs it (a small fleet, a few seconds per mode, on a real etcd): every mode runs
//! and prints its row, the Assigner changes the assignment under the exclusive modes, and
//! no backend of an exclusive job ever answers for a key it does not hold, nor while
//! another backend holds it. Availability is measured, never asserted: it depends on the
//! machine.

use std::process::Command;

/// The columns of a mode's row (see `lab/src/consistent/table.rs`).
#[derive(Debug)]
struct Row {
    requests: u64,
    satisfied_share: f64,
    unowned: u64,
    overlaps: u64,
    generations: u64,
}

/// The row of `mode` in `text`.
fn row(text: &str, mode: &str) -> Row {
    let line = text
        .lines()
        .find(|l| l.split_whitespace().next() == Some(mode))
        .unwrap_or_else(|| panic!("no row for {mode} in\n{text}"));
    let cells: Vec<&str> = line.split_whitespace().collect();
    let number = |i: usize| -> u64 { cells[i].parse().unwrap_or_else(|_| panic!("column {i} of {line:?}")) };
    Row {
        requests: number(1),
        satisfied_share: cells[2].trim_end_matches('%').parse().unwrap(),
        unowned: number(5),
        overlaps: number(6),
        generations: number(11),
    }
}

#[test]
fn every_mode_runs_and_no_exclusive_backend_answers_for_a_key_it_does_not_own() {
    let Some(etcd) = steady_testing::Etcd::start() else { return };
    let out = Command::new(env!("CARGO_BIN_EXE_steady-lab"))
        .arg("consistent")
        .args(["--seconds", "4", "--shift-every", "1", "--frontends", "3", "--backends", "4"])
        .args(["--rate", "100", "--keys", "500", "--endpoints", &etcd.endpoint()])
        .output()
        .expect("steady-lab runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    for mode in ["exclusive", "exclusive-no-bridge", "eventual"] {
        let row = row(&text, mode);
        assert!(row.requests > 0 && row.satisfied_share > 0.0, "{mode}: nothing answered\n{text}");
        if mode != "eventual" {
            assert!(row.generations >= 1, "{mode}: the Assigner published nothing under load\n{text}");
            assert_eq!(row.unowned, 0, "{mode}: answered by a backend that did not own the key\n{text}");
            assert_eq!(row.overlaps, 0, "{mode}: answered while another backend held the key\n{text}");
        }
    }
    assert!(text.contains("# satisfied: exclusive with the bridge "), "{text}");
}
