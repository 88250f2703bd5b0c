//! [`Browser`]: a real headless Chromium, run once per page, for tests of HTML pages.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The environment variable that makes the browser tests mandatory: when it is set (to
/// anything but `0`), [`Browser::find`] panics instead of skipping when Chromium is
/// missing. `scripts/test.sh`, and so CI, sets it.
pub const REQUIRE_BROWSER: &str = "STEADY_REQUIRE_BROWSER";

/// The environment variable naming the browser binary (default: `chromium` on PATH).
pub const BROWSER_BIN: &str = "STEADY_BROWSER_BIN";

/// The longest a page may take to load and render.
pub const PAGE_TIMEOUT: Duration = Duration::from_secs(60);

/// Debian's `chromium`, headless: each call starts it on one page, with a profile
/// directory of its own, and waits (at most [`PAGE_TIMEOUT`]) for it to exit.
#[derive(Debug, Clone)]
pub struct Browser {
    binary: String,
}

impl Browser {
    /// The browser, or `None` (after printing that the test is skipped and what to
    /// install) when it is missing and [`REQUIRE_BROWSER`] is not set.
    ///
    /// # Panics
    ///
    /// When it is missing and [`REQUIRE_BROWSER`] is set.
    pub fn find() -> Option<Self> {
        let binary = std::env::var(BROWSER_BIN).unwrap_or_else(|_| "chromium".to_owned());
        if Command::new(&binary).arg("--version").output().is_ok_and(|o| o.status.success()) {
            return Some(Self { binary });
        }
        let message = format!(
            "`{binary}` not found: install Debian's chromium (`apt-get install chromium`, or run \
             scripts/test.sh, which does) or set {BROWSER_BIN}"
        );
        if std::env::var_os(REQUIRE_BROWSER).is_some_and(|v| v != "0" && !v.is_empty()) {
            panic!("{message}; {REQUIRE_BROWSER} is set, so the browser tests may not be skipped");
        }
        let _ = writeln!(std::io::stderr(), "SKIPPED (browser test): {message}");
        None
    }

    /// The DOM of `url` once loaded and rendered, serialized (`--dump-dom`).
    ///
    /// # Panics
    ///
    /// When the browser fails, or takes longer than [`PAGE_TIMEOUT`].
    pub fn dump_dom(&self, url: &str) -> String {
        String::from_utf8_lossy(&self.run(&["--dump-dom", url])).into_owned()
    }

    /// A PNG screenshot of `url` at `width` x `height` pixels, written to `path`.
    ///
    /// # Panics
    ///
    /// As [`Browser::dump_dom`], or when no screenshot was written.
    pub fn screenshot(&self, url: &str, path: &Path, width: u32, height: u32) {
        let _ = std::fs::remove_file(path);
        self.run(&[
            &format!("--screenshot={}", path.display()),
            &format!("--window-size={width},{height}"),
            "--hide-scrollbars",
            url,
        ]);
        let size = std::fs::metadata(path).map_or(0, |m| m.len());
        assert!(size > 0, "no screenshot at {}", path.display());
    }

    fn run(&self, args: &[&str]) -> Vec<u8> {
        let profile = crate::temp_dir("steady-browser");
        let mut child = Command::new(&self.binary)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", self.binary));
        // Read while it runs: a page's DOM may not fit in the pipe.
        let mut stdout = child.stdout.take().expect("piped");
        let reader = std::thread::spawn(move || {
            let mut out = Vec::new();
            let _ = std::io::Read::read_to_end(&mut stdout, &mut out);
            out
        });
        let deadline = Instant::now() + PAGE_TIMEOUT;
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait for the browser") {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                let _ = std::fs::remove_dir_all(&profile);
                panic!("{} {args:?}: not done in {PAGE_TIMEOUT:?}", self.binary);
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let out = reader.join().unwrap_or_default();
        let _ = std::fs::remove_dir_all(&profile);
        if !status.success() {
            let mut err = String::new();
            if let Some(mut stderr) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut stderr, &mut err);
            }
            panic!(
                "{} {args:?} exited with {status}: {}",
                self.binary,
                err.lines().last().unwrap_or_default()
            );
        }
        out
    }
}
