//! `steady-lab checker`: exclusive ownership's safety under real faults. Backend tasks
//! run as processes of their own (`exclusive-node`), each reaching etcd through a fault
//! proxy; two Assigners (`exclusive-mover`) campaign and move slices every few hundred
//! milliseconds; a schedule of faults runs; at the end every recorded ownership interval
//! is checked: no two of one key may overlap.
//!
//! The schedule, repeated every 25 s: a task paused (SIGSTOP) past its lease and resumed,
//! the leading Assigner killed while that pause holds its recall open (mid-change) and a
//! new one started, etcd killed and restarted, a task's link to etcd cut for 3 s.
//! `--broken` runs task 0 with the deadline taken from when renewals are *answered*, its
//! answers delayed by the proxy and then its requests held: the checker must catch it.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use clap::Args;
use steady_testing::proxy::FaultProxy;
use steady_testing::Etcd;

use super::intervals::{overlaps, Interval};
use crate::LabResult;

/// The checker's job name.
const JOB: &str = "checker";
/// The schedule's period.
const CYCLE: Duration = Duration::from_secs(25);

/// Arguments of `steady-lab checker`.
#[derive(Debug, Args)]
pub struct CheckerArgs {
    /// How long to run the schedule, seconds (at least 25: one cycle).
    #[arg(long, default_value_t = 25)]
    seconds: u64,
    /// Backend tasks.
    #[arg(long, default_value_t = 4)]
    nodes: u32,
    /// Keys each task samples.
    #[arg(long, default_value_t = 64)]
    keys: u32,
    /// Time between the Assigner's changes, milliseconds.
    #[arg(long, default_value_t = 300)]
    every_ms: u64,
    /// Run task 0 with the deliberately broken deadline (see the module docs).
    #[arg(long)]
    broken: bool,
    /// Where the interval files go (default: a fresh temporary directory).
    #[arg(long)]
    dir: Option<PathBuf>,
}

/// A child process killed when dropped.
struct Process(Child);

impl Process {
    fn signal(&self, signal: &str) {
        let _ = Command::new("kill").arg(format!("-{signal}")).arg(self.0.id().to_string()).status();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn lab(args: &[String]) -> Result<Process, Box<dyn std::error::Error>> {
    let child = Command::new(std::env::current_exe()?).args(args).stdin(Stdio::null()).spawn()?;
    Ok(Process(child))
}

fn mover(
    etcd: &str,
    tasks: u32,
    every_ms: u64,
    name: &str,
    seconds: u64,
) -> Result<Process, Box<dyn std::error::Error>> {
    lab(&[
        "exclusive-mover".into(),
        "--etcd".into(),
        etcd.into(),
        "--job".into(),
        JOB.into(),
        "--tasks".into(),
        tasks.to_string(),
        "--every-ms".into(),
        every_ms.to_string(),
        "--candidate".into(),
        name.into(),
        "--seconds".into(),
        seconds.to_string(),
    ])
}

pub(crate) fn run(out: &mut impl Write, args: &CheckerArgs) -> LabResult {
    if args.seconds < CYCLE.as_secs() || args.nodes < 3 {
        return Err("checker: at least 25 seconds and 3 nodes".into());
    }
    let dir = match &args.dir {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("steady-checker-{}", std::process::id())),
    };
    std::fs::create_dir_all(&dir)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let mut etcd = Etcd::start().ok_or("checker: etcd is not installed (scripts/test.sh installs it)")?;
    let upstream: SocketAddr = etcd.endpoint().trim_start_matches("http://").parse()?;
    let proxies: Vec<FaultProxy> = runtime.block_on(async {
        let mut proxies = Vec::new();
        for _ in 0..args.nodes {
            proxies.push(FaultProxy::start(upstream).await);
        }
        proxies
    });
    let lifetime = args.seconds + 5;
    let mut nodes = Vec::new();
    for task in 0..args.nodes {
        let mut node = vec![
            "exclusive-node".to_string(),
            "--etcd".into(),
            proxies[task as usize].endpoint(),
            "--job".into(),
            JOB.into(),
            "--task".into(),
            task.to_string(),
            "--keys".into(),
            args.keys.to_string(),
            "--out".into(),
            dir.join(format!("node-{task}.txt")).display().to_string(),
            "--seconds".into(),
            args.seconds.to_string(),
        ];
        if args.broken && task == 0 {
            // A 4 s lease and answers up to 3.9 s late still count: the 2.5 s delay
            // stretches its belief, with room for a machine busy with other work.
            node.extend([
                "--unsafe-deadline-from-answer".into(),
                "--ttl".into(),
                "4".into(),
                "--request-timeout-ms".into(),
                "3900".into(),
            ]);
        }
        nodes.push(lab(&node)?);
    }
    let mut movers = vec![
        mover(&etcd.endpoint(), args.nodes, args.every_ms, "mover-0", lifetime)?,
        mover(&etcd.endpoint(), args.nodes, args.every_ms, "mover-1", lifetime)?,
    ];
    let mut faults = Vec::new();
    let sleep = |d: Duration| std::thread::sleep(d);
    let mut caught_early = false;
    for cycle in 1..=args.seconds / CYCLE.as_secs() {
        sleep(Duration::from_secs(2));
        if args.broken {
            // Task 0's answers come 2.5 s late; then its requests are held (a one-way
            // partition): etcd gets no renewal and lets its lease go, while answers to
            // the renewals it already got keep arriving for 2.5 s, each stretching the
            // broken deadline past etcd's expiry. The Assigner moves the keys of the task
            // whose hold is gone, and their new owners take them while task 0 believes on.
            proxies[0].delay_responses(Duration::from_millis(2500));
            sleep(Duration::from_secs(3));
            // Hold its requests once it holds a full assignment (within 5 s more), so
            // that it owns keys the Assigner will move.
            let since = std::time::Instant::now();
            while since.elapsed() < Duration::from_secs(5)
                && !runtime.block_on(holds_full(&etcd.endpoint(), 0))
            {
                sleep(Duration::from_millis(20));
            }
            let holding = since.elapsed() < Duration::from_secs(5);
            proxies[0].hold_requests(true);
            faults.push(format!(
                "cycle {cycle}: task 0 (broken deadline{}) answers delayed 2.5 s, then its requests held 10 s",
                if holding { ", holding `full`" } else { ", holding no `full`" }
            ));
            sleep(Duration::from_secs(10));
            proxies[0].hold_requests(false);
            proxies[0].delay_responses(Duration::ZERO);
            sleep(CYCLE.saturating_sub(Duration::from_secs(5) + since.elapsed()));
            // Caught once is enough: the run ends early (a busy machine can make one
            // cycle's new owners too slow to meet the stretched belief; the next tries again).
            if !overlaps(&read_intervals(&dir, args.nodes)).is_empty() {
                caught_early = true;
                break;
            }
            continue;
        }
        // A task paused past its lease; while its hold keeps the recall open, the leading
        // Assigner is killed (mid-change) and a new candidate started.
        let paused = (cycle % u64::from(args.nodes - 1) + 1) as usize;
        nodes[paused].signal("STOP");
        // Kill the leader mid-change: once its recall waits for the paused task's hold
        // (within 1.8 s, before the paused task's lease can lapse).
        let paused_at = std::time::Instant::now();
        let (leader, guard) = loop {
            let (leader, guard) = runtime.block_on(leader_and_guard(&etcd.endpoint()));
            let recalling = guard.as_deref().is_some_and(|g| g.starts_with("v1 recalling"));
            if recalling || paused_at.elapsed() > Duration::from_millis(1800) {
                break (leader, guard);
            }
            sleep(Duration::from_millis(20));
        };
        if let Some(i) =
            leader.as_deref().and_then(|l| l.strip_prefix("mover-")).and_then(|i| i.parse::<usize>().ok())
        {
            if let Some(slot) = movers.get_mut(i % 2) {
                *slot = mover(
                    &etcd.endpoint(),
                    args.nodes,
                    args.every_ms,
                    &format!("mover-{}", i + 2),
                    lifetime,
                )?;
            }
        }
        let guard = guard.as_deref().unwrap_or("none");
        faults.push(format!(
            "cycle {cycle}: task {paused} paused 3 s; leading Assigner {leader:?} killed at guard `{guard}`"
        ));
        sleep(Duration::from_secs(3).saturating_sub(paused_at.elapsed()));
        nodes[paused].signal("CONT");
        sleep(Duration::from_secs(4));
        // etcd down for a second and back with its data.
        etcd.kill();
        sleep(Duration::from_secs(1));
        etcd.restart();
        faults.push(format!("cycle {cycle}: etcd killed and restarted"));
        sleep(Duration::from_secs(5));
        // A task's link to etcd cut while it runs.
        let cut = (cycle % u64::from(args.nodes)) as usize;
        proxies[cut].cut();
        sleep(Duration::from_secs(3));
        proxies[cut].restore();
        faults.push(format!("cycle {cycle}: task {cut}'s link to etcd cut 3 s"));
        sleep(Duration::from_secs(CYCLE.as_secs() - 16));
    }
    // The nodes stop by themselves at --seconds and write what they still hold (or, with
    // --broken caught early, are stopped: what they wrote shows it).
    for node in &mut nodes {
        if caught_early {
            let _ = node.0.kill();
        }
        let _ = node.0.wait();
    }
    drop(movers);
    let intervals = read_intervals(&dir, args.nodes);
    let found = overlaps(&intervals);
    let owners: std::collections::BTreeSet<(u32, u32)> = intervals.iter().map(|i| (i.key, i.owner)).collect();
    let moved = (0..args.keys).filter(|k| owners.iter().filter(|(key, _)| key == k).count() > 1).count();
    for fault in &faults {
        writeln!(out, "fault: {fault}")?;
    }
    writeln!(out, "intervals: {}", intervals.len())?;
    writeln!(out, "keys owned by more than one task over the run: {moved} of {}", args.keys)?;
    writeln!(out, "overlaps: {}", found.len())?;
    for overlap in found.iter().take(10) {
        writeln!(out, "  {overlap}")?;
    }
    drop(proxies);
    Ok(())
}

/// Every interval the nodes wrote so far (a line cut short by a kill is skipped).
fn read_intervals(dir: &std::path::Path, nodes: u32) -> Vec<Interval> {
    let mut intervals = Vec::new();
    for task in 0..nodes {
        let text = std::fs::read_to_string(dir.join(format!("node-{task}.txt"))).unwrap_or_default();
        intervals.extend(text.lines().filter_map(Interval::parse));
    }
    intervals
}

/// Whether `task` holds `full G` of some generation in etcd now.
async fn holds_full(endpoint: &str, task: u32) -> bool {
    let Ok(mut client) = etcd_client::Client::connect([endpoint], None).await else { return false };
    let prefix = format!("{}{task}/", steady_slice::guard::holds_prefix("/steady/jobs/", JOB));
    let options = etcd_client::GetOptions::new().with_prefix();
    let Ok(response) = client.get(prefix, Some(options)).await else { return false };
    response.kvs().iter().any(|kv| kv.value().starts_with(b"v1 full"))
}

/// The candidate leading the checker's job (its leader key) and the job's guard.
async fn leader_and_guard(endpoint: &str) -> (Option<String>, Option<String>) {
    let Ok(client) = etcd_client::Client::connect([endpoint], None).await else { return (None, None) };
    let value = |key: String| {
        let mut client = client.clone();
        async move {
            let response = client.get(key, None).await.ok()?;
            response.kvs().first().map(|kv| String::from_utf8_lossy(kv.value()).into_owned())
        }
    };
    let leader = value(format!("/steady/jobs/{JOB}/leader")).await;
    let guard = value(steady_slice::guard::guard_key("/steady/jobs/", JOB)).await;
    (leader, guard)
}
