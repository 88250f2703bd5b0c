//! Test support shared by steady's crates (a dev-dependency only; not published).
//!
//! * [`Etcd`]: a real, single-member `etcd` server on 127.0.0.1, on free ports, with its
//!   data in a temporary directory, killed and removed on drop. Tests that need etcd
//!   start one each, so they run in parallel without sharing state.
//!
//! # When `etcd` is missing
//!
//! [`Etcd::start`] returns `None` after printing what to install (Debian's
//! `etcd-server`) and the test returns early: a developer without etcd sees the etcd
//! tests skipped, with the reason, in the test output. With the environment variable
//! [`REQUIRE_ETCD`] (`STEADY_REQUIRE_ETCD`) set to anything but `0`, as `scripts/test.sh`
//! and so `.ci/run` set it, a missing `etcd` is a test failure instead: CI can never pass
//! by skipping them.
//!
//! ```no_run
//! # fn test() {
//! let Some(etcd) = steady_testing::Etcd::start() else { return };
//! let endpoint = etcd.endpoint(); // "http://127.0.0.1:<port>"
//! # let _ = endpoint;
//! # }
//! ```
//!
//! [`EtcdCluster`] runs three (or more) members as production does, for what a single
//! member cannot show: a leader killed and another elected, a member stopped while the
//! others keep quorum, the whole cluster restarted on its data.
//!
//! [`Etcd::start_with`] starts one as deployments run it: serving clients over TLS
//! (optionally requiring client certificates), with authentication enabled and users
//! that may use only their prefix, or both ([`EtcdOptions`]).
//!
//! * [`Browser`]: Debian's Chromium, headless, for pages: the DOM it renders and a
//!   screenshot. Missing, it skips the test unless [`REQUIRE_BROWSER`] is set (as
//!   `scripts/test.sh` sets it), as for etcd.
//! * [`PythonGrpc`]: a Python interpreter with `grpcio` and `grpcio-tools` (the virtual
//!   environment `scripts/test.sh` makes at [`PYTHON_GRPC_VENV`]), for tests against
//!   peers written in Python; missing, it skips the test unless [`REQUIRE_PYTHON_GRPC`]
//!   is set, as for etcd. With the feature `python`, `PythonPeer` runs one such peer and
//!   reads its standard output as JSON lines, each wait bounded, killed on drop.
//! * [`wait`]: bounded waits for the state a test asserts (`eventually` and its kin):
//!   a condition polled until it holds, never a fixed sleep, and a panic naming what the
//!   test waited for when it does not come in time.
//! * [`check_golden_file`]: a frozen contract written out as text (golden vectors),
//!   compared line by line with what the code computes now.
//! * [`percentile`]: the nearest-rank latency percentile the lab and the benchmarks
//!   report.
//! * `tls::TestPki` (feature `tls`): a certificate authority for one test and the
//!   leaf certificates it signs, as PEM and as files.
//! * `loopback` and `echo` (feature `grpc`): tonic servers on 127.0.0.1 that stop when
//!   their guard is dropped, and the echo service (`proto/echo.proto`, package
//!   `steady.echo.v1`) with backends that answer with their task index, for the tests,
//!   the benchmarks, the lab and the examples.
//! * `proxy::FaultProxy` (feature `proxy`): a TCP forwarder on 127.0.0.1 in front of one
//!   server (etcd's client port), for injecting faults into one process's link to it: cut
//!   every connection and refuse new ones until restored, or hold the server's answers
//!   back a delay while requests still go through at once; bounded in connections and
//!   buffered bytes, stopped when dropped.
//! * `clock::monotonic_nanos` (feature `clock`): `CLOCK_MONOTONIC` in nanoseconds, the
//!   one clock every process on the machine shares, so that intervals measured in
//!   different processes can be compared.
//!
//! # Dependencies
//!
//! std only by default: the harness starts the `etcd` binary, asks its `/health` over
//! plain HTTP/1.1 (on the metrics port, which stays plaintext when clients use TLS) and
//! sets users up through etcd's JSON gateway (on a plaintext client port of its own when
//! clients use TLS), so it compiles no etcd client and any
//! crate's tests can use it. Every dependency is optional: the `tls` feature adds
//! `rcgen` (on ring) to make certificates; `tokio` adds tokio for the async waits;
//! `grpc` adds tonic and prost, and generates the echo service's code at build time with
//! a protoc that cargo installs (`protoc-bin-vendored`), as steady-proto does; `proxy`
//! adds tokio's networking; `clock` adds `rustix` (its safe `clock_gettime`); `python` adds
//! tokio's processes and `serde_json`;
//! `alloc-count` adds nothing but the crate's one unsafe module, a counting allocator.
//!
//! A dev-dependency of the published crates only (it is never published); the
//! unpublished ones (the lab, the benchmarks, the examples, the workspace's tests)
//! depend on it normally.

// Unsafe code nowhere but in the counting allocator, which needs it (feature `alloc-count`).
#![cfg_attr(not(feature = "alloc-count"), forbid(unsafe_code))]
#![cfg_attr(feature = "alloc-count", deny(unsafe_code))]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub, rust_2018_idioms)]

#[cfg(feature = "alloc-count")]
pub mod alloc_count;
mod browser;
#[cfg(feature = "clock")]
pub mod clock;
mod cluster;
#[cfg(feature = "grpc")]
pub mod echo;
mod golden;
#[cfg(feature = "grpc")]
pub mod loopback;
mod percentile;
#[cfg(feature = "proxy")]
pub mod proxy;
mod python;
#[cfg(feature = "tls")]
pub mod tls;
pub mod wait;

pub use browser::{Browser, BROWSER_BIN, PAGE_TIMEOUT, REQUIRE_BROWSER};
pub use cluster::EtcdCluster;
pub use golden::check_golden_file;
pub use percentile::percentile;
#[cfg(feature = "python")]
pub use python::PythonPeer;
pub use python::{PythonGrpc, PYTHON_GRPC_BIN, PYTHON_GRPC_VENV, REQUIRE_PYTHON_GRPC};
pub use wait::eventually_blocking;
#[cfg(feature = "tokio")]
pub use wait::{eventually, eventually_within, holds_within, within};

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The environment variable that makes the etcd tests mandatory: when it is set (to
/// anything but `0`), [`Etcd::start`] panics instead of skipping when it cannot start
/// `etcd`.
pub const REQUIRE_ETCD: &str = "STEADY_REQUIRE_ETCD";

/// The environment variable naming the `etcd` binary to run (default: `etcd` on PATH).
pub const ETCD_BIN: &str = "STEADY_ETCD_BIN";

/// How long [`Etcd::start`] and [`Etcd::restart`] wait for the server to answer.
pub const START_TIMEOUT: Duration = Duration::from_secs(20);

/// How many times [`Etcd::start`] picks new ports when the server dies at once (another
/// process took a port between our picking it and etcd binding it).
const PORT_ATTEMPTS: usize = 5;

/// A running single-member `etcd` on 127.0.0.1, for one test.
///
/// Its client and peer ports were free when it started (bound, then released; a race
/// for them is retried with new ports), and lie below the kernel's ephemeral range, so
/// that clients reconnecting while it is killed cannot take them before
/// [`Etcd::restart`] binds them again. Its data directory is a fresh temporary
/// directory. Dropping it kills the server and removes the directory, so a failing test
/// leaves nothing running.
#[derive(Debug)]
pub struct Etcd {
    child: Option<Child>,
    dir: PathBuf,
    client: SocketAddr,
    peer: SocketAddr,
    /// Serves `/health` (and `/metrics`) over plain HTTP whatever the clients speak.
    metrics: SocketAddr,
    /// With [`EtcdOptions::tls`] and [`EtcdOptions::auth`] together: a second client
    /// listener, plaintext, which only the harness uses (to set the users up through the
    /// JSON gateway, which it speaks over plain HTTP/1.1). Never advertised.
    setup: Option<SocketAddr>,
    options: EtcdOptions,
    /// Its name among the members (`steady-test` alone).
    name: String,
    /// `--initial-cluster`: every member's name and peer URL (itself alone when `None`).
    initial_cluster: Option<String>,
    /// While it is killed: its ports, held for its restart ([`Etcd::kill`]).
    reserved: Vec<TcpListener>,
}

/// How [`Etcd::start_with`] runs the server: TLS for clients, client certificates, and
/// authentication with users. The default is what [`Etcd::start`] runs: plaintext, no
/// authentication.
#[derive(Debug, Clone, Default)]
pub struct EtcdOptions {
    tls: Option<ServerTls>,
    root_password: Option<String>,
    users: Vec<EtcdUser>,
}

#[derive(Debug, Clone)]
struct ServerTls {
    cert_file: PathBuf,
    key_file: PathBuf,
    client_ca_file: Option<PathBuf>,
}

#[derive(Debug, Clone)]
struct EtcdUser {
    name: String,
    password: String,
    prefix: String,
}

impl EtcdOptions {
    /// Plaintext, no authentication.
    pub fn new() -> Self {
        Self::default()
    }

    /// Serve clients over TLS with this certificate and key (PEM files); the endpoint
    /// becomes `https://127.0.0.1:<port>`. The certificate must name `127.0.0.1` (or the
    /// client must be told which name to check).
    pub fn tls(mut self, cert_file: impl Into<PathBuf>, key_file: impl Into<PathBuf>) -> Self {
        self.tls =
            Some(ServerTls { cert_file: cert_file.into(), key_file: key_file.into(), client_ca_file: None });
        self
    }

    /// With [`EtcdOptions::tls`]: require every client to present a certificate signed by
    /// the CA in `ca_file` (etcd's `--client-cert-auth`).
    ///
    /// # Panics
    ///
    /// When [`EtcdOptions::tls`] was not called first.
    pub fn client_cert_auth(mut self, ca_file: impl Into<PathBuf>) -> Self {
        let tls = self.tls.as_mut().expect("client_cert_auth needs tls first");
        tls.client_ca_file = Some(ca_file.into());
        self
    }

    /// Enable authentication, with user `root` (every permission) and this password.
    /// With [`EtcdOptions::tls`] too, the server also listens on a plaintext client port
    /// of its own that only the harness uses, to set the users up (clients are given the
    /// TLS endpoint only).
    pub fn auth(mut self, root_password: impl Into<String>) -> Self {
        self.root_password = Some(root_password.into());
        self
    }

    /// With [`EtcdOptions::auth`]: also a user `name` who may read and write the keys
    /// under `prefix` and nothing else.
    pub fn user(mut self, name: &str, password: &str, prefix: &str) -> Self {
        self.users.push(EtcdUser {
            name: name.to_owned(),
            password: password.to_owned(),
            prefix: prefix.to_owned(),
        });
        self
    }
}

impl Etcd {
    /// Starts a server and waits (at most [`START_TIMEOUT`]) until it reports healthy.
    ///
    /// Returns `None` when `etcd` is not installed and the etcd tests are not mandatory
    /// (see [`REQUIRE_ETCD`]), after printing a line saying the test is skipped and what
    /// to install.
    ///
    /// # Panics
    ///
    /// When `etcd` is missing and [`REQUIRE_ETCD`] is set, or when it is installed but
    /// does not come up healthy: the panic message names the cause and holds the end of
    /// the server's log.
    pub fn start() -> Option<Self> {
        Self::start_with(EtcdOptions::new())
    }

    /// [`Etcd::start`], run as `options` say. With [`EtcdOptions::auth`], returns once
    /// authentication is enabled and the users exist.
    ///
    /// # Panics
    ///
    /// As [`Etcd::start`]; also when the users cannot be set up.
    pub fn start_with(options: EtcdOptions) -> Option<Self> {
        if !installed() {
            return None;
        }
        let [client, peer, metrics] = free_ports();
        let setup = needs_setup_port(&options).then(|| free_port(&[client, peer, metrics]));
        let mut etcd = Self {
            child: None,
            dir: temp_dir("steady-etcd"),
            client,
            peer,
            metrics,
            setup,
            options,
            name: "steady-test".to_owned(),
            initial_cluster: None,
            reserved: Vec::new(),
        };
        let mut failures = Vec::new();
        for _ in 0..PORT_ATTEMPTS {
            match etcd.launch() {
                Ok(()) => {
                    if let Err(failure) = etcd.set_up_auth() {
                        panic!("cannot set up etcd's users: {failure}");
                    }
                    return Some(etcd);
                }
                Err(failure) => {
                    failures.push(failure);
                    let _ = std::fs::remove_dir_all(etcd.dir.join("data"));
                    [etcd.client, etcd.peer, etcd.metrics] = free_ports();
                    etcd.setup = etcd.setup.map(|_| free_port(&[etcd.client, etcd.peer, etcd.metrics]));
                }
            }
        }
        panic!("etcd did not start in {PORT_ATTEMPTS} attempts:\n{}", failures.join("\n"));
    }

    /// The client URL, `http://127.0.0.1:<port>` (`https://` with [`EtcdOptions::tls`]),
    /// for an etcd client.
    pub fn endpoint(&self) -> String {
        let scheme = if self.options.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.client)
    }

    /// The address its peer listener binds (members of one cluster talk there).
    pub fn peer_address(&self) -> SocketAddr {
        self.peer
    }

    /// Kills the server at once (SIGKILL: no clean shutdown), keeping its data and ports.
    ///
    /// Its peer, metrics and setup ports are held until [`Etcd::restart`] (a listener on
    /// each, which no one connects to: a lone server has no peers, and the harness alone
    /// asks the others), so that no other server (of another test, or another process)
    /// picks them meanwhile and takes them from its restart. Its client port is not: a
    /// listener there would take the connections a dead server refuses.
    pub fn kill(&mut self) {
        self.stop();
        // Killed twice: the holds of the first kill go first, or none could be made.
        self.reserved.clear();
        let held = [self.peer, self.metrics].into_iter().chain(self.setup);
        self.reserved = held.filter_map(|port| TcpListener::bind(port).ok()).collect();
    }

    /// Starts the server again on the same ports and data after [`Etcd::kill`], and waits
    /// (at most [`START_TIMEOUT`]) until it is healthy.
    ///
    /// # Panics
    ///
    /// When it does not come up healthy (for instance, another process took its port).
    pub fn restart(&mut self) {
        self.stop();
        if let Err(failure) = self.launch() {
            panic!("etcd did not restart: {failure}");
        }
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("etcd.log")
    }

    /// Spawns the server and waits until it is healthy, or says why not.
    fn launch(&mut self) -> Result<(), String> {
        self.spawn()?;
        self.wait_healthy(Instant::now() + START_TIMEOUT)
    }

    /// Spawns the server (a member of [`Etcd::initial_cluster`] when set) without waiting.
    fn spawn(&mut self) -> Result<(), String> {
        // Its ports, held since a kill, let go the moment before it binds them again.
        self.reserved.clear();
        std::fs::create_dir_all(&self.dir).map_err(|e| format!("cannot create {:?}: {e}", self.dir))?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .map_err(|e| format!("cannot open the log: {e}"))?;
        let client = self.endpoint();
        let peer = format!("http://{}", self.peer);
        let mut command = Command::new(binary());
        if let Some(tls) = &self.options.tls {
            command.arg(format!("--cert-file={}", tls.cert_file.display()));
            command.arg(format!("--key-file={}", tls.key_file.display()));
            if let Some(ca) = &tls.client_ca_file {
                command.arg(format!("--trusted-ca-file={}", ca.display()));
                command.arg("--client-cert-auth");
            }
        }
        let peers = self.initial_cluster.clone().unwrap_or_else(|| format!("{}={peer}", self.name));
        let child = command
            .arg(format!("--name={}", self.name))
            .arg(format!("--initial-cluster={peers}"))
            .arg("--initial-cluster-token=steady-test")
            .arg(format!("--data-dir={}", self.dir.join("data").display()))
            .arg(match self.setup {
                Some(setup) => format!("--listen-client-urls={client},http://{setup}"),
                None => format!("--listen-client-urls={client}"),
            })
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--listen-metrics-urls=http://{}", self.metrics))
            .arg("--logger=zap")
            .arg("--log-level=warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot run etcd: {e}"))?;
        self.child = Some(child);
        Ok(())
    }

    /// Waits until the spawned server reports healthy (for a cluster's member: until the
    /// cluster has a leader and answers through it), or says why not by `deadline`.
    fn wait_healthy(&mut self, deadline: Instant) -> Result<(), String> {
        loop {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                self.child = None;
                return Err(format!("etcd exited with {status}; its log ends:\n{}", self.log_tail()));
            }
            if healthy(self.metrics) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                self.stop();
                return Err(format!(
                    "etcd not healthy after {START_TIMEOUT:?}; its log ends:\n{}",
                    self.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// Adds [`EtcdOptions::auth`]'s users and enables authentication, through etcd's
    /// JSON gateway (before authentication is on, no token is needed).
    fn set_up_auth(&self) -> Result<(), String> {
        let Some(root_password) = &self.options.root_password else { return Ok(()) };
        // Over TLS the gateway is reached on the plaintext setup port.
        let gateway = self.setup.unwrap_or(self.client);
        let post = |path: &str, body: String| gateway_post(gateway, path, &body);
        post("/v3/auth/user/add", format!(r#"{{"name":"root","password":{}}}"#, json(root_password)))?;
        post("/v3/auth/user/grant", r#"{"user":"root","role":"root"}"#.to_owned())?;
        for user in &self.options.users {
            let role = format!("{}-role", user.name);
            post("/v3/auth/role/add", format!(r#"{{"name":{}}}"#, json(&role)))?;
            let (key, end) = (user.prefix.as_bytes(), prefix_end(user.prefix.as_bytes()));
            post(
                "/v3/auth/role/grant",
                format!(
                    r#"{{"name":{},"perm":{{"permType":"READWRITE","key":"{}","range_end":"{}"}}}}"#,
                    json(&role),
                    base64(key),
                    base64(&end)
                ),
            )?;
            post(
                "/v3/auth/user/add",
                format!(r#"{{"name":{},"password":{}}}"#, json(&user.name), json(&user.password)),
            )?;
            post(
                "/v3/auth/user/grant",
                format!(r#"{{"user":{},"role":{}}}"#, json(&user.name), json(&role)),
            )?;
        }
        post("/v3/auth/enable", "{}".to_owned())
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether the `etcd` binary runs; when it does not, says so on stderr (the test is
/// skipped) or panics when [`REQUIRE_ETCD`] is set.
fn installed() -> bool {
    let binary = binary();
    if Command::new(&binary).arg("--version").output().is_ok() {
        return true;
    }
    let message = format!(
        "`{binary}` not found: install Debian's etcd-server (`apt-get install etcd-server`, \
         or run scripts/test.sh, which does) or set {ETCD_BIN}"
    );
    if required() {
        panic!("{message}; {REQUIRE_ETCD} is set, so the etcd tests may not be skipped");
    }
    // Straight to stderr, not eprintln!: the test harness captures the print macros, and
    // a skip must show in the default output.
    let _ = writeln!(std::io::stderr(), "SKIPPED (etcd test): {message}");
    false
}

/// Whether the server needs a plaintext client port for the harness alone: users to set
/// up on a server whose clients speak TLS.
fn needs_setup_port(options: &EtcdOptions) -> bool {
    options.tls.is_some() && options.root_password.is_some()
}

fn binary() -> String {
    std::env::var(ETCD_BIN).unwrap_or_else(|_| "etcd".to_owned())
}

fn required() -> bool {
    std::env::var_os(REQUIRE_ETCD).is_some_and(|v| v != "0" && !v.is_empty())
}

/// Three distinct ports that were free a moment ago, below the kernel's ephemeral range
/// when it can be read (Linux), else the kernel's picks for port 0.
///
/// Why below it: [`Etcd::restart`] binds the same ports again after [`Etcd::kill`], and
/// meanwhile every client retrying a connection to a dead loopback port takes a new
/// ephemeral port each time. Were etcd's ports in that range, one of those attempts
/// could take one of them (or connect a socket to itself, which loopback allows) and the
/// restart would fail with "address in use". Outside it, nothing but another listener
/// binds them.
fn free_ports() -> [SocketAddr; 3] {
    let client = free_port(&[]);
    let peer = free_port(&[client]);
    [client, peer, free_port(&[client, peer])]
}

/// A loopback port that was free a moment ago, other than those in `not`.
fn free_port(not: &[SocketAddr]) -> SocketAddr {
    let free = |port: u16| {
        TcpListener::bind((Ipv4Addr::LOCALHOST, port))
            .and_then(|l| l.local_addr())
            .ok()
            .filter(|addr| !not.contains(addr))
    };
    if let Some(range) = below_ephemeral_range() {
        let mut seed = seed();
        for _ in 0..1000 {
            seed = mix(seed);
            let port = range.start + (seed % u64::from(range.end - range.start)) as u16;
            if let Some(addr) = free(port) {
                return addr;
            }
        }
    }
    loop {
        if let Some(addr) = free(0) {
            return addr;
        }
    }
}

/// Ports that no outgoing connection is given: the 10,000 below the start of the
/// kernel's ephemeral range (`/proc/sys/net/ipv4/ip_local_port_range`), above 1024.
/// `None` when the range cannot be read or leaves too little room below it.
fn below_ephemeral_range() -> Option<std::ops::Range<u16>> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let low: u16 = text.split_whitespace().next()?.parse().ok()?;
    let start = low.saturating_sub(10_000).max(1025);
    (low > start + 1000).then_some(start..low)
}

/// A seed no other test (of this process or another) is likely to share.
fn seed() -> u64 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    nanos ^ (u64::from(std::process::id()) << 32) ^ (u64::from(NEXT.fetch_add(1, Ordering::Relaxed)) << 48)
}

/// SplitMix64's step: spreads consecutive seeds over the whole range.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A fresh path in the system's temporary directory, unique in this process and across
/// processes, starting with `prefix`.
fn temp_dir(prefix: &str) -> PathBuf {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let name = format!("{prefix}-{}-{}-{nanos}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
    Path::new(&std::env::temp_dir()).join(name)
}

/// POSTs `body` (JSON) to etcd's gateway at `path`; `Err` unless it answers 200.
fn gateway_post(addr: SocketAddr, path: &str, body: &str) -> Result<(), String> {
    let ask = || -> std::io::Result<String> {
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        stream.set_write_timeout(Some(Duration::from_secs(5)))?;
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes())?;
        let mut response = String::new();
        stream.take(64 * 1024).read_to_string(&mut response)?;
        Ok(response)
    };
    let response = ask().map_err(|e| format!("POST {path}: {e}"))?;
    if response.starts_with("HTTP/1.1 200") {
        Ok(())
    } else {
        Err(format!("POST {path} {body}: {}", response.lines().last().unwrap_or_default()))
    }
}

/// `text` as a JSON string (quotes and backslashes escaped; test input has no control
/// characters).
fn json(text: &str) -> String {
    format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""))
}

/// The end of the key range of every key starting with `prefix` (etcd's convention:
/// the prefix with its last byte below 0xff incremented).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0] // Every key.
}

/// Standard base64 with padding, as etcd's gateway wants bytes.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0_u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Whether the server at `addr` answers `GET /health` with `"health":"true"`.
fn healthy(addr: SocketAddr) -> bool {
    http_get(addr, "/health", 64 * 1024).is_ok_and(|r| r.replace(' ', "").contains("\"health\":\"true\""))
}

/// The plain HTTP/1.1 response to `GET path` at `addr`, at most `limit` bytes of it.
fn http_get(addr: SocketAddr, path: &str, limit: u64) -> std::io::Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
    stream.set_read_timeout(Some(Duration::from_secs(1)))?;
    stream.set_write_timeout(Some(Duration::from_secs(1)))?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes())?;
    let mut response = String::new();
    stream.take(limit).read_to_string(&mut response)?;
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_started_etcd_answers_and_is_gone_after_drop() {
        let Some(etcd) = Etcd::start() else { return };
        let (client, dir) = (etcd.metrics, etcd.dir.clone());
        assert!(healthy(client));
        assert!(etcd.endpoint().starts_with("http://127.0.0.1:"));
        drop(etcd);
        assert!(!healthy(client), "the server still answers after drop");
        assert!(!dir.exists(), "the data directory is still there");
    }

    #[test]
    fn a_killed_etcd_restarts_on_the_same_port() {
        let Some(mut etcd) = Etcd::start() else { return };
        let endpoint = etcd.endpoint();
        if let Some(range) = below_ephemeral_range() {
            for port in [etcd.client.port(), etcd.peer.port(), etcd.metrics.port()] {
                assert!(range.contains(&port), "port {port} may be handed to a client meanwhile");
            }
        }
        etcd.kill();
        assert!(!healthy(etcd.metrics));
        etcd.restart();
        assert!(healthy(etcd.metrics));
        assert_eq!(etcd.endpoint(), endpoint);
    }

    #[test]
    fn base64_and_prefix_ends_are_what_etcd_expects() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"/steady/"), "L3N0ZWFkeS8=");
        assert_eq!(prefix_end(b"/a/"), b"/a0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff"), vec![0]);
        assert_eq!(json(r#"a"b\c"#), r#""a\"b\\c""#);
    }
}
