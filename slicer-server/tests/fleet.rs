//! `steady-slicer --fleet`: several real instances on a real etcd serve every job of the
//! spec store, each job's Assigner on the instance the spread names. A killed instance's
//! jobs are led by the others; a joining instance takes its share; a spec changed while
//! running takes effect and a bad one is refused by name while the job keeps its last
//! good spec; a removed job is no longer led. A memory-store fleet follows a directory
//! of spec files the same way.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use steady_slice::Assignment;
use steady_slicer::fleet::EtcdFleet;
use steady_slicer::specs::{EtcdSpecs, JobConfig, SpecDirectory, SpecStore, TaskSource};
use steady_slicer::store::{EtcdConfig, EtcdStore};
use tonic::transport::Endpoint;

const BIN: &str = env!("CARGO_BIN_EXE_steady-slicer");

mod fleet_instances;
use fleet_instances::{start, until, Running};
/// The most any wait may take.
const WAIT: Duration = Duration::from_secs(30);

fn on_etcd(endpoint: &str) -> [&str; 6] {
    ["--store", "etcd", "--endpoints", endpoint, "--lease-ttl-secs", "2"]
}

fn job(name: &str, tasks: u32) -> JobConfig {
    let mut config = JobConfig::new(name, TaskSource::Count(tasks));
    config.cadence = Duration::from_millis(200);
    config
}

/// Each job's leader, by job.
async fn leaders(fleet: &EtcdFleet, jobs: &[String]) -> BTreeMap<String, Option<String>> {
    let mut led = BTreeMap::new();
    for job in jobs {
        led.insert(job.clone(), fleet.leader(job).await.unwrap());
    }
    led
}

/// How many jobs each instance leads, when every job is led.
fn counts(led: &BTreeMap<String, Option<String>>) -> Option<BTreeMap<String, usize>> {
    let mut counts = BTreeMap::new();
    for leader in led.values() {
        *counts.entry(leader.clone()?).or_default() += 1;
    }
    Some(counts)
}

/// A watch of `job` through the instance at `address`.
fn watch(address: &str, job: &str) -> impl futures_util::Stream<Item = Assignment> + Unpin + use<> {
    let endpoint = Endpoint::from_shared(format!("http://{address}")).unwrap();
    Box::pin(
        steady_tonic::watch_assignments(endpoint, job.to_owned(), Default::default())
            .unwrap()
            .filter_map(|a| async { a.ok() }),
    )
}

/// The next assignment of `watch` whose tasks are `tasks`.
async fn tasks_become(
    watch: &mut (impl futures_util::Stream<Item = Assignment> + Unpin),
    tasks: &[u32],
) -> Assignment {
    tokio::time::timeout(WAIT, async {
        loop {
            let a = watch.next().await.expect("the watch ends only with its stream");
            let named: BTreeSet<u32> = a.slices().iter().flat_map(|s| s.replicas().iter().copied()).collect();
            if named.iter().copied().eq(tasks.iter().copied()) {
                return a;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no assignment of tasks {tasks:?} within {WAIT:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_spreads_its_jobs_survives_a_death_takes_a_joiner_and_follows_its_specs() {
    let Some(etcd) = steady_testing::Etcd::start() else { return };
    let endpoint = etcd.endpoint();
    let store = EtcdStore::connect(EtcdConfig::new([endpoint.clone()])).await.unwrap();
    let specs = SpecStore::Etcd(EtcdSpecs::of(&store));
    let fleet = EtcdFleet::new(&store);
    let jobs: Vec<String> = (0..9).map(|i| format!("job-{i}")).collect();
    for name in &jobs {
        specs.put(&job(name, 3)).await.unwrap();
    }
    let mut instances: Vec<Running> = ["a", "b", "c"].iter().map(|n| start(n, &on_etcd(&endpoint))).collect();

    // Every job led, three each: the spread's cap is ceil(9 / 3).
    let led = until(WAIT, "every job led, three per instance", async || {
        let led = leaders(&fleet, &jobs).await;
        let counts = counts(&led)?;
        (counts.len() == 3 && counts.values().all(|&n| n == 3)).then_some(led)
    })
    .await;
    assert_eq!(fleet.instances().await.unwrap().keys().collect::<Vec<_>>(), ["a", "b", "c"]);

    // Any instance serves any job's Watch: a job led by a, through c.
    let of_a: Vec<String> =
        led.iter().filter(|(_, l)| l.as_deref() == Some("a")).map(|(j, _)| j.clone()).collect();
    let c = instances.iter().find(|i| i.name == "c").unwrap().address.clone();
    tasks_become(&mut watch(&c, &of_a[0]), &[0, 1, 2]).await;

    // Killed (no resignation): its jobs are led by b and c within the lease.
    let a = instances.remove(0);
    drop(a);
    until(WAIT, "every job led by b or c", async || {
        let counts = counts(&leaders(&fleet, &jobs).await)?;
        (counts.keys().all(|l| l == "b" || l == "c") && counts.values().all(|&n| n <= 5)).then_some(())
    })
    .await;

    // A spec changed while running: a new generation of a job a led reaches a watcher of
    // b, whichever instance leads it now.
    let b = instances.iter().find(|i| i.name == "b").unwrap().address.clone();
    let mut through_b = watch(&b, &of_a[0]);
    specs.put(&job(&of_a[0], 5)).await.unwrap();
    tasks_become(&mut through_b, &[0, 1, 2, 3, 4]).await;

    // A bad spec written past the store's checks (as another tool would): refused by
    // name on every instance, and the job keeps its last good spec and its leader.
    let other = jobs.iter().find(|j| **j != of_a[0]).unwrap();
    let bad = format!(r#"{{"version": 1, "job": "{other}", "tasks": {{"count": 0}}}}"#);
    let mut client = etcd_client::Client::connect([endpoint.as_str()], None).await.unwrap();
    client.put(EtcdSpecs::of(&store).key(other), bad, None).await.unwrap();
    until(WAIT, "every instance refuses the spec by job and field", async || {
        instances
            .iter()
            .all(|i| i.said(|l| l.contains(other.as_str()) && l.contains("tasks.count")))
            .then_some(())
    })
    .await;
    assert!(fleet.leader(other).await.unwrap().is_some(), "{other} is still led");
    tasks_become(&mut watch(&b, other), &[0, 1, 2]).await;

    // A fourth instance joins: it takes its share (three jobs), every job still led.
    instances.push(start("d", &on_etcd(&endpoint)));
    until(WAIT, "d leads three jobs and every job is led", async || {
        let counts = counts(&leaders(&fleet, &jobs).await)?;
        (counts.get("d") == Some(&3) && counts.values().all(|&n| n == 3)).then_some(())
    })
    .await;

    // A job removed is no longer led (its Assigner resigned).
    specs.delete("job-8").await.unwrap();
    until(WAIT, "job-8 is no longer led", async || {
        fleet.leader("job-8").await.unwrap().is_none().then_some(())
    })
    .await;
}

/// The operator's view of a running fleet, end to end: `steadyctl jobs` names each job's
/// leader among the instances, `steadyctl tasks` reads a job's tasks from its leader's
/// page (no note that loads are missing), and each instance's overview lists every job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steadyctl_and_the_pages_show_a_running_fleet() {
    let Some(etcd) = steady_testing::Etcd::start() else { return };
    let endpoint = etcd.endpoint();
    let store = EtcdStore::connect(EtcdConfig::new([endpoint.clone()])).await.unwrap();
    let specs = SpecStore::Etcd(EtcdSpecs::of(&store));
    let jobs = ["orders", "users", "carts"];
    for name in jobs {
        specs.put(&job(name, 4)).await.unwrap();
    }
    let with_pages = [&on_etcd(&endpoint)[..], &["--metrics-listen", "0"]].concat();
    let instances = [start("a", &with_pages), start("b", &with_pages)];
    let ctl = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_steadyctl"))
            .args(["--endpoints", endpoint.as_str()])
            .args(args)
            .output()
            .unwrap();
        let (stdout, stderr) =
            (String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap());
        assert!(out.status.success(), "steadyctl {args:?}: {stderr}");
        (stdout, stderr)
    };
    let listed = until(WAIT, "steadyctl names a live leader for every job", async || {
        let (stdout, _) = ctl(&["jobs", "--json"]);
        let listed: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        let leaders: Vec<String> = listed["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|j| j["leader"].as_str().map(str::to_owned))
            .collect();
        (leaders.len() == jobs.len() && leaders.iter().all(|l| l == "a" || l == "b")).then_some(listed)
    })
    .await;
    assert_eq!(listed["jobs"].as_array().unwrap().len(), jobs.len());
    // The store names a leader the moment its campaign wins; its page says it leads a
    // moment later (once its Assigner sees the win): wait for the page to answer.
    let table = until(WAIT, "steadyctl tasks reads the loads from the leader's page", async || {
        let (table, notes) = ctl(&["tasks", "users"]);
        (!notes.contains("no loads")).then_some(table)
    })
    .await;
    assert_eq!(table.lines().filter(|l| l.contains("serving")).count(), 4, "{table}");
    let records = EtcdFleet::new(&store).instances().await.unwrap();
    assert_eq!(records.len(), instances.len());
    for (name, record) in &records {
        let pages = record.pages.as_deref().unwrap_or_else(|| panic!("{name} records its pages"));
        let overview = http_get(pages, "/");
        for name in jobs {
            assert!(overview.contains(&format!("/jobs/{name}")), "{overview}");
        }
    }
}

/// The body of `GET path` on `address` (HTTP/1.0, so the server closes the connection).
fn http_get(address: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(WAIT)).unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.0 200") || response.starts_with("HTTP/1.1 200"), "{response}");
    response
}

/// A run asked for through the fleet's keys reaches the leading instance, which says so;
/// the request's key lives on a lease of at most a minute, so it goes by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_request_runs_the_job_on_its_leader() {
    let Some(etcd) = steady_testing::Etcd::start() else { return };
    let endpoint = etcd.endpoint();
    let store = EtcdStore::connect(EtcdConfig::new([endpoint.clone()])).await.unwrap();
    let mut slow = job("users", 3);
    slow.cadence = Duration::from_secs(3600);
    SpecStore::Etcd(EtcdSpecs::of(&store)).put(&slow).await.unwrap();
    let instance = start("a", &on_etcd(&endpoint));
    let fleet = EtcdFleet::new(&store);
    until(WAIT, "users led", async || fleet.leader("users").await.unwrap().map(|_| ())).await;
    fleet.request_run("users").await.unwrap();
    until(WAIT, "the leader runs users", async || {
        instance.said(|l| l.contains("job users: a run was asked for")).then_some(())
    })
    .await;
    let mut raw = etcd_client::Client::connect([endpoint.as_str()], None).await.unwrap();
    let got = raw.get(fleet.run_key("users"), None).await.unwrap();
    let lease = got.kvs().first().expect("the request's key").lease();
    assert_ne!(lease, 0, "the run request's key is on a lease");
    let ttl = raw.lease_time_to_live(lease, None).await.unwrap().ttl();
    let max = i64::try_from(steady_slicer::fleet::RUN_REQUEST_TTL.as_secs()).unwrap();
    assert!(ttl > 0 && ttl <= max, "the lease has {ttl} s left, at most {max}");
}

/// On the memory store a fleet follows a directory of spec files: a file added is a job
/// served, a bad file is refused by name and the job keeps its last good spec.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_fleet_follows_its_spec_directory() {
    let dir = std::env::temp_dir().join(format!("steady-fleet-specs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let specs = SpecStore::Directory(SpecDirectory::open(&dir, Duration::from_millis(100)).unwrap());
    specs.put(&job("users", 2)).await.unwrap();
    let instance = start("solo", &["--specs-dir", dir.to_str().unwrap()]);
    tasks_become(&mut watch(&instance.address, "users"), &[0, 1]).await;
    specs.put(&job("orders", 4)).await.unwrap();
    tasks_become(&mut watch(&instance.address, "orders"), &[0, 1, 2, 3]).await;
    std::fs::write(dir.join("users.json"), r#"{"version": 1, "job": "users", "tasks": {"count": 0}}"#)
        .unwrap();
    until(WAIT, "the bad file is refused by name", async || {
        instance.said(|l| l.contains("users") && l.contains("tasks.count")).then_some(())
    })
    .await;
    tasks_become(&mut watch(&instance.address, "users"), &[0, 1]).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Neither a memory fleet without its directory nor a spec directory on etcd: one line.
#[test]
fn a_fleet_without_its_specs_is_refused_in_one_line() {
    for (args, says) in [
        (vec!["--fleet"], "--specs-dir"),
        (
            vec!["--fleet", "--store", "etcd", "--endpoints", "http://127.0.0.1:1", "--specs-dir", "/tmp"],
            "--specs-dir",
        ),
        (vec!["--fleet", "--candidate", "a/b", "--specs-dir", "/tmp"], "--candidate"),
    ] {
        let out = Command::new(BIN).args(&args).args(["--listen", "127.0.0.1:0"]).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.starts_with("steady-slicer: ") && stderr.contains(says), "{args:?}: {stderr}");
    }
    // Per-job flags are not a fleet's (clap: exit 2).
    let out =
        Command::new(BIN).args(["--fleet", "--specs-dir", "/tmp", "--algorithm", "lpt"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
}

/// The resident memory of process `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// The CPU time process `pid` used so far (user and system), in seconds.
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The fields after the command's closing parenthesis; utime and stime are 14 and 15.
    let fields: Vec<&str> = stat.rsplit_once(") ").unwrap().1.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    ticks as f64 / 100.0
}

/// Each job's leader, read concurrently (a thousand reads in about a tenth of a second).
async fn all_leaders(fleet: &EtcdFleet, jobs: &[String]) -> BTreeMap<String, Option<String>> {
    futures_util::stream::iter(jobs.iter().cloned())
        .map(|job| async move {
            let leader = fleet.leader(&job).await.unwrap();
            (job, leader)
        })
        .buffer_unordered(64)
        .collect()
        .await
}

/// Every change of a job's leader key as an etcd watch of the whole prefix sees it, with
/// when: (job, new leader or `None` when the key went, when).
type LeaderLog = Arc<Mutex<Vec<(String, Option<String>, Instant)>>>;

/// Logs leader changes from now on (a task on the test's runtime).
async fn log_leaders(endpoint: &str) -> LeaderLog {
    let log = LeaderLog::default();
    let mut client = etcd_client::Client::connect([endpoint], None).await.unwrap();
    let options = etcd_client::WatchOptions::new().with_prefix();
    let mut stream = client.watch("/steady/jobs/", Some(options)).await.unwrap();
    let kept = log.clone();
    tokio::spawn(async move {
        while let Ok(Some(response)) = stream.message().await {
            let now = Instant::now();
            for event in response.events() {
                let Some(kv) = event.kv() else { continue };
                let key = String::from_utf8_lossy(kv.key());
                let Some(job) = key.strip_prefix("/steady/jobs/").and_then(|k| k.strip_suffix("/leader"))
                else {
                    continue;
                };
                let leader = match event.event_type() {
                    etcd_client::EventType::Put => Some(String::from_utf8_lossy(kv.value()).into_owned()),
                    etcd_client::EventType::Delete => None,
                };
                kept.lock().unwrap().push((job.to_owned(), leader, now));
            }
        }
    });
    log
}

/// From `log`'s entries after `since`: each job that went unled, how long until led again
/// (`None`: still unled), and when the last of them was led again.
fn unled(log: &LeaderLog, since: Instant) -> (BTreeMap<String, Option<Duration>>, Option<Instant>) {
    let mut gone: BTreeMap<String, Instant> = BTreeMap::new();
    let mut spans: BTreeMap<String, Option<Duration>> = BTreeMap::new();
    let mut last = None;
    for (job, leader, at) in log.lock().unwrap().iter().filter(|(_, _, at)| *at >= since) {
        match leader {
            None => {
                gone.insert(job.clone(), *at);
                spans.insert(job.clone(), None);
            }
            Some(_) => {
                if let Some(went) = gone.remove(job) {
                    spans.insert(job.clone(), Some(*at - went));
                    last = Some(*at);
                }
            }
        }
    }
    (spans, last)
}

/// The fleet's targets, measured: 1,000 jobs of 20 tasks on 3 instances on etcd, at the
/// default cadence (10 s) and lease (5 s). Heavy (about three minutes); run it on a
/// release build and read what it prints:
///
/// `cargo test --release -p steady-slicer-server --test fleet -- --ignored --nocapture a_thousand_jobs`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement of a few minutes: run it by name on a release build"]
async fn a_thousand_jobs_on_three_instances() {
    const JOBS: usize = 1000;
    const CADENCE: Duration = Duration::from_secs(10);
    let Some(etcd) = steady_testing::Etcd::start() else { return };
    let endpoint = etcd.endpoint();
    let store = EtcdStore::connect(EtcdConfig::new([endpoint.clone()])).await.unwrap();
    let specs = SpecStore::Etcd(EtcdSpecs::of(&store));
    let fleet = EtcdFleet::new(&store);
    let log = log_leaders(&endpoint).await;
    let etcd_args = ["--store", "etcd", "--endpoints", endpoint.as_str(), "--lease-ttl-secs", "5"];
    let mut instances: Vec<Running> = ["a", "b", "c"].iter().map(|n| start(n, &etcd_args)).collect();
    until(WAIT, "three instances joined", async || {
        (fleet.instances().await.unwrap().len() == 3).then_some(())
    })
    .await;
    let idle: Vec<u64> = instances.iter().map(|i| rss_kib(i.child.id())).collect();

    let jobs: Vec<String> = (0..JOBS).map(|i| format!("job-{i:04}")).collect();
    let started = Instant::now();
    for name in &jobs {
        // The default cadence (10 s), not the other tests' 200 ms.
        specs
            .put(&JobConfig::new(name.as_str(), TaskSource::Count(20)))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let written = started.elapsed();
    let deadline = Instant::now() + Duration::from_secs(300);
    // Every job led, and by the instance the spread names: none leads more than its cap.
    let cap = JOBS.div_ceil(3);
    let spread = loop {
        if let Some(counts) = counts(&all_leaders(&fleet, &jobs).await) {
            if counts.values().all(|&n| n <= cap) {
                break counts;
            }
        }
        assert!(Instant::now() < deadline, "not every job led by its owner within 5 minutes");
    };
    let all_led = started.elapsed();
    println!("{JOBS} specs (20 tasks each) written in {written:.1?}; every job led {all_led:.1?} after the first write");
    let even = JOBS as f64 / 3.0;
    for (instance, n) in &spread {
        println!("  {instance} leads {n} jobs ({:+.1}% of even)", (*n as f64 - even) / even * 100.0);
    }

    // Steady state: memory per job, CPU per job-run over a window.
    tokio::time::sleep(CADENCE).await;
    let window = Duration::from_secs(60);
    let cpu_before: Vec<f64> = instances.iter().map(|i| cpu_secs(i.child.id())).collect();
    let quiet = Instant::now();
    tokio::time::sleep(window).await;
    let changes = log.lock().unwrap().iter().filter(|(_, _, at)| *at >= quiet).count();
    println!("  leader keys changed {changes} times over the window");
    let cpu: f64 = instances.iter().zip(&cpu_before).map(|(i, b)| cpu_secs(i.child.id()) - b).sum();
    for (i, instance) in instances.iter().enumerate() {
        let rss = rss_kib(instance.child.id());
        println!(
            "  {}: RSS {} KiB idle, {rss} KiB serving {JOBS} jobs and leading {}: {:.1} KiB per job",
            instance.name,
            idle[i],
            spread[&instance.name],
            (rss - idle[i]) as f64 / JOBS as f64
        );
    }
    let runs = JOBS as f64 * window.as_secs_f64() / CADENCE.as_secs_f64();
    println!(
        "  CPU over {window:?}: {cpu:.2} s on the three instances, {:.0} us per job-run ({runs:.0} runs, one per job every \
         {CADENCE:?}; leases and watches included), {:.1}% of a core per instance",
        cpu / runs * 1e6,
        cpu / window.as_secs_f64() / 3.0 * 100.0
    );

    // One instance killed: its jobs led elsewhere.
    let victim = instances.remove(0);
    let theirs = spread[&victim.name];
    let killed = Instant::now();
    drop(victim);
    until(WAIT, "a's jobs led elsewhere", async || {
        let (spans, last) = unled(&log, killed);
        (spans.len() >= theirs && spans.values().all(Option::is_some)).then_some(last)
    })
    .await;
    let (spans, last) = unled(&log, killed);
    let longest = spans.values().flatten().max().copied().unwrap_or_default();
    println!(
        "  a killed: its {theirs} jobs all led elsewhere {:.2?} after the kill; the longest unled {longest:.2?} \
         (the lease is 5 s)",
        last.unwrap() - killed
    );

    // An instance joins: how long any job goes unled as jobs move to it.
    let joined = Instant::now();
    instances.push(start("d", &etcd_args));
    let settled = until(WAIT, "d takes its share, every job led", async || {
        let counts = counts(&all_leaders(&fleet, &jobs).await)?;
        counts.get("d").is_some_and(|&n| n >= JOBS / 4 - 1).then_some(counts)
    })
    .await;
    let (spans, _) = unled(&log, joined);
    let longest = spans.values().flatten().max().copied().unwrap_or_default();
    let over_a_second = spans.values().flatten().filter(|d| **d > Duration::from_secs(1)).count();
    println!(
        "  d joined: leads {} jobs {:.2?} later; {} jobs moved, the longest unled {longest:.2?}, {over_a_second} unled \
         over a second",
        settled["d"],
        joined.elapsed(),
        spans.len()
    );
}
