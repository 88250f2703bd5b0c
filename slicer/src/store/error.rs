//! What can go wrong in a store: [`StoreError`] for the operations, [`ValueError`] for a
//! stored value that is not an assignment.

use std::fmt;

use steady_slice::guard::{Consistency, RecordError};
use steady_slice::DecodeError;

use super::MAX_ASSIGNMENT_BYTES;
use steady_core::MAX_JOB_NAME_LEN;

/// Why a store operation did nothing. Which operation returns which is documented on
/// [`super::AssignmentStore`]'s methods.
#[derive(Debug)]
#[non_exhaustive]
pub enum StoreError {
    /// A job or candidate name of 0 or more than [`MAX_JOB_NAME_LEN`] bytes.
    InvalidName {
        /// `"job"` or `"candidate"`.
        what: &'static str,
        /// Its length in bytes.
        len: usize,
    },
    /// A write's snapshot is of another job than its leadership.
    WrongJob {
        /// The snapshot's job.
        snapshot: String,
        /// The leadership's job.
        leadership: String,
    },
    /// A write offered a generation that is not above the stored one (generations only
    /// grow: watchers would ignore it).
    NotNewer {
        /// The stored generation (0: none).
        stored: u64,
        /// The generation offered.
        offered: u64,
    },
    /// An assignment whose encoding exceeds [`MAX_ASSIGNMENT_BYTES`].
    TooLarge {
        /// Its encoded size.
        bytes: usize,
    },
    /// The job's assignment changed since the snapshot the write was conditioned on:
    /// another write won. Nothing was written; re-read and retry. (It carries nothing
    /// from the store on purpose: what to retry with comes from a fresh read.)
    Conflict,
    /// The leadership's term is over (lost, resigned, or never of this store or job):
    /// this writer was deposed. Nothing was written; stop writing and campaign again.
    NotLeader,
    /// A [`super::MemoryStore`] holds the most jobs it may.
    TooManyJobs {
        /// Its limit.
        limit: usize,
    },
    /// A configuration value out of range (an `EtcdConfig`'s), named with the accepted
    /// range.
    InvalidConfig {
        /// The setting.
        field: &'static str,
        /// What it accepts.
        reason: &'static str,
    },
    /// The job's stored consistency mode is not the writer's: an eventual write
    /// ([`super::AssignmentStore::write`]) to a job whose guard exists (an exclusive job).
    /// Nothing was written. Fix the writer's configuration: a job leaves exclusive mode
    /// only by an operator's deleting its guard once its Slicelets are stopped.
    ConsistencyMismatch {
        /// The job.
        job: String,
        /// The mode stored for it.
        stored: Consistency,
    },
    /// The store has no exclusive mode (it names what is missing): a
    /// [`super::MemoryStore`] has no leases. Use an `EtcdStore`.
    Unsupported(&'static str),
    /// An assignment offered to an exclusive job gives a slice to more than one task (a
    /// replica and another replica, or a warming task): exclusive mode allows one. Checked
    /// before anything is sent.
    NotExclusive {
        /// The slice's index in the assignment.
        slice: usize,
        /// The tasks it names, replicas and warming ones.
        tasks: usize,
    },
    /// A recall of an exclusive job is under way and did not complete in time: some
    /// Slicelet still holds the assignment recalled (a live one converts its hold within a
    /// round trip; a dead, paused or cut-off one's hold goes when its lease expires).
    /// Nothing was written; settle again later ([`super::AssignmentStore::settle`]).
    RecallPending {
        /// The job.
        job: String,
        /// The generation recalled (0: none).
        from: u64,
        /// The generation it is replaced by (already stored).
        to: u64,
    },
    /// The job's guard holds a value that is not a guard (written around the store, or by
    /// a newer version): nothing can be known about what its Slicelets hold, so nothing is
    /// written until an operator repairs it.
    InvalidGuard {
        /// The job.
        job: String,
        /// What is wrong with the value.
        error: RecordError,
    },
    /// The store could not be reached or did not answer in time. A write may or may not
    /// have happened: re-read before writing again.
    Unavailable(Box<dyn std::error::Error + Send + Sync>),
    /// etcd was reached but its connection settings cannot work (TLS, client
    /// certificate, user and password, or the user's access to the key prefix): fix the
    /// settings; retrying will not help.
    #[cfg(feature = "etcd")]
    Connect(steady_etcd::ConnectError),
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidName { what, len } => {
                write!(f, "{what} name of {len} bytes: it must have 1 to {MAX_JOB_NAME_LEN}")
            }
            Self::WrongJob { snapshot, leadership } => {
                write!(f, "a snapshot of job {snapshot:?} written under the leadership of job {leadership:?}")
            }
            Self::NotNewer { stored, offered } => {
                write!(f, "generation {offered} is not newer than the stored generation {stored}")
            }
            Self::TooLarge { bytes } => {
                write!(f, "encoded assignment of {bytes} bytes (limit {MAX_ASSIGNMENT_BYTES})")
            }
            Self::Conflict => write!(f, "the assignment changed since it was read: re-read and retry"),
            Self::NotLeader => write!(f, "not the job's leader: this term is over"),
            Self::TooManyJobs { limit } => write!(f, "the store holds {limit} jobs (its limit)"),
            Self::InvalidConfig { field, reason } => write!(f, "invalid {field}: {reason}"),
            Self::ConsistencyMismatch { job, stored } => {
                write!(f, "job {job:?} is {stored} in the store: refused a write of another mode")
            }
            Self::Unsupported(what) => write!(f, "not supported by this store: {what}"),
            Self::NotExclusive { slice, tasks } => {
                write!(f, "slice {slice} names {tasks} tasks: exclusive mode allows one per slice")
            }
            Self::RecallPending { job, from, to } => write!(
                f,
                "job {job:?}: the recall of generation {from} for {to} is still pending (a Slicelet holds it)"
            ),
            Self::InvalidGuard { job, error } => {
                write!(f, "job {job:?}: the stored guard is invalid: {error}")
            }
            Self::Unavailable(e) => write!(f, "store unavailable: {e}"),
            #[cfg(feature = "etcd")]
            Self::Connect(e) => write!(f, "store: {e}"),
        }
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Unavailable(e) => Some(&**e),
            Self::InvalidGuard { error, .. } => Some(error),
            #[cfg(feature = "etcd")]
            Self::Connect(e) => Some(e),
            _ => None,
        }
    }
}

impl StoreError {
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    pub(crate) fn unavailable(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self::Unavailable(e.into())
    }
}

/// Why a stored value is not an assignment (written around the store, or by a newer
/// version of the format).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ValueError {
    /// Larger than [`MAX_ASSIGNMENT_BYTES`]: not decoded.
    TooLarge {
        /// Its size.
        bytes: usize,
    },
    /// Not a valid assignment in steady-slice's binary format.
    Decode(DecodeError),
}

impl fmt::Display for ValueError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooLarge { bytes } => {
                write!(f, "stored value of {bytes} bytes (limit {MAX_ASSIGNMENT_BYTES}) not decoded")
            }
            Self::Decode(e) => write!(f, "stored value: {e}"),
        }
    }
}

impl std::error::Error for ValueError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Decode(e) => Some(e),
            Self::TooLarge { .. } => None,
        }
    }
}
