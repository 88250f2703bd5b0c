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

#[test]
fn bad_arguments_exit_non_zero_with_one_line() {
    for args in [
        vec!["--job", "users", "--tasks", "0"],
        vec!["--job", "users", "--tasks", "3", "--algorithm", "slicer"],
        vec!["--job", "users", "--tasks", "3", "--store", "etcd"],
        vec!["--job", "users", "--tasks", "3", "--max-replicas", "0"],
        vec!["--job", "users", "--tasks", "3", "--cadence-ms", "0"],
    ] {
        let out = Command::new(BIN).args(&args).output().unwrap();
        assert!(!out.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.trim().lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.starts_with("steady-slicer: "), "{args:?}: {stderr}");
    }
}
