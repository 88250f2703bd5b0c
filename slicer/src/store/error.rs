//! What can go wrong in a store: [`StoreError`] for the operations, [`ValueError`] for a
//! stored value that is not an assignment.

use std::fmt;

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
