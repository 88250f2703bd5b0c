//! Errors the balancer returns itself (as opposed to errors of the backends).

use std::fmt;
use std::time::Duration;

/// Boxed errors, as tower uses them: the balancer's [`BalanceError`]s and the backends'
/// own errors both come back as this.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why the balancer could not send a request to any backend.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BalanceError {
    /// No subset member was connected and healthy, and none became so within the
    /// configured wait. In tonic this maps to `Unavailable`.
    NoReadyBackends {
        /// How long the request waited for one.
        waited: Duration,
    },
    /// A backend failed while sending the request: the underlying error is the source.
    /// The backend was taken out of rotation.
    BackendFailed {
        /// The backend task's index.
        task: usize,
    },
}

impl fmt::Display for BalanceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoReadyBackends { waited } => {
                write!(f, "no ready backend in the subset after waiting {waited:?}")
            }
            Self::BackendFailed { task } => write!(f, "backend task {task} failed"),
        }
    }
}

impl std::error::Error for BalanceError {}
