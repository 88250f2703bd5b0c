//! The `steadyctl` binary against a real etcd on 127.0.0.1 (started per test by
//! `steady_testing::Etcd`; skipped with a message when `etcd` is missing, unless
//! `STEADY_REQUIRE_ETCD` is set): specs put, read and removed (a bad one refused naming
//! its field, the stored one kept); the jobs, instances, an assignment and the tasks as
//! tables and JSON, from state the test writes through the library (memberships, a
//! campaign and a write); drains and undrains changing the stored spec; a run request
//! seen by the fleet's watch; the loads from a leader's page; a spec directory; and
//! one-line refusals with their exit codes.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use steady_slice::{Assignment, Slice, SliceKey};
use steady_slicer::fleet::{EtcdFleet, Instance};
use steady_slicer::specs::{EtcdSpecs, JobConfig, SpecStore, TaskSource};
use steady_slicer::store::{AssignmentStore, EtcdConfig, EtcdStore, Leadership};
use steady_testing::{within, Etcd};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const BIN: &str = env!("CARGO_BIN_EXE_steadyctl");
/// The most any single step may take.
const WAIT: Duration = Duration::from_secs(20);

/// How a run of the binary ended.
#[derive(Debug)]
struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Ran {
    /// Its stdout, after checking it exited 0 with nothing on stderr.
    fn ok(self) -> String {
        assert_eq!(self.code, Some(0), "{self:?}");
        assert_eq!(self.stderr, "", "{self:?}");
        self.stdout
    }

    /// Its stderr's one line, after checking it exited with `code` and printed nothing.
    fn refused(self, code: i32) -> String {
        assert_eq!(self.code, Some(code), "{self:?}");
        assert_eq!(self.stdout, "", "{self:?}");
        assert_eq!(self.stderr.lines().count(), 1, "one line: {self:?}");
        assert!(self.stderr.starts_with("steadyctl: "), "{self:?}");
        self.stderr.trim_end().to_owned()
    }

    fn json(self) -> Value {
        let stdout = self.ok();
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
    }
}

/// Runs `steadyctl ARGS` (killed if it runs past [`WAIT`]: it must end by itself).
async fn ctl<S: AsRef<str>>(args: &[S]) -> Ran {
    let args: Vec<String> = args.iter().map(|a| a.as_ref().to_owned()).collect();
    tokio::task::spawn_blocking(move || {
        let mut child = Command::new(BIN)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
        let stdout = std::thread::spawn(move || {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut out, &mut text).unwrap();
            text
        });
        let stderr = std::thread::spawn(move || {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut err, &mut text).unwrap();
            text
        });
        let deadline = Instant::now() + WAIT;
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("steadyctl {args:?}: still running after {WAIT:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        Ran { code: status.code(), stdout: stdout.join().unwrap(), stderr: stderr.join().unwrap() }
    })
    .await
    .unwrap()
}

/// A fleet on a fresh etcd: its endpoint, and the library's handles on it.
struct Fleet {
    etcd: Etcd,
    store: EtcdStore,
    specs: SpecStore,
    fleet: EtcdFleet,
}

impl Fleet {
    async fn start() -> Option<Self> {
        let etcd = Etcd::start()?;
        let config = EtcdConfig::new([etcd.endpoint()]).request_timeout(Duration::from_secs(3));
        let store = within(WAIT, "connecting", EtcdStore::connect(config)).await.unwrap();
        let specs = SpecStore::Etcd(EtcdSpecs::of(&store));
        let fleet = EtcdFleet::new(&store);
        Some(Self { etcd, store, specs, fleet })
    }

    /// `steadyctl --endpoints ETCD ARGS`.
    async fn ctl(&self, args: &[&str]) -> Ran {
        let endpoint = self.etcd.endpoint();
        ctl(&[&["--endpoints", endpoint.as_str()], args].concat()).await
    }

    async fn put(&self, job: &str, tasks: u32) -> JobConfig {
        let config = JobConfig::new(job, TaskSource::Count(tasks));
        self.specs.put(&config).await.unwrap();
        config
    }

    /// `candidate` leads `job` and has written `assignment`.
    async fn lead(&self, job: &str, candidate: &str, assignment: &Assignment) -> Leadership {
        let leadership = within(WAIT, "campaigning", self.store.campaign(job, candidate)).await.unwrap();
        let snapshot = self.store.read(job).await.unwrap();
        self.store.write(&leadership, &snapshot, assignment).await.unwrap();
        leadership
    }
}

/// A file removed with its directory when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("steadyctl-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn write(&self, name: &str, text: &str) -> String {
        let path = self.0.join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// An assignment of `n` equal slices over tasks `0..tasks`, slice `i` on task `i % tasks`.
fn equal_slices(generation: u64, n: u64, tasks: u32) -> Assignment {
    let width = u64::MAX / n + 1;
    let slices = (0..n).map(|i| Slice::new(SliceKey(i * width), [(i % u64::from(tasks)) as u32])).collect();
    Assignment::new(generation, slices).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spec_goes_in_comes_out_and_a_bad_one_is_refused_naming_its_field() {
    let Some(fleet) = Fleet::start().await else { return };
    let files = TempDir::new("specs");
    let users = JobConfig::new("users", TaskSource::Count(4));
    let file = files.write("users.json", &users.to_json());
    assert_eq!(fleet.ctl(&["spec", "put", &file]).await.ok(), "users: spec created\n");
    assert_eq!(fleet.specs.get("users").await.unwrap(), Some(users.clone()));
    assert_eq!(fleet.ctl(&["spec", "get", "users"]).await.ok(), users.to_json());
    let mut changed = users.clone();
    changed.cadence = Duration::from_secs(2);
    let file = files.write("users.json", &changed.to_json());
    assert_eq!(
        fleet.ctl(&["spec", "put", &file, "--json"]).await.json(),
        serde_json::json!({"job": "users", "spec": "replaced"})
    );
    assert_eq!(fleet.specs.get("users").await.unwrap(), Some(changed.clone()));

    // Refused by the document's reader (out of range; an unknown field) and by the
    // store's check of a first run (a count whose first assignment cannot be stored):
    // one line naming the field, and the stored spec stays.
    let out_of_range = changed.to_json().replace("\"cadence_ms\": 2000", "\"cadence_ms\": 1");
    let unknown = changed.to_json().replace("\"cadence_ms\"", "\"cadense_ms\"");
    // (Static: one slice per task, 14 bytes each, so 120,000 tasks do not fit in 1 MiB.)
    let too_many = changed
        .to_json()
        .replace("\"count\": 4", "\"count\": 120000")
        .replace("\"weighted-move\"", "\"static\"");
    for (document, field) in
        [(out_of_range, "cadence_ms"), (unknown, "cadense_ms"), (too_many, "tasks.count")]
    {
        let file = files.write("bad.json", &document);
        let line = fleet.ctl(&["spec", "put", &file]).await.refused(1);
        assert!(line.contains("spec refused") && line.contains(field), "{field}: {line}");
        assert_eq!(fleet.specs.get("users").await.unwrap(), Some(changed.clone()));
    }
    let missing = fleet.ctl(&["spec", "put", "/nonexistent/users.json"]).await.refused(1);
    assert!(missing.starts_with("steadyctl: /nonexistent/users.json: "), "{missing}");

    assert_eq!(fleet.ctl(&["spec", "delete", "users"]).await.ok(), "users: spec removed\n");
    assert_eq!(fleet.specs.get("users").await.unwrap(), None);
    for args in [&["spec", "get", "users"][..], &["spec", "delete", "users"][..]] {
        assert_eq!(
            fleet.ctl(args).await.refused(1),
            "steadyctl: no job \"users\" (no spec of it in the store)"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_lists_each_job_with_its_leader_and_generation() {
    let Some(fleet) = Fleet::start().await else { return };
    fleet.put("users", 4).await;
    let mut orders = JobConfig::new("orders", TaskSource::Dns("orders.prod.svc.cluster.local.".into()));
    orders.drained.extend([3, 5]);
    fleet.specs.put(&orders).await.unwrap();
    let _leading = fleet.lead("users", "slicer-a", &equal_slices(12, 8, 4)).await;

    let table = fleet.ctl(&["jobs"]).await.ok();
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "{table}");
    let words: Vec<Vec<&str>> = lines.iter().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(
        words[0],
        ["JOB", "ALGORITHM", "TASKS-SOURCE", "CONSISTENCY", "LEADER", "GENERATION", "DRAINED"]
    );
    assert_eq!(
        words[1],
        ["orders", "weighted-move", "dns", "orders.prod.svc.cluster.local.", "eventual", "-", "-", "3", "5"]
    );
    assert_eq!(words[2], ["users", "weighted-move", "count", "4", "eventual", "slicer-a", "12", "-"]);
    // Aligned: every column starts where its header does.
    let at = lines[0].find("GENERATION").unwrap() + "GENERATION".len();
    assert_eq!(&lines[2][at - 2..at], "12", "{table}");

    let json = fleet.ctl(&["jobs", "--json"]).await.json();
    assert_eq!(
        json["jobs"][1],
        serde_json::json!({
            "job": "users", "algorithm": "weighted-move", "tasks": {"count": 4},
            "consistency": "eventual", "leader": "slicer-a", "generation": 12, "drained": []
        })
    );
    assert_eq!(json["jobs"][0]["tasks"], serde_json::json!({"dns": "orders.prod.svc.cluster.local."}));
    assert_eq!(json["jobs"][0]["leader"], Value::Null);
    assert_eq!(json["jobs"][0]["generation"], Value::Null);
    assert_eq!(json["jobs"][0]["drained"], serde_json::json!([3, 5]));
    assert_eq!(json["rejected"], serde_json::json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_and_undrain_change_the_stored_spec() {
    let Some(fleet) = Fleet::start().await else { return };
    let users = fleet.put("users", 8).await;
    assert_eq!(fleet.ctl(&["drain", "users", "3", "5"]).await.ok(), "users: drained: 3 5\n");
    let stored = fleet.specs.get("users").await.unwrap().unwrap();
    assert_eq!(stored.drained.iter().copied().collect::<Vec<_>>(), [3, 5]);
    // The rest of the spec is as it was.
    assert_eq!(JobConfig { drained: Default::default(), ..stored }, users);
    assert_eq!(
        fleet.ctl(&["undrain", "users", "3", "7", "--json"]).await.json(),
        serde_json::json!({"job": "users", "drained": [5], "changed": true})
    );
    assert_eq!(fleet.specs.get("users").await.unwrap().unwrap().drained.into_iter().collect::<Vec<_>>(), [5]);
    assert_eq!(fleet.ctl(&["drain", "users", "5"]).await.ok(), "users: drained: 5 (unchanged)\n");
    assert_eq!(fleet.ctl(&["undrain", "users", "5"]).await.ok(), "users: drained: -\n");
    assert!(fleet.specs.get("users").await.unwrap().unwrap().drained.is_empty());
    assert_eq!(
        fleet.ctl(&["drain", "nobody", "1"]).await.refused(1),
        "steadyctl: no job \"nobody\" (no spec of it in the store)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_lists_the_members_and_the_jobs_each_leads() {
    let Some(fleet) = Fleet::start().await else { return };
    let a = Instance { address: "10.0.0.5:50070".into(), pages: Some("10.0.0.5:9464".into()) };
    let b = Instance { address: "10.0.0.6:50070".into(), pages: None };
    let _a = fleet.fleet.join("slicer-a", &a).await.unwrap();
    let _b = fleet.fleet.join("slicer-b", &b).await.unwrap();
    fleet.put("users", 2).await;
    fleet.put("orders", 2).await;
    fleet.put("carts", 2).await;
    let _users = fleet.lead("users", "slicer-a", &equal_slices(1, 2, 2)).await;
    let _orders = fleet.lead("orders", "slicer-a", &equal_slices(1, 2, 2)).await;

    assert_eq!(
        fleet.ctl(&["instances"]).await.ok(),
        "NAME      ADDRESS         PAGES          LEADS\n\
         slicer-a  10.0.0.5:50070  10.0.0.5:9464      2\n\
         slicer-b  10.0.0.6:50070  -                  0\n"
    );
    assert_eq!(
        fleet.ctl(&["instances", "--json"]).await.json(),
        serde_json::json!({"instances": [
            {"name": "slicer-a", "address": "10.0.0.5:50070", "pages": "10.0.0.5:9464", "leads": 2,
             "jobs": ["orders", "users"]},
            {"name": "slicer-b", "address": "10.0.0.6:50070", "pages": null, "leads": 0, "jobs": []},
        ]})
    );
    // A leader that is no live instance is counted apart, in a note.
    let _carts = fleet.lead("carts", "a-lone-steady-slicer", &equal_slices(1, 2, 2)).await;
    let ran = fleet.ctl(&["instances"]).await;
    assert_eq!(ran.code, Some(0));
    assert_eq!(
        ran.stderr,
        "steadyctl: note: 1 job(s) led by candidates that are not live instances of the fleet: a-lone-steady-slicer\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_prints_the_assignment_as_a_table_and_every_slice_in_json() {
    let Some(fleet) = Fleet::start().await else { return };
    fleet.put("users", 4).await;
    let assignment = Assignment::new(
        7,
        vec![
            Slice::new(SliceKey(0), [3, 1]),
            Slice::new(SliceKey(1 << 62), [2]).with_warming([0]),
            Slice::new(SliceKey(1 << 63), [1]),
        ],
    )
    .unwrap();
    let leading = fleet.lead("users", "slicer-a", &assignment).await;
    let text = fleet.ctl(&["show", "users"]).await.ok();
    assert_eq!(
        text,
        "job          users\n\
         algorithm    weighted-move\n\
         tasks        count 4\n\
         consistency  eventual\n\
         cadence      10000 ms\n\
         lease        5 s\n\
         handover     -\n\
         replicas     1 to 1\n\
         drained      -\n\
         leader       slicer-a\n\
         generation   7\n\
         slices       3\n\
         \n\
         START             END               REPLICAS\n\
         0000000000000000  3fffffffffffffff  3 1\n\
         4000000000000000  7fffffffffffffff  2 0*\n\
         8000000000000000  ffffffffffffffff  1\n\
         * warming: named to take the slice over, not serving it yet\n"
    );

    // Every slice in JSON, with the spec's document as the store keeps it.
    let many = equal_slices(8, 1000, 4);
    let snapshot = fleet.store.read("users").await.unwrap();
    fleet.store.write(&leading, &snapshot, &many).await.unwrap();
    let json = fleet.ctl(&["show", "users", "--json"]).await.json();
    assert_eq!(json["job"], "users");
    assert_eq!(json["leader"], "slicer-a");
    assert_eq!(json["generation"], 8);
    assert_eq!(json["spec"], serde_json::to_value(fleet.specs.get("users").await.unwrap().unwrap()).unwrap());
    let slices = json["slices"].as_array().unwrap();
    assert_eq!(slices.len(), 1000);
    for (i, (slice, row)) in many.slices().iter().zip(slices).enumerate() {
        assert_eq!(row["start"], format!("{:016x}", slice.start.get()));
        let end = many.slices().get(i + 1).map_or(u64::MAX, |next| next.start.get() - 1);
        assert_eq!(row["end"], format!("{end:016x}"));
        assert_eq!(row["replicas"], serde_json::json!(slice.replicas()));
        assert_eq!(row["warming"], serde_json::json!([]));
    }
    assert_eq!(
        fleet.ctl(&["show", "nobody"]).await.refused(1),
        "steadyctl: no job \"nobody\" (no spec of it in the store)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_is_seen_by_the_fleets_run_request_watch() {
    let Some(fleet) = Fleet::start().await else { return };
    fleet.put("users", 2).await;
    let mut requests = fleet.fleet.watch_run_requests();
    // The watch reports requests made after its first listing: make one until it is seen,
    // so that the next is steadyctl's alone.
    let listed = async {
        loop {
            fleet.fleet.request_run("warm-up").await.unwrap();
            if let Ok(Some(jobs)) = tokio::time::timeout(Duration::from_millis(500), requests.next()).await {
                assert_eq!(jobs, ["warm-up"]);
                return;
            }
        }
    };
    within(WAIT, "the watch's first listing", listed).await;
    assert_eq!(
        fleet.ctl(&["run", "users"]).await.ok(),
        "users: run requested; no instance leads it now; the next leader runs it when it starts\n"
    );
    assert_eq!(within(WAIT, "steadyctl's request", requests.next()).await.unwrap(), ["users"]);
    let _leading = fleet.lead("users", "slicer-a", &equal_slices(1, 2, 2)).await;
    assert_eq!(
        fleet.ctl(&["run", "users", "--json"]).await.json(),
        serde_json::json!({"job": "users", "requested": true, "leader": "slicer-a"})
    );
    assert_eq!(within(WAIT, "steadyctl's request", requests.next()).await.unwrap(), ["users"]);
    // An unknown job is not asked for.
    assert_eq!(
        fleet.ctl(&["run", "nobody"]).await.refused(1),
        "steadyctl: no job \"nobody\" (no spec of it in the store)"
    );
}

/// Serves `page` as every answer to `GET /jobs/users.json` on 127.0.0.1 (404 to any
/// other path) until dropped.
async fn serve_page(page: String) -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let server = tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else { return };
            let page = page.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0; 1024];
                while !head.ends_with(b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let answer = if head.starts_with(b"GET /jobs/users.json ") {
                    format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{page}", page.len())
                } else {
                    "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n".to_owned()
                };
                let _ = stream.write_all(answer.as_bytes()).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    (address, server)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_shows_loads_from_the_leaders_page_and_dashes_without_one() {
    let Some(fleet) = Fleet::start().await else { return };
    let mut users = JobConfig::new("users", TaskSource::Count(4));
    users.drained.insert(3);
    fleet.specs.put(&users).await.unwrap();
    // Tasks 0, 1, 2 serve a quarter, a quarter and a half of the keys.
    let assignment = Assignment::new(
        5,
        vec![
            Slice::new(SliceKey(0), [0]),
            Slice::new(SliceKey(1 << 62), [1]),
            Slice::new(SliceKey(1 << 63), [2]),
        ],
    )
    .unwrap();
    let _leading = fleet.lead("users", "slicer-a", &assignment).await;

    // The leader serves no pages: every load is `-`, and one note says why.
    let quiet =
        fleet.fleet.join("slicer-a", &Instance { address: "127.0.0.1:1".into(), pages: None }).await.unwrap();
    let ran = fleet.ctl(&["tasks", "users"]).await;
    assert_eq!(ran.code, Some(0), "{ran:?}");
    assert_eq!(
        ran.stdout,
        "TASK  STATE     SLICES  KEY-SHARE  LOAD\n   \
            0  serving        1     25.00%     -\n   \
            1  serving        1     25.00%     -\n   \
            2  serving        1     50.00%     -\n   \
            3  draining       0      0.00%     -\n"
    );
    assert_eq!(
        ran.stderr,
        "steadyctl: note: no loads (LOAD shows -): its leader \"slicer-a\" serves no pages\n"
    );
    quiet.leave().await;

    // With pages: the loads the leader's page gives.
    let page = serde_json::json!({
        "job": "users", "generation": 5, "owner": "slicer-a", "here": "leading",
        "tasks": [
            {"task": 0, "state": "serving", "slices": 1, "key_share": 0.25, "load": 12.5},
            {"task": 1, "state": "serving", "slices": 1, "key_share": 0.25, "load": 7.25},
            {"task": 2, "state": "serving", "slices": 1, "key_share": 0.5, "load": null},
            {"task": 3, "state": "draining", "slices": 0, "key_share": 0.0, "load": 0.0},
        ]
    });
    let (pages, _server) = serve_page(page.to_string()).await;
    let _paged = fleet
        .fleet
        .join("slicer-a", &Instance { address: "127.0.0.1:1".into(), pages: Some(pages) })
        .await
        .unwrap();
    let text = fleet.ctl(&["tasks", "users"]).await.ok();
    assert_eq!(
        text,
        "TASK  STATE     SLICES  KEY-SHARE   LOAD\n   \
            0  serving        1     25.00%  12.50\n   \
            1  serving        1     25.00%   7.25\n   \
            2  serving        1     50.00%      -\n   \
            3  draining       0      0.00%   0.00\n"
    );
    assert_eq!(
        fleet.ctl(&["tasks", "users", "--json"]).await.json(),
        serde_json::json!({"job": "users", "generation": 5, "leader": "slicer-a", "tasks": [
            {"task": 0, "state": "serving", "slices": 1, "key_share": 0.25, "load": 12.5},
            {"task": 1, "state": "serving", "slices": 1, "key_share": 0.25, "load": 7.25},
            {"task": 2, "state": "serving", "slices": 1, "key_share": 0.5, "load": null},
            {"task": 3, "state": "draining", "slices": 0, "key_share": 0.0, "load": 0.0},
        ]})
    );
}

#[tokio::test]
async fn a_spec_directory_serves_specs_and_drains_and_refuses_the_rest() {
    let dir = TempDir::new("dir");
    let files = TempDir::new("dir-files");
    let specs_dir = dir.path().to_str().unwrap().to_owned();
    let here = |args: &[&str]| -> Vec<String> {
        ["--specs-dir", specs_dir.as_str()].iter().chain(args).map(|a| (*a).to_owned()).collect()
    };
    let users = JobConfig::new("users", TaskSource::Count(4));
    let file = files.write("users.json", &users.to_json());
    assert_eq!(ctl(&here(&["spec", "put", &file])).await.ok(), "users: spec created\n");
    assert_eq!(std::fs::read_to_string(dir.path().join("users.json")).unwrap(), users.to_json());
    assert_eq!(ctl(&here(&["drain", "users", "2"])).await.ok(), "users: drained: 2\n");
    let stored = JobConfig::from_json(&std::fs::read(dir.path().join("users.json")).unwrap()).unwrap();
    assert_eq!(stored.drained.into_iter().collect::<Vec<_>>(), [2]);
    assert_eq!(ctl(&here(&["spec", "list"])).await.ok(), "JOB\nusers\n");
    // A file written around the store that is no valid spec: left out, with a note.
    std::fs::write(dir.path().join("carts.json"), r#"{"version": 1, "job": "carts", "tasks": {"count": 0}}"#)
        .unwrap();
    let ran = ctl(&here(&["spec", "list"])).await;
    assert_eq!((ran.code, ran.stdout.as_str()), (Some(0), "JOB\nusers\n"));
    assert_eq!(ran.stderr.lines().count(), 1, "{ran:?}");
    assert!(
        ran.stderr.starts_with("steadyctl: note: the stored spec of job \"carts\" is refused: ")
            && ran.stderr.contains("tasks.count"),
        "{ran:?}"
    );
    let json = ctl(&here(&["spec", "list", "--json"])).await;
    let json: Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(json["jobs"], serde_json::json!(["users"]));
    assert_eq!(json["rejected"][0]["job"], "carts");
    std::fs::remove_file(dir.path().join("carts.json")).unwrap();
    for command in ["run", "show", "tasks"] {
        let line = ctl(&here(&[command, "users"])).await.refused(1);
        assert!(
            line.starts_with(&format!("steadyctl: {command} needs --endpoints (the fleet's etcd)")),
            "{line}"
        );
    }
    for command in ["jobs", "instances"] {
        let line = ctl(&here(&[command])).await.refused(1);
        assert!(line.starts_with(&format!("steadyctl: {command} needs --endpoints")), "{line}");
    }
    let line = ctl(&here(&["--etcd-user", "ops", "spec", "list"])).await.refused(1);
    assert_eq!(line, "steadyctl: --etcd-user is for --endpoints (an etcd to reach)");
    assert_eq!(ctl(&here(&["spec", "delete", "users"])).await.ok(), "users: spec removed\n");
    assert!(!dir.path().join("users.json").exists());
}

#[tokio::test]
async fn what_the_command_line_refuses_is_one_line_and_exit_2() {
    for (args, expected) in [
        (&["jobs"][..], "where is the fleet?"),
        (&["--endpoints", "http://127.0.0.1:1", "jobz"][..], "a similar command exists: 'jobs'"),
        (&["--endpoints", "http://127.0.0.1:1", "drain", "users"][..], "<TASKS>..."),
        (&["--endpoints", "http://127.0.0.1:1", "drain", "users", "-3"][..], "invalid value '-3'"),
        (&["--endpoints", "http://127.0.0.1:1", "show"][..], "<JOB>"),
        (&["--endpoints", "http://127.0.0.1:1", "--specs-dir", "/tmp", "jobs"][..], "cannot be used with"),
        (
            &["--endpoints", "http://127.0.0.1:1", "--frobnicate", "jobs"][..],
            "unexpected argument '--frobnicate'",
        ),
    ] {
        let line = ctl(args).await.refused(2);
        assert!(line.contains(expected), "{args:?}: {line}");
        assert!(line.ends_with("(see 'steadyctl --help')"), "{line}");
    }
    // An etcd that cannot be reached is a failure of the command: exit 1, one line.
    let line = ctl(&["--endpoints", "http://127.0.0.1:1", "--timeout-ms", "500", "jobs"]).await.refused(1);
    assert!(line.contains("unreachable"), "{line}");
}
