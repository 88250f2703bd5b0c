//! The soak's processes: a three-member etcd, two `steady-slicer` instances (the real
//! binary) and the backend tasks (`steady-lab chaos-backend`), each spawned, killed,
//! stalled and drained here, with what they print read into the [`Roster`].
//!
//! Every child is killed when its handle drops, so a soak that ends (or panics) leaves
//! nothing running; a backend also ends by itself when the lab's end of its stdin closes.

use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use steady_proto::tls::ClientTlsSource;
use steady_testing::EtcdCluster;

use super::pki::{FleetTls, Step};
use super::roster::{Beat, Group, Life, Roster};

type Failure = Box<dyn std::error::Error>;

/// The control plane's cadence: a run a second (a change in the registry runs at once).
const CADENCE_MS: &str = "1000";
/// The election's lease: a standby leads about this long after the leader dies.
const ELECTION_TTL_SECS: &str = "2";
/// Two replicas per slice: one backend down leaves every slice a serving replica.
pub(super) const REPLICAS: u32 = 2;
const SPEC: &str = r#"{ "replicas": { "min": 2, "max": 2 } }"#;
/// The lab's own clients' identity on a TLS fleet (the frontends, the monitors).
pub(super) const FRONTEND: &str = "frontend";

/// When the soak's first process started: the logs' lines are stamped from it.
static START: OnceLock<Instant> = OnceLock::new();

/// A process asked to take a rotation step, and what it had answered before.
#[derive(Debug, Clone, Copy)]
pub(super) struct Ack {
    pub(super) group: Group,
    pub(super) index: usize,
    /// Its `Member::rotations` when asked.
    pub(super) taken: u64,
    /// Its `Member::rotations_failed` when asked.
    pub(super) refused: u64,
}

impl Ack {
    fn of(group: Group, index: usize, member: &super::roster::Member) -> Self {
        Self { group, index, taken: member.rotations, refused: member.rotations_failed }
    }
}

/// The time since the soak's first process started (the logs' clock).
pub(super) fn since_start() -> Duration {
    START.get_or_init(Instant::now).elapsed()
}

/// A child process, killed when dropped; its stdout is read line by line by a thread of
/// its own (so that it never blocks on a full pipe), its stderr goes to its log.
struct Proc {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Proc {
    /// Spawns `program args`, appending its stderr lines and the stdout lines `log_line`
    /// keeps to `log`, each stamped, and giving every line of both to `on_line` with the
    /// child's pid.
    fn spawn(
        program: &Path,
        args: &[String],
        log: &Path,
        log_line: fn(&str) -> bool,
        on_line: impl Fn(u32, &str) + Send + Sync + 'static,
    ) -> Result<Self, Failure> {
        let mut file = std::fs::OpenOptions::new().create(true).append(true).open(log)?;
        writeln!(file, "[{:8.2}] === {} {}", since_start().as_secs_f64(), program.display(), args.join(" "))?;
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", program.display()))?;
        let pid = child.id();
        let on_line = std::sync::Arc::new(on_line);
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let stderr = child.stderr.take().ok_or("no stderr")?;
        let log = std::sync::Arc::new(std::sync::Mutex::new(file));
        let read = |stream: Box<dyn std::io::Read + Send>, keep: fn(&str) -> bool| {
            let (log, on_line) = (log.clone(), on_line.clone());
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines() {
                    let Ok(line) = line else { break };
                    if keep(&line) {
                        let mut file = log.lock().unwrap_or_else(|p| p.into_inner());
                        let _ = writeln!(file, "[{:8.2}] {line}", since_start().as_secs_f64());
                    }
                    on_line(pid, &line);
                }
            });
        };
        read(Box::new(stdout), log_line);
        read(Box::new(stderr), |_| true);
        Ok(Self { stdin: child.stdin.take(), child })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (`STOP`, `CONT`, `HUP`) with kill(1): the lab has no unsafe code.
    fn signal(&self, signal: &str) {
        let _ = Command::new("kill").arg(format!("-{signal}")).arg(self.pid().to_string()).status();
    }

    /// Writes one command line to its stdin.
    fn send(&mut self, line: &str) -> Result<(), Failure> {
        let stdin = self.stdin.as_mut().ok_or("no stdin")?;
        writeln!(stdin, "{line}")?;
        stdin.flush()?;
        Ok(())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // A stalled child dies of SIGKILL too.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One steady-slicer instance: its name, fixed addresses (a restart binds them again)
/// and process.
pub(super) struct Slicer {
    pub(super) name: String,
    /// The Distributor and load collector.
    pub(super) listen: SocketAddr,
    /// `/metrics` and the status page.
    pub(super) metrics: SocketAddr,
    proc: Option<Proc>,
}

/// The soak's processes.
///
/// Dropped in field order: the backends and the control plane end before etcd does.
pub(super) struct Fleet {
    backends: Vec<Option<Proc>>,
    pub(super) slicers: Vec<Slicer>,
    pub(super) roster: Roster,
    job: String,
    dir: PathBuf,
    slicer_bin: PathBuf,
    /// The certificates, on a TLS fleet.
    pub(super) tls: Option<FleetTls>,
    /// The lab's clients' TLS settings (the frontends, the monitors), on a TLS fleet:
    /// replaced at each step of a rotation.
    pub(super) client: Option<ClientTlsSource>,
    pub(super) etcd: EtcdCluster,
}

impl Fleet {
    /// Starts etcd (three members), the two steady-slicer instances and `backends`
    /// backend tasks of `job`, logging into `dir`; waits for nothing but etcd. With
    /// `tls`, the instances and backends serve mutual TLS only, with certificates of a
    /// CA made for the run ([`FleetTls`]; etcd stays plaintext).
    pub(super) fn start(
        job: &str,
        backends: u32,
        dir: &Path,
        slicer_bin: PathBuf,
        tls: bool,
    ) -> Result<Self, Failure> {
        let etcd = EtcdCluster::start().ok_or(
            "etcd is not installed: the soak starts three etcd members (apt-get install etcd-server)",
        )?;
        std::fs::write(dir.join("spec.json"), SPEC)?;
        let names = ["slicer-a".to_owned(), "slicer-b".to_owned()];
        let tls = if tls {
            let identities: Vec<String> = names
                .iter()
                .cloned()
                .chain((0..backends).map(|i| format!("{job}-{i}")))
                .chain([FRONTEND.to_owned()])
                .collect();
            Some(FleetTls::start(dir, &identities)?)
        } else {
            None
        };
        let client = match &tls {
            Some(tls) => Some(ClientTlsSource::new(tls.client(FRONTEND)?)?),
            None => None,
        };
        let roster = Roster::new(&names, backends as usize, etcd.len());
        let slicers = names
            .iter()
            .map(|name| Slicer { name: name.clone(), listen: free_port(), metrics: free_port(), proc: None })
            .collect();
        let mut fleet = Self {
            etcd,
            roster,
            slicers,
            backends: (0..backends).map(|_| None).collect(),
            job: job.to_owned(),
            dir: dir.to_owned(),
            slicer_bin,
            tls,
            client,
        };
        for member in 0..fleet.etcd.len() {
            fleet.note_etcd(member, Life::Up);
        }
        for i in 0..fleet.slicers.len() {
            fleet.spawn_slicer(i)?;
        }
        for i in 0..fleet.backends.len() {
            fleet.spawn_backend(i)?;
        }
        Ok(fleet)
    }

    /// The control plane's endpoints, `http://host:port` (`https://` on TLS), for
    /// watchers and reporters.
    pub(super) fn slicer_endpoints(&self) -> Vec<String> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        self.slicers.iter().map(|s| format!("{scheme}://{}", s.listen)).collect()
    }

    /// How many backend tasks.
    pub(super) fn backend_count(&self) -> usize {
        self.backends.len()
    }

    /// Starts steady-slicer instance `i` (again), on its addresses.
    pub(super) fn spawn_slicer(&mut self, i: usize) -> Result<(), Failure> {
        let etcd = self.etcd.endpoints().join(",");
        let slicer = &self.slicers[i];
        let mut args: Vec<String> = [
            "--job",
            &self.job,
            "--registry",
            &etcd,
            "--store",
            "etcd",
            "--endpoints",
            &etcd,
            "--candidate",
            &slicer.name,
            "--listen",
            &slicer.listen.to_string(),
            "--metrics-listen",
            &slicer.metrics.to_string(),
            "--cadence-ms",
            CADENCE_MS,
            "--lease-ttl-secs",
            ELECTION_TTL_SECS,
            "--spec",
            &self.dir.join("spec.json").display().to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if let Some(tls) = &self.tls {
            let (cert, key) = tls.files(&slicer.name);
            let path = |p: &Path| p.display().to_string();
            args.extend([
                "--tls-cert".into(),
                path(&cert),
                "--tls-key".into(),
                path(&key),
                "--tls-client-ca".into(),
                path(&tls.ca_file()),
                "--require-client-cert".into(),
                // Rotations are signalled (SIGHUP), once every file of a step is written.
                "--tls-reload-ms".into(),
                "3600000".into(),
            ]);
        }
        let roster = self.roster.clone();
        let log = self.dir.join(format!("{}.log", slicer.name));
        // Its status lines come once a second: logged; they are its heartbeat. Its
        // stderr says what it did with rotated certificates.
        let proc = Proc::spawn(
            &self.slicer_bin,
            &args,
            &log,
            |_| true,
            move |pid, line| slicer_line(&roster, i, pid, line),
        )?;
        self.roster.lock().slicers[i].spawned(proc.pid());
        self.slicers[i].proc = Some(proc);
        Ok(())
    }

    /// Kills steady-slicer instance `i` (SIGKILL): no resignation, the lease lapses.
    pub(super) fn kill_slicer(&mut self, i: usize) {
        self.slicers[i].proc = None;
        self.roster.lock().slicers[i].set(Life::Killed);
    }

    /// Starts backend task `i` (again).
    pub(super) fn spawn_backend(&mut self, i: usize) -> Result<(), Failure> {
        let mut args: Vec<String> = vec![
            "chaos-backend".into(),
            "--etcd".into(),
            self.etcd.endpoints().join(","),
            "--job".into(),
            self.job.clone(),
            "--task".into(),
            i.to_string(),
            "--slicers".into(),
            self.slicer_endpoints().join(","),
        ];
        if let Some(tls) = &self.tls {
            args.extend(["--tls-dir".into(), tls.dir().display().to_string()]);
        }
        let roster = self.roster.clone();
        let log = self.dir.join(format!("backend-{i}.log"));
        let lab = std::env::current_exe()?;
        // Heartbeats (four a second) are not logged.
        let proc = Proc::spawn(
            &lab,
            &args,
            &log,
            |line| !line.starts_with("beat "),
            move |pid, line| backend_line(&roster, i, pid, line),
        )?;
        let mut members = self.roster.lock();
        members.backends[i].spawned(proc.pid());
        members.backends[i].draining = false;
        drop(members);
        self.backends[i] = Some(proc);
        Ok(())
    }

    /// Kills backend task `i` (SIGKILL).
    pub(super) fn kill_backend(&mut self, i: usize) {
        self.backends[i] = None;
        self.roster.lock().backends[i].set(Life::Killed);
    }

    /// Stalls backend task `i` (SIGSTOP), or lets it go on (SIGCONT).
    pub(super) fn stall_backend(&mut self, i: usize, stall: bool) {
        if let Some(proc) = &self.backends[i] {
            // Marked first when stalling, after when resuming: the monitors never take a
            // stalled task for a serving one.
            if stall {
                self.roster.lock().backends[i].set(Life::Stopped);
                proc.signal("STOP");
            } else {
                proc.signal("CONT");
                self.roster.lock().backends[i].set(Life::Up);
            }
        }
    }

    /// Drains backend task `i` in the registry, or makes it serve again.
    pub(super) fn drain_backend(&mut self, i: usize, drain: bool) -> Result<(), Failure> {
        let proc = self.backends[i].as_mut().ok_or("the backend is not running")?;
        if drain {
            self.roster.lock().backends[i].draining = true;
            proc.send("drain")
        } else {
            proc.send("undrain")?;
            self.roster.lock().backends[i].draining = false;
            Ok(())
        }
    }

    /// Writes the files of `step` of a rotation and has every running process take them:
    /// SIGHUP to each instance, `rotate` to each backend, and the lab's clients'
    /// settings replaced. Returns who must answer it, with the answers each had given
    /// before.
    pub(super) fn rotate_certificates(&mut self, step: Step) -> Result<Vec<Ack>, Failure> {
        let tls = self.tls.as_mut().ok_or("the fleet runs without TLS: start it with --tls")?;
        tls.step(step)?;
        if let Some(client) = &self.client {
            client.replace(tls.client(FRONTEND)?)?;
        }
        let mut acks = Vec::new();
        let members = self.roster.lock();
        for (i, slicer) in self.slicers.iter().enumerate() {
            // Only an instance that said it serves: SIGHUP ends one that has not taken
            // the signal over yet (one starting reads the files as they are then).
            if let (Some(proc), Life::Up) = (&slicer.proc, members.slicers[i].life) {
                acks.push(Ack::of(Group::Slicers, i, &members.slicers[i]));
                proc.signal("HUP");
            }
        }
        let backends: Vec<Ack> =
            members.backends.iter().enumerate().map(|(i, m)| Ack::of(Group::Backends, i, m)).collect();
        drop(members);
        for (i, proc) in self.backends.iter_mut().enumerate() {
            if let Some(proc) = proc {
                acks.push(backends[i]);
                proc.send("rotate")?;
            }
        }
        Ok(acks)
    }

    /// Whether every instance that has a process says it serves (a rotation signals only
    /// those: one still starting would miss a step).
    pub(super) fn slicers_up(&self) -> bool {
        let members = self.roster.lock();
        self.slicers.iter().zip(&members.slicers).all(|(s, m)| s.proc.is_none() || m.life == Life::Up)
    }

    /// Kills etcd member `member` (SIGKILL).
    pub(super) fn kill_etcd(&mut self, member: usize) {
        self.etcd.kill(member);
        self.note_etcd(member, Life::Killed);
    }

    /// Restarts etcd member `member` on its data and waits until it is healthy.
    pub(super) fn restart_etcd(&mut self, member: usize) {
        self.etcd.restart(member);
        self.note_etcd(member, Life::Up);
    }

    fn note_etcd(&mut self, member: usize, life: Life) {
        let pid = self.etcd.pid(member);
        let mut members = self.roster.lock();
        let m = &mut members.etcd[member];
        m.pid = pid;
        m.set(life);
    }
}

/// Reads one line of steady-slicer instance `i`: the first says it serves, each status
/// line (once a cadence) is its heartbeat, a TLS line on stderr says it took (or refused)
/// rotated files.
fn slicer_line(roster: &Roster, i: usize, pid: u32, line: &str) {
    if line.starts_with("steady-slicer: TLS: reloaded ") {
        roster.update(Group::Slicers, i, pid, |m| m.rotations += 1);
    } else if line.starts_with("steady-slicer: TLS: refused ") {
        roster.update(Group::Slicers, i, pid, |m| m.rotations_failed += 1);
    } else if line.starts_with("steady-slicer: job ") {
        roster.update(Group::Slicers, i, pid, |m| m.set(Life::Up));
    } else if let Some(rest) = line.strip_prefix("generation ") {
        let generation = rest.split_whitespace().next().and_then(|g| g.parse().ok()).unwrap_or(0);
        let reports = field(line, "accepted").unwrap_or(0);
        roster.update(Group::Slicers, i, pid, |m| {
            m.beat = Some(Beat { at: Instant::now(), generation, reports })
        });
    }
}

/// Reads one line of backend task `i`: `ready ...` once it serves and is registered,
/// `beat gen=G reports=R ...` as its heartbeat.
fn backend_line(roster: &Roster, i: usize, pid: u32, line: &str) {
    if let Some(addr) = line.strip_prefix("ready addr=") {
        roster.update(Group::Backends, i, pid, |m| {
            m.addr = Some(addr.trim().to_owned());
            if m.life == Life::Starting {
                m.set(Life::Up);
            }
        });
    } else if line == "done rotate" {
        roster.update(Group::Backends, i, pid, |m| m.rotations += 1);
    } else if line.starts_with("failed rotate") {
        roster.update(Group::Backends, i, pid, |m| m.rotations_failed += 1);
    } else if line.starts_with("beat ") {
        let generation = field(line, "gen=").unwrap_or(0);
        let reports = field(line, "reports=").unwrap_or(0);
        roster.update(Group::Backends, i, pid, |m| {
            m.beat = Some(Beat { at: Instant::now(), generation, reports })
        });
    }
}

/// The number after `label` in `line` (`gen=12`, or `accepted 40`).
fn field(line: &str, label: &str) -> Option<u64> {
    let at = line.find(label)? + label.len();
    line[at..].trim_start().split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// A loopback port that was free a moment ago, below the kernel's ephemeral range when it
/// can be read: a steady-slicer instance binds it again when restarted, and meanwhile
/// no outgoing connection (a client retrying the dead instance) can be given it.
fn free_port() -> SocketAddr {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse::<u16>().ok())
        .map(|low| low.saturating_sub(10_000).max(1025)..low)
        .filter(|r| r.end > r.start + 1000);
    let bind = |port: u16| TcpListener::bind((Ipv4Addr::LOCALHOST, port)).and_then(|l| l.local_addr()).ok();
    if let Some(range) = range {
        let mut rng = steady_subset::prng::SplitMix64::new(u64::from(std::process::id()) ^ seed());
        for _ in 0..1000 {
            let port = range.start + rng.below(u64::from(range.end - range.start)) as u16;
            if let Some(addr) = bind(port) {
                return addr;
            }
        }
    }
    bind(0).expect("127.0.0.1 has a free port")
}

/// A seed from the wall clock.
fn seed() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// The steady-slicer binary: `--slicer-bin`, else `STEADY_SLICER_BIN`, else the one cargo
/// built next to this executable (`target/<profile>/steady-slicer`; a test's executable
/// sits one level down, in `deps/`).
pub(super) fn slicer_binary(given: Option<&Path>) -> Result<PathBuf, Failure> {
    if let Some(path) = given {
        return Ok(path.to_owned());
    }
    if let Some(path) = std::env::var_os("STEADY_SLICER_BIN") {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe()?;
    let dir = exe.parent().ok_or("the lab's executable has no directory")?;
    let candidates =
        [dir.join("steady-slicer"), dir.parent().map(|p| p.join("steady-slicer")).unwrap_or_default()];
    candidates.into_iter().find(|p| p.is_file()).ok_or_else(|| {
        format!(
            "steady-slicer is not built next to {}: `cargo build --release -p steady-slicer-server` \
             (the profile of the lab), or give --slicer-bin PATH",
            exe.display()
        )
        .into()
    })
}
