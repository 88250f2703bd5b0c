//! `steady-slicer --spec FILE`: a bad spec is one line naming the field, `--spec` beside
//! `--max-replicas` is refused, a spec the tasks meet runs with nothing violated, and one
//! they cannot meet runs with a warning and names the missed constraint on every status
//! line.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_steady-slicer");
/// The most any wait may take.
const WAIT: Duration = Duration::from_secs(30);

/// A job spec in a file of its own, removed when dropped.
struct SpecFile(std::path::PathBuf);

impl SpecFile {
    fn new(name: &str, json: &str) -> Self {
        let path = std::env::temp_dir().join(format!("steady-spec-{name}-{}.json", std::process::id()));
        std::fs::write(&path, json).unwrap();
        Self(path)
    }

    fn arg(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for SpecFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The binary, killed when the test ends; its stdout and stderr lines, read on threads
/// of their own (so a wait is bounded even when the binary prints nothing).
struct Running {
    child: std::process::Child,
    stdout: mpsc::Receiver<String>,
    stderr: mpsc::Receiver<String>,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn lines(from: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(from).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

fn start(args: &[&str]) -> Running {
    let mut child = Command::new(BIN)
        .args(args)
        .args(["--listen", "127.0.0.1:0", "--cadence-ms", "100"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = lines(child.stdout.take().unwrap());
    let stderr = lines(child.stderr.take().unwrap());
    Running { child, stdout, stderr }
}

impl Running {
    /// The next line of `from` for which `test` holds, within [`WAIT`].
    fn next(from: &mpsc::Receiver<String>, what: &str, test: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match from.recv_timeout(left) {
                Ok(line) if test(&line) => return line,
                Ok(_) => {}
                Err(_) => panic!("no line where {what} within {WAIT:?}"),
            }
        }
    }

    /// The next status line that follows a published generation (the status line
    /// reads the placement of the run that published it, or of a later one).
    fn status_line(&self) -> String {
        Self::next(&self.stdout, "a generation is published", |line| {
            line.strip_prefix("generation ")
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|g| g.parse::<u64>().ok())
                .is_some_and(|g| g >= 1)
        })
    }
}

/// Runs the binary on `args`, which it must refuse: its exit code and stderr.
fn refused(args: &[&str]) -> (Option<i32>, String) {
    let mut running = start(args);
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = running.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "{args:?}: still running after {WAIT:?}");
        std::thread::sleep(Duration::from_millis(20));
    };
    let stderr: Vec<String> = running.stderr.iter().collect();
    (status.code(), stderr.join("\n"))
}

const JOB: [&str; 4] = ["--job", "users", "--tasks", "4"];

#[test]
fn a_bad_spec_is_one_line_naming_the_field_and_exit_1() {
    for (json, named) in [
        (r#"{"goals": {"churn_budget": 2}}"#, "job spec: goals.churn_budget must be "),
        (r#"{"goals": {"max_imbalance": 0.5}}"#, "job spec: goals.max_imbalance must be "),
        (r#"{"replicas": {"min": 3, "max": 2}}"#, "job spec: replicas must be "),
        (r#"{"constraints": {"spread": "continents"}}"#, "job spec: constraints.spread must be "),
        (r#"{"tasks": [{"index": 1, "capacity": 0}]}"#, "job spec: tasks[0].capacity must be "),
        // An unknown field is refused, named: a typo must not pass unnoticed.
        (r#"{"goals": {"churn": 0.1}}"#, "unknown field `churn`"),
        ("{", "EOF"),
    ] {
        let spec = SpecFile::new("bad", json);
        let (code, stderr) = refused(&[&JOB[..], &["--spec", spec.arg()]].concat());
        assert_eq!(code, Some(1), "{json}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{json}: {stderr}");
        assert!(stderr.starts_with(&format!("steady-slicer: --spec {}: ", spec.arg())), "{json}: {stderr}");
        assert!(stderr.contains(named), "{json} should name {named:?}: {stderr}");
    }
    // A spec that is not there.
    let (code, stderr) = refused(&[&JOB[..], &["--spec", "/nonexistent/spec.json"]].concat());
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.starts_with("steady-slicer: --spec /nonexistent/spec.json: "), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

#[test]
fn a_spec_beside_max_replicas_is_refused_by_the_parser() {
    let spec = SpecFile::new("conflict", r#"{"replicas": {"min": 2}}"#);
    let (code, stderr) = refused(&[&JOB[..], &["--spec", spec.arg(), "--max-replicas", "2"]].concat());
    assert_eq!(code, Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("--max-replicas") && stderr.contains("--spec"), "{stderr}");
}

/// Tasks 0-1 in zone a and 2-3 in zone b (the spec's task rules: `--tasks` gives no zones).
const TWO_ZONES: &str = r#"{ "range": [0, 1], "zone": "a" }, { "range": [2, 3], "zone": "b" }"#;

#[test]
fn a_spec_the_tasks_meet_runs_with_nothing_violated() {
    let spec = SpecFile::new(
        "met",
        &format!(
            r#"{{ "replicas": {{ "min": 2 }}, "constraints": {{ "spread": "zones" }}, "tasks": [{TWO_ZONES}] }}"#
        ),
    );
    let running = start(&[&JOB[..], &["--spec", spec.arg()]].concat());
    // Two status lines after the first publication (one a second): neither names a
    // violation.
    for _ in 0..2 {
        let line = running.status_line();
        assert!(!line.contains("violated"), "{line}");
    }
    // No placement warning: the first stderr line is the one about reports.
    let first = Running::next(&running.stderr, "a warning", |_| true);
    assert!(first.starts_with("steady-slicer: warning: load reports are unauthenticated"), "{first}");
}

#[test]
fn a_spec_the_tasks_cannot_meet_runs_with_a_warning_and_names_the_missed_constraint() {
    let spec = SpecFile::new(
        "infeasible",
        &format!(
            r#"{{ "replicas": {{ "min": 2 }},
                 "constraints": {{ "spread": "zones", "replica_per_zone": true, "zones": ["a", "b", "c"] }},
                 "tasks": [{TWO_ZONES}] }}"#
        ),
    );
    let running = start(&[&JOB[..], &["--spec", spec.arg()]].concat());
    // The warning comes at the check, before the one about reports (at serving).
    let warning = Running::next(&running.stderr, "a warning", |_| true);
    assert_eq!(
        warning,
        "steady-slicer: warning: --spec: constraint replica-per-zone cannot be met: zone c has no serving task; \
         the best assignment the tasks allow is published"
    );
    // It runs: every status line after the first publication names the missed constraint
    // and how many slices miss it (every slice: no zone c), and nothing else.
    for _ in 0..2 {
        let line = running.status_line();
        let (_, missed) = line.split_once(" violated ").unwrap_or_else(|| panic!("no violation: {line}"));
        let (constraint, slices) = missed.split_once(' ').unwrap();
        assert_eq!(constraint, "replica-per-zone", "{line}");
        assert!(slices.parse::<usize>().is_ok_and(|n| n >= 1), "{line}");
    }
}
