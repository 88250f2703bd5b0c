//! The `steady-slicer` binary: serves the job's assignment on loopback, and refuses bad
//! arguments with one line.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use futures_util::StreamExt;
use tonic::transport::Endpoint;

const BIN: &str = env!("CARGO_BIN_EXE_steady-slicer");

/// Kills the child when the test ends, however it ends.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn the_binary_serves_the_first_generation_to_a_watcher() {
    let mut child = Child(
        Command::new(BIN)
            .args(["--job", "users", "--tasks", "3", "--listen", "127.0.0.1:0", "--cadence-ms", "100"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut lines = BufReader::new(child.0.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    // "steady-slicer: job users on 127.0.0.1:PORT (Memory store), candidate assigner"
    let address = first.split_whitespace().nth(4).unwrap().to_owned();
    let endpoint = Endpoint::from_shared(format!("http://{address}")).unwrap();
    let mut watch = Box::pin(steady_tonic::watch_assignments(endpoint, "users", Default::default()).unwrap());
    let assignment =
        tokio::time::timeout(Duration::from_secs(10), watch.next()).await.unwrap().unwrap().unwrap();
    assert!(assignment.generation() >= 1);
    let tasks: std::collections::BTreeSet<u32> =
        assignment.slices().iter().flat_map(|s| s.replicas.iter().copied()).collect();
    assert_eq!(tasks.into_iter().collect::<Vec<_>>(), [0, 1, 2]);
}

/// Runs the binary on `args` (on loopback, port 0), killed after 60 s at most: it must
/// have exited by itself by then.
fn refused(args: &[&str]) -> (std::process::ExitStatus, String) {
    let mut child = Child(
        Command::new(BIN)
            .args(args)
            .args(["--listen", "127.0.0.1:0"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "{args:?}: still running after 60 s");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.0.stderr.take().unwrap(), &mut stderr).unwrap();
    (status, stderr)
}

/// Every argument is checked before the process starts serving: a refusal that would
/// repeat for as long as it runs (before: an empty or 300-byte `--candidate` made every
/// campaign fail, and the process served nothing, never exiting) is one line and an exit.
#[test]
fn bad_arguments_exit_non_zero_with_one_line() {
    let long = "c".repeat(300);
    for args in [
        vec!["--job", "users", "--tasks", "0"],
        vec!["--job", "users", "--tasks", "16777217"],
        vec!["--job", "users", "--tasks", "4294967295"],
        vec!["--job", "", "--tasks", "3"],
        vec!["--job", &long, "--tasks", "3"],
        vec!["--job", "users", "--tasks", "3", "--candidate", ""],
        vec!["--job", "users", "--tasks", "3", "--candidate", &long],
        vec!["--job", "users", "--tasks", "3", "--algorithm", "slicer"],
        vec!["--job", "users", "--tasks", "3", "--store", "etcd"],
        vec!["--job", "users", "--tasks", "3", "--endpoints", "http://127.0.0.1:2379"],
        vec!["--job", "users", "--tasks", "3", "--lease-ttl-secs", "5"],
        vec!["--job", "users", "--tasks", "3", "--max-replicas", "0"],
        vec!["--job", "users", "--tasks", "3", "--cadence-ms", "0"],
        // Every write of this job would be too large for the store.
        vec!["--job", "users", "--tasks", "1024"],
    ] {
        let (status, stderr) = refused(&args);
        assert!(!status.success(), "{args:?}");
        assert_eq!(stderr.trim().lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.starts_with("steady-slicer: --"), "{args:?}: {stderr}");
    }
}

/// What clap refuses is one line too (before: 3 to 6 lines of usage), naming the argument
/// and pointing at `--help`, with clap's exit code 2; `--help` and `--version` still print
/// as usual.
#[test]
fn arguments_clap_refuses_are_one_line_naming_the_argument() {
    for (args, named) in [
        (vec!["--job", "users", "--tasks", "3", "--frob"], "--frob"),
        (vec!["--job", "users", "--tasks", "-1"], "--tasks"),
        (vec!["--job", "users", "--tasks", "abc"], "--tasks"),
        (vec!["--job", "users", "--tasks", "3", "--cadence-ms", "-5"], "--cadence-ms"),
        (vec!["--job", "users", "--tasks", "3", "--store", "mongo"], "--store"),
        (vec!["--job", "users", "--tasks", "3", "--listen", "nowhere"], "--listen"),
        (vec!["--tasks", "3"], "--job"),
        (vec!["--job", "users"], "--tasks"),
        (vec!["--job", "users", "--tasks"], "--tasks"),
    ] {
        let out = Command::new(BIN).args(&args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.starts_with("steady-slicer: "), "{args:?}: {stderr}");
        assert!(stderr.contains(named), "{args:?} should name {named}: {stderr}");
        assert!(stderr.contains("'steady-slicer --help'"), "{args:?}: {stderr}");
    }
    let help = Command::new(BIN).arg("--help").output().unwrap();
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(help.status.success() && text.contains("--candidate <CANDIDATE>"), "{text}");
    let version = Command::new(BIN).arg("--version").output().unwrap();
    let text = String::from_utf8_lossy(&version.stdout);
    assert!(version.status.success() && text.starts_with("steady-slicer "), "{text}");
}
