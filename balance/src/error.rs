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
    /// A keyed request found none of its slice's replicas usable within the affinity
    /// wait, and the policy is [`crate::NoReplicaPolicy::Fail`].
    NoReplica {
        /// The request's slice key.
        key: crate::SliceKey,
        /// The generation of the assignment in force.
        generation: u64,
    },
}

impl fmt::Display for BalanceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoReadyBackends { waited } => {
                write!(f, "no ready backend in the subset after waiting {waited:?}")
            }
            Self::NoReplica { key, generation } => {
                write!(f, "no usable replica for slice key {key} (assignment generation {generation})")
            }
        }
    }
}

impl std::error::Error for BalanceError {}
