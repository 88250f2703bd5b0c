//! `steady-slicer --fleet` instances run as processes, for the fleet tests: started on
//! loopback, killed when dropped, their stderr kept.

// Each test file uses part of it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tonic::transport::Endpoint;

const BIN: &str = env!("CARGO_BIN_EXE_steady-slicer");

/// One running instance: killed when dropped (SIGKILL: no resignation, as a crash);
/// its stderr lines kept.
pub struct Running {
    pub name: String,
    pub child: std::process::Child,
    /// Where it serves gRPC (from its first line).
    pub address: String,
    pub stderr: Arc<Mutex<Vec<String>>>,
    _stdout: std::io::Lines<BufReader<std::process::ChildStdout>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Running {
    /// Whether a line it wrote on stderr says `what`.
    pub fn said(&self, what: impl Fn(&str) -> bool) -> bool {
        self.stderr.lock().unwrap().iter().any(|line| what(line))
    }

    /// Its gRPC services, plaintext.
    pub fn endpoint(&self) -> Endpoint {
        Endpoint::from_shared(format!("http://{}", self.address)).unwrap()
    }
}

/// Starts instance `name` with `args` (and `--fleet`, loopback, port 0).
pub fn start(name: &str, args: &[&str]) -> Running {
    let mut child = Command::new(BIN)
        .args(["--fleet", "--candidate", name, "--listen", "127.0.0.1:0"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    // "steady-slicer: fleet instance NAME on ADDR (Etcd store), advertised as ADDR"
    let first = stdout.next().unwrap().unwrap();
    let address = first.split_whitespace().nth(5).unwrap_or_else(|| panic!("{first}")).to_owned();
    let stderr = Arc::new(Mutex::new(Vec::new()));
    let lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let kept = stderr.clone();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            kept.lock().unwrap().push(line);
        }
    });
    Running { name: name.to_owned(), child, address, stderr, _stdout: stdout }
}

/// Waits (polling every 50 ms) until `check` gives `Some`, within `limit`.
pub async fn until<T>(limit: Duration, what: &str, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "not within {limit:?}: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
