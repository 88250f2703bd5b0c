//! The chaos soak on a short schedule: `steady-lab chaos --tls` on a three-member etcd,
//! two steady-slicer instances, four backend processes and three frontends under load,
//! all on mutual TLS, while one round of faults runs (a backend killed, drained and
//! stalled, the leading instance killed, etcd's leader member killed, every certificate
//! rotated to a new CA); every invariant must hold, and each fault must have run and the
//! fleet recovered from it.
//!
//! A longer run: `cargo run --release -p steady-lab -- chaos --minutes 5`.

use std::path::PathBuf;
use std::process::Command;

/// Whether etcd can run here (the soak starts three members); prints why not when not,
/// and insists when `STEADY_REQUIRE_ETCD` is set.
fn etcd_installed() -> bool {
    let installed = Command::new(std::env::var("STEADY_ETCD_BIN").unwrap_or_else(|_| "etcd".into()))
        .arg("--version")
        .output()
        .is_ok();
    if !installed {
        assert!(std::env::var_os("STEADY_REQUIRE_ETCD").is_none(), "etcd is required but not installed");
        eprintln!("SKIPPED (etcd test): etcd is not installed");
    }
    installed
}

/// The steady-slicer binary next to steady-lab's, built now when it is missing (`cargo
/// test -p steady-lab` alone builds no other package's binary; `cargo test --workspace`
/// does).
fn slicer_binary() -> PathBuf {
    let lab = PathBuf::from(env!("CARGO_BIN_EXE_steady-lab"));
    let slicer = lab.with_file_name("steady-slicer");
    if !slicer.is_file() {
        let dir = lab.parent().and_then(|d| d.file_name()).and_then(|n| n.to_str()).unwrap_or("debug");
        let profile = if dir == "debug" { "dev" } else { dir };
        let status = Command::new(env!("CARGO"))
            .args(["build", "-p", "steady-slicer-server", "--bin", "steady-slicer", "--profile", profile])
            .status()
            .expect("cargo runs");
        assert!(status.success(), "cannot build steady-slicer");
    }
    slicer
}

/// One of each fault, in the order they run.
const FAULTS: &str = "backend-kill,backend-drain,backend-stall,slicer-kill,etcd-kill,cert-rotate";

/// The line of `report` starting with `label`.
fn line<'a>(report: &'a str, label: &str) -> &'a str {
    report.lines().find(|l| l.starts_with(label)).unwrap_or_else(|| panic!("no {label:?} in:\n{report}"))
}

#[test]
fn every_invariant_holds_through_one_round_of_faults() {
    if !etcd_installed() {
        return;
    }
    let slicer = slicer_binary();
    let output = Command::new(env!("CARGO_BIN_EXE_steady-lab"))
        .args(["chaos", "--tls", "--rounds", "1", "--warm-up", "3", "--faults", FAULTS, "--slicer-bin"])
        .arg(&slicer)
        .output()
        .unwrap();
    let report = String::from_utf8(output.stdout).unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{report}\n{stderr}");
    assert!(report.contains("verdict: every invariant held"), "{report}");
    for fault in FAULTS.split(',') {
        let done: Vec<&str> =
            report.lines().filter(|l| l.starts_with("fault ") && l.contains(fault)).collect();
        assert!(!done.is_empty(), "{fault} did not run:\n{report}");
        assert!(done.iter().all(|l| l.contains("recovered in")), "no recovery from {fault}:\n{report}");
    }
    assert!(line(&report, "fault ").contains("backend-kill"), "{report}");
    // Each fault ran once; the load ran throughout: three frontends at 60 requests a
    // second for the warm-up and the round (the faults' own waits and settling alone take
    // over 30 s).
    let ran: Vec<&str> = report.lines().filter(|l| l.starts_with("fault ")).collect();
    assert_eq!(ran.len(), FAULTS.split(',').count(), "{report}");
    let sent: u64 = line(&report, "requests: ").split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(sent > 3 * 60 * 30, "{report}");
    // Every invariant has its row, each of them holding: the rotation's among them.
    let rows: Vec<&str> = report.lines().filter(|l| l.ends_with("| holds |")).collect();
    assert!(rows.len() >= 16, "{report}");
    assert!(rows.iter().any(|r| r.contains("the dropped CA refused by every server")), "{report}");
    assert!(!report.contains("VIOLATED"), "{report}");
}

#[test]
fn a_fleet_too_small_is_refused_in_one_line() {
    let output =
        Command::new(env!("CARGO_BIN_EXE_steady-lab")).args(["chaos", "--backends", "2"]).output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("--backends"), "{stderr}");
}

#[test]
fn a_rotation_on_a_plaintext_fleet_is_refused_in_one_line() {
    let output = Command::new(env!("CARGO_BIN_EXE_steady-lab"))
        .args(["chaos", "--faults", "backend-kill,cert-rotate"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("--tls"), "{stderr}");
}
