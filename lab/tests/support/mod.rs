//! Running a `steady-lab` experiment as a user runs it, for the experiments' tests.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

/// Runs `steady-lab <command> --quick`, its figures and JSON in a temporary folder of
/// its own; returns what it printed, its JSON rows and the folder (the caller removes
/// it). Panics, with the output, when it fails.
pub fn run_quick(command: &str) -> (String, Vec<Value>, PathBuf) {
    run_quick_with(command, &[], "")
}

/// Runs `steady-lab <command> --quick` with `args` as [`run_quick`] does, its files in a
/// temporary folder named for `tag` too, so that several runs of one test binary do not
/// share one.
pub fn run_quick_with(command: &str, args: &[&str], tag: &str) -> (String, Vec<Value>, PathBuf) {
    let tag = if tag.is_empty() { String::new() } else { format!("{tag}-") };
    let dir = std::env::temp_dir().join(format!("steady-lab-{command}-{tag}{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join(format!("{command}.json"));
    let out = Command::new(env!("CARGO_BIN_EXE_steady-lab"))
        .args([command, "--quick"])
        .args(args)
        .arg("--figures")
        .arg(&dir)
        .arg("--json")
        .arg(&json)
        .output()
        .expect("steady-lab runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    let rows: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    (text, rows, dir)
}
