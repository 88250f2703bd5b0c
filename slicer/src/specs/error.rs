//! What can go wrong with job specs: [`JobConfigError`] for a field out of range,
//! [`DocumentError`] for a document that is not a spec, [`SpecStoreError`] for the spec
//! stores' operations and their watches.

use std::fmt;
use std::path::PathBuf;

use super::{MAX_JOBS, MAX_SPEC_BYTES};

/// A [`super::JobConfig`] field out of range: the field, named as in the JSON document
/// (`cadence_ms`, `tasks.count`, `spec.replicas`, `spec.tasks[2].capacity`), and what it
/// must be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobConfigError {
    /// The field, as the document names it.
    pub field: String,
    /// What it must be.
    pub expected: String,
}

impl JobConfigError {
    pub(crate) fn new(field: impl Into<String>, expected: impl Into<String>) -> Self {
        Self { field: field.into(), expected: expected.into() }
    }
}

impl fmt::Display for JobConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "job config: {} must be {}", self.field, self.expected)
    }
}

impl std::error::Error for JobConfigError {}

/// Why a document (an etcd value, a file) is not a job spec.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DocumentError {
    /// Larger than [`MAX_SPEC_BYTES`]: not parsed.
    TooLarge {
        /// Its size (at least the limit plus one when read from a file).
        bytes: usize,
    },
    /// Not a JSON object.
    Malformed {
        /// What the JSON parser said.
        reason: String,
    },
    /// No `"version"`, or one this build does not read (it reads 1).
    Version {
        /// The version found, as written (`None`: missing).
        found: Option<String>,
    },
    /// A field of the wrong type, unknown, or missing.
    Field {
        /// The field (for one inside `tasks` or `spec`, the top-level one; the reason
        /// names the inner one).
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Read, but out of range ([`super::JobConfig::validate`]), or naming another job
    /// than its key or file does.
    Invalid(JobConfigError),
}

impl DocumentError {
    /// The field the error is about (`"document"` for the document as a whole).
    pub fn field(&self) -> &str {
        match self {
            Self::TooLarge { .. } | Self::Malformed { .. } => "document",
            Self::Version { .. } => "version",
            Self::Field { field, .. } => field,
            Self::Invalid(error) => &error.field,
        }
    }
}

impl fmt::Display for DocumentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooLarge { bytes } => {
                write!(f, "a document of {bytes} bytes (limit {MAX_SPEC_BYTES}) not parsed")
            }
            Self::Malformed { reason } => write!(f, "not a JSON object: {reason}"),
            Self::Version { found: None } => write!(f, "no \"version\" (this build reads version 1)"),
            Self::Version { found: Some(found) } => {
                write!(f, "version {found} (this build reads version 1)")
            }
            Self::Field { field, reason } => write!(f, "{field}: {reason}"),
            Self::Invalid(error) => error.fmt(f),
        }
    }
}

impl std::error::Error for DocumentError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Invalid(error) => Some(error),
            _ => None,
        }
    }
}

/// A stored spec that is not a valid spec of its job: the job its key or file names
/// (lossily, when that is not valid UTF-8) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RejectedSpec {
    /// The job its key (`<prefix>.specs/<job>`) or file (`<job>.json`) names.
    pub job: String,
    /// Why it was rejected.
    pub error: DocumentError,
}

impl fmt::Display for RejectedSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the stored spec of job {:?} is refused: {}", self.job, self.error)
    }
}

impl std::error::Error for RejectedSpec {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// Why a spec store did nothing, or what a watch skipped.
#[derive(Debug)]
#[non_exhaustive]
pub enum SpecStoreError {
    /// `put` refused the spec (`delete` and `get` the job name): nothing was written,
    /// the stored spec is unchanged.
    Invalid {
        /// The job.
        job: String,
        /// The field and what it must be.
        error: JobConfigError,
    },
    /// A stored spec that does not parse or validate (written by another tool, or by a
    /// newer version): `get` returns it as an error, `list` lists it apart, and a watch
    /// skips it with this item, the job's last good spec staying in force.
    Rejected(RejectedSpec),
    /// A new job past [`MAX_JOBS`]: `put` refused it (nothing written), or a watch
    /// skipped it.
    TooManyJobs {
        /// The job.
        job: String,
        /// The limit.
        limit: usize,
    },
    /// A listing of more than [`MAX_JOBS`] specs, refused as a whole: `list` fails, a
    /// watch keeps the specs in force and tries again.
    TooManySpecs {
        /// How many were found (for a directory, counting stops at the limit plus one).
        found: usize,
        /// The limit.
        limit: usize,
    },
    /// A setting of the store out of range.
    InvalidSetting {
        /// The setting.
        field: &'static str,
        /// What it accepts.
        expected: &'static str,
    },
    /// A directory store's file system refused an operation (the directory missing, a
    /// file unreadable). A watch keeps the specs in force and tries again.
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The error.
        error: std::io::Error,
    },
    /// etcd could not be reached or did not answer in time (a `put` or `delete` may or
    /// may not have happened: read again).
    Unavailable(Box<dyn std::error::Error + Send + Sync>),
    /// Connecting to etcd failed ([`crate::EtcdStore::connect`]'s errors: settings out
    /// of range, etcd unreachable, or access settings that cannot work).
    Store(crate::StoreError),
}

impl fmt::Display for SpecStoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Invalid { job, error } => write!(f, "job {job:?}: spec refused: {error}"),
            Self::Rejected(rejected) => rejected.fmt(f),
            Self::TooManyJobs { job, limit } => {
                write!(f, "job {job:?}: refused, the store holds {limit} jobs (its limit)")
            }
            Self::TooManySpecs { found, limit } => {
                write!(f, "{found} specs found, above the limit of {limit}: the listing is refused")
            }
            Self::InvalidSetting { field, expected } => write!(f, "spec store: {field} must be {expected}"),
            Self::Io { path, error } => write!(f, "spec directory: {}: {error}", path.display()),
            Self::Unavailable(error) => write!(f, "spec store unavailable: {error}"),
            Self::Store(error) => write!(f, "spec store: {error}"),
        }
    }
}

impl std::error::Error for SpecStoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Invalid { error, .. } => Some(error),
            Self::Rejected(rejected) => Some(rejected),
            Self::Io { error, .. } => Some(error),
            Self::Unavailable(error) => Some(&**error),
            Self::Store(error) => Some(error),
            _ => None,
        }
    }
}

impl SpecStoreError {
    /// The job the error is about, if one.
    pub fn job(&self) -> Option<&str> {
        match self {
            Self::Invalid { job, .. } | Self::TooManyJobs { job, .. } => Some(job),
            Self::Rejected(rejected) => Some(&rejected.job),
            _ => None,
        }
    }

    pub(crate) fn unavailable(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self::Unavailable(error.into())
    }

    pub(crate) fn too_many_jobs(job: &str) -> Self {
        Self::TooManyJobs { job: job.to_owned(), limit: MAX_JOBS }
    }
}
