//! `SpecDirectory`: job specs as `<job>.json` files in a temporary directory: put, get,
//! list and delete (atomic writes, bad specs refused by job and field), and the watch
//! (the current set first, changes seen by content on reload or poll, a bad file refused
//! once and the last good spec kept, a removed file removing its job, the job bound).

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures_util::StreamExt;
use steady_slicer::specs::{
    JobConfig, SpecChange, SpecDirectory, SpecStore, SpecStoreError, SpecWatch, TaskSource, MAX_JOBS,
};
use steady_testing::within;

const WAIT: Duration = Duration::from_secs(15);
/// A poll period no test waits for: changes come through `reload`.
const NEVER: Duration = Duration::from_secs(3600);

/// A directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("steady-specs-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }

    /// Writes `file` whole (through a temporary file renamed into place), so a watch
    /// reading meanwhile never sees half of it.
    fn write(&self, file: &str, contents: &[u8]) {
        let temporary = self.0.join(format!(".{file}.tmp"));
        std::fs::write(&temporary, contents).unwrap();
        std::fs::rename(temporary, self.0.join(file)).unwrap();
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn job(name: &str, tasks: u32) -> JobConfig {
    JobConfig::new(name, TaskSource::Count(tasks))
}

fn store(dir: &TempDir, poll: Duration) -> SpecStore {
    SpecStore::Directory(SpecDirectory::open(dir.path(), poll).unwrap())
}

async fn next(watch: &mut SpecWatch) -> Result<SpecChange, SpecStoreError> {
    within(WAIT, "the next spec change", watch.next()).await.expect("a watch never ends")
}

async fn next_change(watch: &mut SpecWatch) -> SpecChange {
    next(watch).await.expect("a change")
}

/// The file names in `dir`.
fn files(dir: &TempDir) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn put_get_list_and_delete_go_through_files() {
    let dir = TempDir::new("crud");
    let store = store(&dir, NEVER);
    assert_eq!(store.get("users").await.unwrap(), None);
    let users = job("users", 8);
    store.put(&users).await.unwrap();
    assert_eq!(store.get("users").await.unwrap(), Some(users.clone()));
    // The file is the document; the temporary file was renamed away.
    assert_eq!(std::fs::read_to_string(dir.path().join("users.json")).unwrap(), users.to_json());
    assert_eq!(files(&dir), ["users.json"]);
    let mut changed = users.clone();
    changed.cadence = Duration::from_secs(3);
    store.put(&changed).await.unwrap();
    store.put(&job("orders", 4)).await.unwrap();
    let listing = store.list().await.unwrap();
    assert_eq!(listing.specs, [job("orders", 4), changed]);
    assert!(listing.rejected.is_empty());
    assert!(store.delete("users").await.unwrap());
    assert!(!store.delete("users").await.unwrap());
    assert_eq!(files(&dir), ["orders.json"]);
}

#[tokio::test]
async fn a_bad_spec_is_refused_by_job_and_field_and_the_stored_one_stays() {
    let dir = TempDir::new("refused");
    let store = store(&dir, NEVER);
    let users = job("users", 8);
    store.put(&users).await.unwrap();
    let mut bad = users.clone();
    bad.cadence = Duration::from_millis(1);
    match store.put(&bad).await {
        Err(SpecStoreError::Invalid { job, error }) => {
            assert_eq!((job.as_str(), error.field.as_str()), ("users", "cadence_ms"));
        }
        other => panic!("{other:?}"),
    }
    // Too large a first assignment is refused at put too (one run of the algorithm).
    match store.put(&job("users", 1024)).await {
        Err(SpecStoreError::Invalid { error, .. }) => assert_eq!(error.field, "tasks.count"),
        other => panic!("{other:?}"),
    }
    assert_eq!(store.get("users").await.unwrap(), Some(users));
    // Names a file cannot carry: refused by field, nothing written.
    for name in ["team/users", ".hidden"] {
        match store.put(&job(name, 2)).await {
            Err(SpecStoreError::Invalid { job, error }) => {
                assert_eq!((job.as_str(), error.field.as_str()), (name, "job"))
            }
            other => panic!("{name}: {other:?}"),
        }
        assert!(matches!(store.delete(name).await, Err(SpecStoreError::Invalid { .. })));
    }
    assert_eq!(files(&dir), ["users.json"]);
}

#[tokio::test]
async fn a_file_written_by_hand_that_is_bad_is_refused_by_get_and_list() {
    let dir = TempDir::new("by-hand");
    let store = store(&dir, NEVER);
    dir.write("users.json", b"{\"version\": 1, \"job\": \"users\", \"tasks\": {\"count\": 0}}");
    dir.write("other.json", job("orders", 2).to_json().as_bytes());
    dir.write("notes.txt", b"not a spec");
    dir.write(".users.json.swp", b"an editor's");
    match store.get("users").await {
        Err(SpecStoreError::Rejected(rejected)) => {
            assert_eq!((rejected.job.as_str(), rejected.error.field()), ("users", "tasks.count"));
        }
        other => panic!("{other:?}"),
    }
    let listing = store.list().await.unwrap();
    assert!(listing.specs.is_empty(), "{listing:?}");
    let mut refused: Vec<(String, String)> =
        listing.rejected.iter().map(|r| (r.job.clone(), r.error.field().to_owned())).collect();
    refused.sort();
    // `other.json` names job "orders": refused by its file's name.
    assert_eq!(
        refused,
        [("other".to_owned(), "job".to_owned()), ("users".to_owned(), "tasks.count".to_owned())]
    );
}

#[tokio::test]
async fn the_watch_gives_the_current_set_then_each_change_seen_by_content() {
    let dir = TempDir::new("watch");
    let store = store(&dir, NEVER);
    store.put(&job("users", 8)).await.unwrap();
    dir.write("broken.json", b"{");
    let mut watch = store.watch();
    assert_eq!(next_change(&mut watch).await, SpecChange::Current(vec![job("users", 8)]));
    // The bad file at start: refused by name, after the current set.
    match next(&mut watch).await {
        Err(SpecStoreError::Rejected(rejected)) => assert_eq!(rejected.job, "broken"),
        other => panic!("{other:?}"),
    }
    // A put and a hand-written file, seen at the reload.
    store.put(&job("orders", 4)).await.unwrap();
    store.reload();
    assert_eq!(next_change(&mut watch).await, SpecChange::Put(job("orders", 4)));
    dir.write("carts.json", job("carts", 2).to_json().as_bytes());
    store.reload();
    assert_eq!(next_change(&mut watch).await, SpecChange::Put(job("carts", 2)));
    // A bad edit: refused once; the last good spec stays in force.
    dir.write(
        "users.json",
        b"{\"version\": 1, \"job\": \"users\", \"tasks\": {\"count\": 8}, \"cadense_ms\": 5}",
    );
    store.reload();
    match next(&mut watch).await {
        Err(SpecStoreError::Rejected(rejected)) => {
            assert_eq!((rejected.job.as_str(), rejected.error.field()), ("users", "cadense_ms"));
        }
        other => panic!("{other:?}"),
    }
    // Read again unchanged (and the good spec written back, and a file rewritten with
    // the same bytes): nothing, so the next item is the change after them.
    store.reload();
    store.put(&job("users", 8)).await.unwrap();
    store.reload();
    dir.write("carts.json", job("carts", 2).to_json().as_bytes());
    store.put(&job("orders", 6)).await.unwrap();
    store.reload();
    assert_eq!(next_change(&mut watch).await, SpecChange::Put(job("orders", 6)));
    // A file removed removes its job; the bad one's removal changes nothing.
    std::fs::remove_file(dir.path().join("carts.json")).unwrap();
    std::fs::remove_file(dir.path().join("broken.json")).unwrap();
    store.reload();
    assert_eq!(next_change(&mut watch).await, SpecChange::Removed("carts".into()));
    assert!(store.delete("orders").await.unwrap());
    store.reload();
    assert_eq!(next_change(&mut watch).await, SpecChange::Removed("orders".into()));
}

#[tokio::test]
async fn the_watch_reads_the_directory_every_poll_period() {
    let dir = TempDir::new("poll");
    let store = store(&dir, Duration::from_millis(20));
    let mut watch = store.watch();
    assert_eq!(next_change(&mut watch).await, SpecChange::Current(vec![]));
    dir.write("users.json", job("users", 3).to_json().as_bytes());
    assert_eq!(next_change(&mut watch).await, SpecChange::Put(job("users", 3)));
    std::fs::remove_file(dir.path().join("users.json")).unwrap();
    assert_eq!(next_change(&mut watch).await, SpecChange::Removed("users".into()));
}

#[tokio::test]
async fn a_missing_directory_is_an_error_item_and_the_specs_in_force_stay() {
    let dir = TempDir::new("missing");
    let store = store(&dir, NEVER);
    store.put(&job("users", 3)).await.unwrap();
    let mut watch = store.watch();
    assert_eq!(next_change(&mut watch).await, SpecChange::Current(vec![job("users", 3)]));
    let moved = dir.path().with_extension("moved");
    std::fs::rename(dir.path(), &moved).unwrap();
    store.reload();
    assert!(matches!(next(&mut watch).await, Err(SpecStoreError::Io { .. })));
    // Back, with a change: the spec in force was kept (no `Removed` came before).
    std::fs::rename(&moved, dir.path()).unwrap();
    dir.write("users.json", job("users", 5).to_json().as_bytes());
    store.reload();
    assert_eq!(next_change(&mut watch).await, SpecChange::Put(job("users", 5)));
}

#[test]
fn a_store_needs_a_directory_and_a_poll_period_in_range() {
    let dir = TempDir::new("open");
    assert!(matches!(SpecDirectory::open(dir.path().join("absent"), NEVER), Err(SpecStoreError::Io { .. })));
    dir.write("file", b"");
    assert!(matches!(SpecDirectory::open(dir.path().join("file"), NEVER), Err(SpecStoreError::Io { .. })));
    for poll in [Duration::from_millis(9), Duration::from_secs(3601)] {
        assert!(matches!(
            SpecDirectory::open(dir.path(), poll),
            Err(SpecStoreError::InvalidSetting { field: "poll", .. })
        ));
    }
}

#[tokio::test]
async fn no_more_than_max_jobs_are_stored_or_listed() {
    let dir = TempDir::new("bound");
    for i in 0..MAX_JOBS {
        let name = format!("j{i}");
        dir.write(&format!("{name}.json"), job(&name, 1).to_json().as_bytes());
    }
    let store = store(&dir, NEVER);
    assert!(matches!(store.put(&job("past", 1)).await, Err(SpecStoreError::TooManyJobs { .. })));
    // A job already stored may change.
    store.put(&job("j0", 2)).await.unwrap();
    let mut watch = store.watch();
    let SpecChange::Current(jobs) = next_change(&mut watch).await else { panic!("Current first") };
    assert_eq!(jobs.len(), MAX_JOBS);
    // One file more: the directory is refused as a whole; the specs in force stay.
    dir.write("past.json", job("past", 1).to_json().as_bytes());
    store.reload();
    assert!(matches!(next(&mut watch).await, Err(SpecStoreError::TooManySpecs { .. })));
    assert!(matches!(store.list().await, Err(SpecStoreError::TooManySpecs { .. })));
    std::fs::remove_file(dir.path().join("j1.json")).unwrap();
    store.reload();
    let mut changes = vec![next_change(&mut watch).await, next_change(&mut watch).await];
    changes.sort_by_key(|c| format!("{c:?}"));
    assert_eq!(changes, [SpecChange::Put(job("past", 1)), SpecChange::Removed("j1".into())]);
}
