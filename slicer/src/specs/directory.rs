//! [`SpecDirectory`]: job specs as `<job>.json` files in a directory, for the in-memory
//! store (or any deployment that ships its configuration as files: a ConfigMap, a
//! checkout).

use std::collections::VecDeque;
use std::fs::File;
use std::hash::{Hash, Hasher};
use std::io::{ErrorKind, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::in_force::{InForce, SpecItem};
use super::{
    checked_document, document, DocumentError, JobConfig, JobConfigError, RejectedSpec, SpecListing,
    SpecStoreError, SpecWatch, MAX_JOBS, MAX_SPEC_BYTES,
};

/// A spec file's name: `<job>` and this.
const SUFFIX: &str = ".json";
/// The longest job name a file can carry (a file name is at most 255 bytes).
const MAX_FILE_JOB_LEN: usize = 255 - SUFFIX.len();
/// The shortest and longest poll period.
const MIN_POLL: Duration = Duration::from_millis(10);
const MAX_POLL: Duration = Duration::from_secs(3600);

/// Job specs in a directory: job `J`'s is the file `DIR/J.json` (the JSON document of
/// [`JobConfig`]), so a job name here is also a file name: no `/` or NUL, not starting
/// with `.`, at most 250 bytes ([`SpecStoreError::Invalid`] for others).
///
/// * Read: every `*.json` file not starting with `.` (editors' and this store's
///   temporary files do; so do a Kubernetes volume's `..data` links) that is a file
///   (through symlinks). Others are ignored.
/// * [`SpecDirectory::put`] and [`SpecDirectory::delete`] write through a temporary
///   file renamed into place, so a reader sees the old document or the new, never half
///   of one, and have this handle's watches read the directory at once. An operator's editor may not: a half-written file is refused by the watch,
///   the last good spec staying, and taken once it is whole.
/// * A watch reads the directory at start, every poll period, and at once on
///   [`SpecDirectory::reload`]; it sees a change by content (a hash of each file's
///   bytes), whatever the file's times, so a ConfigMap's symlink swap counts. A file
///   that does not parse or validate is refused by name, once per content, and the
///   job's last good spec stays; a file removed removes its job. Each read costs a read
///   of every spec file (at most [`MAX_JOBS`] of [`MAX_SPEC_BYTES`]); a directory of more
///   spec files is refused as a whole, the specs in force staying.
#[derive(Debug, Clone)]
pub struct SpecDirectory {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    dir: PathBuf,
    poll: Duration,
    /// Bumped by `reload`; each watch reads the directory when it changes.
    reloads: watch::Sender<u64>,
    /// Names the temporary files of this process's puts apart.
    temporaries: AtomicU64,
}

impl SpecDirectory {
    /// The specs in `dir`, which must be a directory; watches read it every `poll`
    /// (10 ms to an hour).
    ///
    /// # Errors
    ///
    /// [`SpecStoreError::InvalidSetting`] for a poll period out of range;
    /// [`SpecStoreError::Io`] when `dir` is not a directory that can be read.
    pub fn open(dir: impl Into<PathBuf>, poll: Duration) -> Result<Self, SpecStoreError> {
        if !(MIN_POLL..=MAX_POLL).contains(&poll) {
            return Err(SpecStoreError::InvalidSetting { field: "poll", expected: "10 ms to an hour" });
        }
        let dir = dir.into();
        let io = |error| SpecStoreError::Io { path: dir.clone(), error };
        let metadata = std::fs::metadata(&dir).map_err(io)?;
        if !metadata.is_dir() {
            return Err(io(std::io::Error::new(ErrorKind::NotADirectory, "not a directory")));
        }
        std::fs::read_dir(&dir).map_err(io)?;
        let inner = Inner { dir, poll, reloads: watch::Sender::new(0), temporaries: AtomicU64::new(0) };
        Ok(Self { inner: Arc::new(inner) })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// The file of `job`'s spec.
    ///
    /// # Errors
    ///
    /// [`SpecStoreError::Invalid`] (field `job`) for a name that is not a spec file's.
    pub fn path_of(&self, job: &str) -> Result<PathBuf, SpecStoreError> {
        file_job(job).map_err(|error| SpecStoreError::Invalid { job: job.to_owned(), error })?;
        Ok(self.inner.dir.join(format!("{job}{SUFFIX}")))
    }

    /// Writes `config` to its job's file, once it validates (see [`super::SpecStore::put`]),
    /// atomically: a temporary file written and synced, then renamed over the file.
    ///
    /// # Errors
    ///
    /// As [`super::SpecStore::put`]; [`SpecStoreError::Io`] when the file cannot be
    /// written (the old one stays).
    pub async fn put(&self, config: &JobConfig) -> Result<(), SpecStoreError> {
        let path = self.path_of(&config.job)?;
        let document = checked_document(config).await?;
        let this = self.clone();
        let job = config.job.clone();
        blocking(move || {
            if !path.exists() && count_spec_files(&this.inner.dir)? >= MAX_JOBS {
                return Err(SpecStoreError::too_many_jobs(&job));
            }
            this.write_atomically(&path, document.as_bytes())
        })
        .await?;
        self.reload();
        Ok(())
    }

    /// `job`'s spec (`None`: no file).
    ///
    /// # Errors
    ///
    /// As [`super::SpecStore::get`]; [`SpecStoreError::Io`] when the file cannot be read.
    pub async fn get(&self, job: &str) -> Result<Option<JobConfig>, SpecStoreError> {
        let path = self.path_of(job)?;
        let job = job.to_owned();
        blocking(move || match read_spec(&path) {
            Ok(None) => Ok(None),
            Ok(Some(SpecBytes { bytes: Err(error), .. })) => {
                Err(SpecStoreError::Rejected(RejectedSpec { job, error }))
            }
            Ok(Some(SpecBytes { bytes: Ok(bytes), .. })) => document::from_json_for(&job, &bytes)
                .map(Some)
                .map_err(|error| SpecStoreError::Rejected(RejectedSpec { job, error })),
            Err(error) => Err(SpecStoreError::Io { path, error }),
        })
        .await
    }

    /// Every spec file's spec, the refused ones apart.
    ///
    /// # Errors
    ///
    /// [`SpecStoreError::TooManySpecs`] for more than [`MAX_JOBS`] spec files;
    /// [`SpecStoreError::Io`] when the directory or a file cannot be read.
    pub async fn list(&self) -> Result<SpecListing, SpecStoreError> {
        let dir = self.inner.dir.clone();
        blocking(move || {
            let mut listing = SpecListing::default();
            for name in spec_files(&dir)? {
                let path = dir.join(&name.file);
                let read = match read_spec(&path) {
                    Ok(Some(read)) => read,
                    Ok(None) => continue, // Removed since listed.
                    Err(error) => return Err(SpecStoreError::Io { path, error }),
                };
                let parsed = read.bytes.and_then(|bytes| match &name.job {
                    Ok(job) => document::from_json_for(job, &bytes),
                    Err(error) => Err(DocumentError::Invalid(error.clone())),
                });
                match parsed {
                    Ok(config) => listing.specs.push(config),
                    Err(error) => listing.rejected.push(RejectedSpec { job: name.lossy_job(), error }),
                }
            }
            Ok(listing)
        })
        .await
    }

    /// Removes `job`'s file; whether there was one.
    ///
    /// # Errors
    ///
    /// As [`super::SpecStore::delete`]; [`SpecStoreError::Io`] when it cannot be removed.
    pub async fn delete(&self, job: &str) -> Result<bool, SpecStoreError> {
        let path = self.path_of(job)?;
        let dir = self.inner.dir.clone();
        let removed = blocking(move || match std::fs::remove_file(&path) {
            Ok(()) => {
                sync_dir(&dir);
                Ok(true)
            }
            Err(error) if error.kind() == ErrorKind::NotFound => Ok(false),
            Err(error) => Err(SpecStoreError::Io { path, error }),
        })
        .await?;
        self.reload();
        Ok(removed)
    }

    /// Has every watch of this directory's handles (this one and its clones) read it now
    /// (SIGHUP's job, after an operator's edit).
    pub fn reload(&self) {
        self.inner.reloads.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Follows the directory: see the type's documentation and [`SpecWatch`].
    pub fn watch(&self) -> SpecWatch {
        // Subscribed with the current count seen: only a later reload wakes it.
        let reloads = self.inner.reloads.subscribe();
        let period = self.inner.poll;
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let state = Watch {
            scan: Some(Scan {
                dir: self.inner.dir.clone(),
                in_force: InForce::default(),
                first: true,
                ready: VecDeque::new(),
            }),
            tick,
            reloads: Some(reloads),
        };
        SpecWatch::new(futures_util::stream::unfold(state, |mut state| async move {
            loop {
                let scan = state.scan.as_mut()?;
                if let Some(item) = scan.ready.pop_front() {
                    return Some((item, state));
                }
                if !scan.first {
                    state.wait().await;
                }
                let mut scan = state.scan.take()?;
                // Reading the files blocks: off the runtime's threads. Should the read
                // panic (no such case is known), the state is lost and the watch ends.
                let scanned = tokio::task::spawn_blocking(move || {
                    scan.read();
                    scan
                })
                .await
                .ok()?;
                state.scan = Some(scanned);
            }
        }))
    }

    fn write_atomically(&self, path: &Path, bytes: &[u8]) -> Result<(), SpecStoreError> {
        let dir = &self.inner.dir;
        let n = self.inner.temporaries.fetch_add(1, Ordering::Relaxed);
        let temporary = dir.join(format!(".spec-{}-{n}.tmp", std::process::id()));
        let written = File::options()
            .write(true)
            .create_new(true)
            .open(&temporary)
            .and_then(|mut file| file.write_all(bytes).and_then(|()| file.sync_all()));
        if let Err(error) = written {
            let _ = std::fs::remove_file(&temporary);
            return Err(SpecStoreError::Io { path: temporary, error });
        }
        if let Err(error) = std::fs::rename(&temporary, path) {
            let _ = std::fs::remove_file(&temporary);
            return Err(SpecStoreError::Io { path: path.to_owned(), error });
        }
        sync_dir(dir);
        Ok(())
    }
}

/// A watch between reads: the scan's state, and what wakes it.
struct Watch {
    /// `None` only while a read runs off the runtime's threads.
    scan: Option<Scan>,
    tick: tokio::time::Interval,
    /// `None` once every handle of the directory is dropped (no reload can come).
    reloads: Option<watch::Receiver<u64>>,
}

impl Watch {
    /// Until the next poll or reload.
    async fn wait(&mut self) {
        let handles_gone = {
            let (tick, reloads) = (&mut self.tick, &mut self.reloads);
            let reloaded = async move {
                match reloads.as_mut() {
                    Some(reloads) => reloads.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = tick.tick() => false,
                still = reloaded => !still,
            }
        };
        if handles_gone {
            // No reload can come: the period goes on alone.
            self.reloads = None;
        }
    }
}

/// What a watch knows of the directory.
struct Scan {
    dir: PathBuf,
    in_force: InForce,
    /// No read made yet: the next one's items start with `Current`.
    first: bool,
    ready: VecDeque<SpecItem>,
}

impl Scan {
    /// Reads every spec file, queueing what changed.
    fn read(&mut self) {
        let names = match spec_files(&self.dir) {
            Ok(names) => names,
            Err(error) => {
                // The specs in force stay (a first read's `Current` waits for a good one).
                self.ready.push_back(Err(error));
                return;
            }
        };
        let mut listing = self.in_force.listing();
        for name in names {
            let job = name.lossy_job();
            let path = self.dir.join(&name.file);
            let read = match read_spec(&path) {
                Ok(Some(read)) => read,
                Ok(None) => continue, // Removed since listed: gone.
                Err(error) => {
                    listing.unreadable(&job, SpecStoreError::Io { path, error });
                    continue;
                }
            };
            match (&name.job, read.bytes) {
                (Err(error), _) => {
                    listing.offer_refused(&job, read.fingerprint, DocumentError::Invalid(error.clone()))
                }
                (Ok(_), Err(error)) => listing.offer_refused(&job, read.fingerprint, error),
                (Ok(job), Ok(bytes)) => listing.offer(job, read.fingerprint, &bytes),
            }
        }
        let items = listing.finish(std::mem::take(&mut self.first));
        self.ready.extend(items);
    }
}

/// A spec file found in the directory.
struct SpecFile {
    /// Its file name.
    file: std::ffi::OsString,
    /// The job it names, or why it names none.
    job: Result<String, JobConfigError>,
}

impl SpecFile {
    /// The job it names, lossily when not UTF-8.
    fn lossy_job(&self) -> String {
        match &self.job {
            Ok(job) => job.clone(),
            Err(_) => {
                let name = self.file.to_string_lossy();
                name.strip_suffix(SUFFIX).unwrap_or(&name).to_owned()
            }
        }
    }
}

/// The spec files of `dir`, by name; more than [`MAX_JOBS`] is refused.
fn spec_files(dir: &Path) -> Result<Vec<SpecFile>, SpecStoreError> {
    let io = |error| SpecStoreError::Io { path: dir.to_owned(), error };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let entry = entry.map_err(io)?;
        let file = entry.file_name();
        let bytes = file.as_encoded_bytes();
        if bytes.starts_with(b".") || !bytes.ends_with(SUFFIX.as_bytes()) {
            continue;
        }
        // Through symlinks: a Kubernetes volume's files are links into `..data`.
        match std::fs::metadata(entry.path()) {
            Ok(metadata) if metadata.is_file() => {}
            _ => continue,
        }
        if files.len() == MAX_JOBS {
            return Err(SpecStoreError::TooManySpecs { found: MAX_JOBS + 1, limit: MAX_JOBS });
        }
        let job = match file.to_str() {
            Some(name) => {
                let job = &name[..name.len() - SUFFIX.len()];
                file_job(job).map(|()| job.to_owned())
            }
            None => Err(JobConfigError::new("job", "UTF-8 (the file name is not)")),
        };
        files.push(SpecFile { file, job });
    }
    files.sort_by(|a, b| a.file.cmp(&b.file));
    Ok(files)
}

/// How many spec files `dir` holds (up to [`MAX_JOBS`]).
fn count_spec_files(dir: &Path) -> Result<usize, SpecStoreError> {
    match spec_files(dir) {
        Ok(files) => Ok(files.len()),
        Err(SpecStoreError::TooManySpecs { .. }) => Ok(MAX_JOBS),
        Err(error) => Err(error),
    }
}

/// Whether `job` can be a spec file's name (with [`SUFFIX`]).
fn file_job(job: &str) -> Result<(), JobConfigError> {
    let ok = !job.is_empty()
        && job.len() <= MAX_FILE_JOB_LEN
        && !job.starts_with('.')
        && !job.contains(['/', '\0']);
    if ok {
        Ok(())
    } else {
        Err(JobConfigError::new(
            "job",
            "a file name in a spec directory: 1 to 250 bytes, no '/' or NUL, not starting with '.'",
        ))
    }
}

/// A spec file read: its bytes (or why they are not read), and their fingerprint.
struct SpecBytes {
    bytes: Result<Vec<u8>, DocumentError>,
    fingerprint: u64,
}

/// Reads the spec file at `path`, at most [`MAX_SPEC_BYTES`] of it (`None`: no such
/// file).
fn read_spec(path: &Path) -> std::io::Result<Option<SpecBytes>> {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(error),
    };
    let mut bytes = Vec::new();
    file.take(MAX_SPEC_BYTES as u64 + 1).read_to_end(&mut bytes)?;
    let mut hasher = std::hash::DefaultHasher::new();
    bytes.hash(&mut hasher);
    let fingerprint = hasher.finish();
    if bytes.len() > MAX_SPEC_BYTES {
        return Ok(Some(SpecBytes {
            bytes: Err(DocumentError::TooLarge { bytes: bytes.len() }),
            fingerprint,
        }));
    }
    Ok(Some(SpecBytes { bytes: Ok(bytes), fingerprint }))
}

/// Makes a rename or removal in `dir` durable, where the file system allows (best
/// effort: the operation itself succeeded).
fn sync_dir(dir: &Path) {
    if let Ok(dir) = File::open(dir) {
        let _ = dir.sync_all();
    }
}

/// `work` off the runtime's threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, SpecStoreError> + Send + 'static,
) -> Result<T, SpecStoreError> {
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => result,
        // The work panicked (no such case is known) or the runtime is shutting down.
        Err(error) => Err(SpecStoreError::unavailable(error)),
    }
}
