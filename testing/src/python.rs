//! [`PythonGrpc`]: a Python interpreter with `grpcio` and `grpcio-tools`, for tests that
//! check steady against peers written in Python (not steady's code); [`PythonPeer`]
//! (feature `python`): one such peer running as a child process, read as JSON lines.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The environment variable that makes the Python gRPC tests mandatory: when it is set
/// (to anything but `0`), [`PythonGrpc::find`] panics instead of skipping when the
/// interpreter or its packages are missing. `scripts/test.sh`, and so CI, sets it.
pub const REQUIRE_PYTHON_GRPC: &str = "STEADY_REQUIRE_PYTHON_GRPC";

/// The environment variable naming the Python interpreter to run (default:
/// [`PYTHON_GRPC_VENV`]'s `bin/python` under the workspace).
pub const PYTHON_GRPC_BIN: &str = "STEADY_PYTHON_GRPC_BIN";

/// Where `scripts/test.sh` makes the virtual environment with `grpcio` and
/// `grpcio-tools` when it is missing, relative to the workspace's root.
pub const PYTHON_GRPC_VENV: &str = "target/python-grpc-venv";

/// A Python interpreter that imports `grpc` and `grpc_tools`.
#[derive(Debug, Clone)]
pub struct PythonGrpc {
    python: PathBuf,
}

impl PythonGrpc {
    /// The interpreter named by [`PYTHON_GRPC_BIN`], else the one in the workspace's
    /// [`PYTHON_GRPC_VENV`]; `None` (after printing that the test is skipped and how to
    /// make the environment) when it is missing or lacks the packages and
    /// [`REQUIRE_PYTHON_GRPC`] is not set.
    ///
    /// # Panics
    ///
    /// When it is missing and [`REQUIRE_PYTHON_GRPC`] is set.
    pub fn find() -> Option<Self> {
        let python = std::env::var_os(PYTHON_GRPC_BIN).map(PathBuf::from).unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(PYTHON_GRPC_VENV).join("bin/python")
        });
        let imports = Command::new(&python).args(["-c", "import grpc, grpc_tools"]).output();
        let problem = match imports {
            Ok(out) if out.status.success() => return Some(Self { python }),
            // The traceback's last line says what is missing.
            Ok(out) => String::from_utf8_lossy(&out.stderr).trim().lines().last().unwrap_or("").to_owned(),
            Err(e) => e.to_string(),
        };
        let message = format!(
            "{} cannot import grpc and grpc_tools ({problem}): run scripts/test.sh, which makes \
             {PYTHON_GRPC_VENV} with grpcio and grpcio-tools from PyPI, or set {PYTHON_GRPC_BIN}",
            python.display()
        );
        if std::env::var_os(REQUIRE_PYTHON_GRPC).is_some_and(|v| v != "0" && !v.is_empty()) {
            panic!("{message}; {REQUIRE_PYTHON_GRPC} is set, so the Python gRPC tests may not be skipped");
        }
        eprintln!("SKIPPED (Python gRPC test): {message}");
        None
    }

    /// The interpreter's path.
    pub fn python(&self) -> &Path {
        &self.python
    }
}

#[cfg(feature = "python")]
pub use peer::PythonPeer;

#[cfg(feature = "python")]
mod peer {
    use std::path::Path;
    use std::process::{ExitStatus, Stdio};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use serde_json::Value;
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
    use tokio::process::{Child, ChildStdin, ChildStdout, Command};

    use super::PythonGrpc;

    /// The most of a peer's standard error kept for a failure's message (its end).
    const STDERR_KEPT: usize = 16 * 1024;

    /// A Python script running as a child process that writes one JSON object per line on
    /// its standard output, each with an `"event"` field naming what happened. Its
    /// standard input stays open until [`PythonPeer::close_input`] (or the drop).
    ///
    /// Every wait is bounded: past its time, or when the peer exits first, it panics with
    /// the events read so far and the end of the peer's standard error. Dropping it kills
    /// the process, so a failing test leaves nothing running.
    #[derive(Debug)]
    pub struct PythonPeer {
        name: String,
        child: Child,
        stdin: Option<ChildStdin>,
        stdout: Lines<BufReader<ChildStdout>>,
        stderr: Arc<Mutex<String>>,
        seen: Vec<Value>,
    }

    impl PythonGrpc {
        /// Starts `script` with `args` under this interpreter. Needs a tokio runtime.
        ///
        /// # Panics
        ///
        /// When the process cannot be started.
        pub fn spawn<I, S>(&self, script: &Path, args: I) -> PythonPeer
        where
            I: IntoIterator<Item = S>,
            S: AsRef<std::ffi::OsStr>,
        {
            let mut child = Command::new(self.python())
                .arg(script)
                .args(args)
                .env("PYTHONUNBUFFERED", "1")
                // The source tree stays as it is: no __pycache__ beside the scripts.
                .env("PYTHONDONTWRITEBYTECODE", "1")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .unwrap_or_else(|e| {
                    panic!("cannot run {} {}: {e}", self.python().display(), script.display())
                });
            let stdin = child.stdin.take();
            let stdout = BufReader::new(child.stdout.take().expect("piped")).lines();
            let stderr = Arc::new(Mutex::new(String::new()));
            let mut pipe = child.stderr.take().expect("piped");
            let kept = Arc::clone(&stderr);
            // Drained as it comes, so that a chatty peer never blocks on a full pipe.
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                while let Ok(n @ 1..) = pipe.read(&mut buf).await {
                    let mut text = kept.lock().unwrap_or_else(|e| e.into_inner());
                    text.push_str(&String::from_utf8_lossy(&buf[..n]));
                    if text.len() > 2 * STDERR_KEPT {
                        let cut = text.len() - STDERR_KEPT;
                        let cut = (cut..text.len()).find(|&i| text.is_char_boundary(i)).unwrap_or(cut);
                        text.drain(..cut);
                    }
                }
            });
            let name = script
                .file_name()
                .map_or_else(|| script.display().to_string(), |n| n.to_string_lossy().into());
            PythonPeer { name, child, stdin, stdout, stderr, seen: Vec::new() }
        }
    }

    impl PythonPeer {
        /// The next event, or `None` when the peer closed its output (it exited).
        ///
        /// # Panics
        ///
        /// When none comes `within`, or a line is not a JSON object.
        pub async fn next_event(&mut self, within: Duration) -> Option<Value> {
            let line = match tokio::time::timeout(within, self.stdout.next_line()).await {
                Ok(Ok(line)) => line?,
                Ok(Err(e)) => self.fail(&format!("cannot read its output: {e}")),
                Err(_) => self.fail(&format!("no event within {within:?}")),
            };
            let event: Value = match serde_json::from_str(&line) {
                Ok(event @ Value::Object(_)) => event,
                _ => self.fail(&format!("printed a line that is not a JSON object: {line}")),
            };
            self.seen.push(event.clone());
            Some(event)
        }

        /// The next event named `name` (its `"event"` field), skipping others, which stay
        /// in [`PythonPeer::seen`].
        ///
        /// # Panics
        ///
        /// When none comes `within`, or the peer exits first.
        pub async fn event(&mut self, name: &str, within: Duration) -> Value {
            let deadline = tokio::time::Instant::now() + within;
            loop {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                match self.next_event(left).await {
                    Some(event) if event["event"] == name => return event,
                    Some(_) => {}
                    None => self.fail(&format!("exited before a {name:?} event")),
                }
            }
        }

        /// Reads every event until the peer exits, and its exit status.
        ///
        /// # Panics
        ///
        /// When it does not exit `within`.
        pub async fn finish(&mut self, within: Duration) -> ExitStatus {
            let deadline = tokio::time::Instant::now() + within;
            while self
                .next_event(deadline.saturating_duration_since(tokio::time::Instant::now()))
                .await
                .is_some()
            {}
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match tokio::time::timeout(left, self.child.wait()).await {
                Ok(Ok(status)) => status,
                Ok(Err(e)) => self.fail(&format!("cannot wait for it: {e}")),
                Err(_) => self.fail(&format!("did not exit within {within:?}")),
            }
        }

        /// Writes `line` (and a newline) to the peer's standard input: a command, for a
        /// peer that takes them.
        ///
        /// # Panics
        ///
        /// When the input was closed, or the peer is gone.
        pub async fn send_line(&mut self, line: &str) {
            let Some(stdin) = self.stdin.as_mut() else { self.fail("its input is closed") };
            let written = async {
                stdin.write_all(format!("{line}\n").as_bytes()).await?;
                stdin.flush().await
            };
            if let Err(e) = written.await {
                self.fail(&format!("cannot write {line:?} to its input: {e}"));
            }
        }

        /// Closes the peer's standard input: a signal a peer may wait for (the A119
        /// client's `--stay` leaves when it comes).
        pub fn close_input(&mut self) {
            self.stdin = None;
        }

        /// Every event read so far, in order.
        pub fn seen(&self) -> &[Value] {
            &self.seen
        }

        /// The events read so far named `name`.
        pub fn seen_named(&self, name: &str) -> Vec<&Value> {
            self.seen.iter().filter(|e| e["event"] == name).collect()
        }

        /// The end of what the peer wrote on its standard error so far.
        pub fn stderr(&self) -> String {
            self.stderr.lock().unwrap_or_else(|e| e.into_inner()).clone()
        }

        fn fail(&self, what: &str) -> ! {
            let events: Vec<String> = self.seen.iter().map(Value::to_string).collect();
            panic!(
                "{}: {what}\n-- its events:\n{}\n-- the end of its standard error:\n{}",
                self.name,
                events.join("\n"),
                self.stderr()
            )
        }
    }
}
