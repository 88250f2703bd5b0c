//! A fleet of `steady-slicer` instances on one etcd cluster: who is alive, and the
//! operator's requests to the fleet. What the instances do with it (each job's Assigner
//! on the instance [`crate::spread::Spread`] names) is the program's; this module keeps
//! the keys.
//!
//! * [`EtcdFleet::join`]: an instance's [`Membership`], a key on a lease of its own,
//!   kept alive while the instance runs and put back if the lease ever lapses (etcd
//!   unreachable past its TTL); gone within the TTL of the instance's death, at once on
//!   [`Membership::leave`].
//! * [`EtcdFleet::instances`] and [`EtcdFleet::watch_instances`]: the live instances, by
//!   name, and the set as it changes.
//! * [`EtcdFleet::request_run`] and [`EtcdFleet::watch_run_requests`]: an operator asks
//!   for a run of a job now (`steadyctl run JOB`); the instance that leads the job runs it.
//!
//! # Keys and values (a contract)
//!
//! Under the store's key prefix `P` (`/steady/jobs/` by default), in the `.fleet` segment
//! no job may be named for ([`crate::specs::FLEET_SEGMENT`]):
//!
//! * `P .fleet/instances/N`: instance `N` (a candidate name, 1 to 256 bytes), attached to
//!   its lease, the ASCII record `v1 ADDRESS PAGES`: the address its gRPC services
//!   (Watch, load reports) are reached at, and its status pages' (`-` for none). At most
//!   [`MAX_INSTANCES`] are read.
//! * `P .fleet/runs/J`: the last run requested of job `J`, any value, on a lease of its own
//!   that lapses after [`RUN_REQUEST_TTL`] (the key goes then; a deletion is no request);
//!   each put (a new `mod_revision`) is one request.

#[cfg(feature = "etcd")]
mod etcd;
#[cfg(feature = "etcd")]
mod prefix;

use std::fmt;

#[cfg(feature = "etcd")]
pub use etcd::{EtcdFleet, Membership, RunRequests, RUN_REQUEST_TTL};

/// The most instances a fleet's readers take: more are ignored, with a warning.
pub const MAX_INSTANCES: usize = 1024;

/// The longest address in an instance's record, in bytes.
const MAX_ADDRESS_LEN: usize = 512;

/// One live instance of the fleet, as its key says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    /// Where its gRPC services are reached (`host:port`, or a URL).
    pub address: String,
    /// Where its status pages are, if it serves them.
    pub pages: Option<String>,
}

impl Instance {
    /// The record its key holds: `v1 ADDRESS PAGES` (`-` for no pages).
    pub fn encode(&self) -> String {
        format!("v1 {} {}", self.address, self.pages.as_deref().unwrap_or("-"))
    }

    /// Reads a record written by [`Instance::encode`].
    ///
    /// # Errors
    ///
    /// [`FleetError::Malformed`] for anything else.
    pub fn decode(bytes: &[u8]) -> Result<Self, FleetError> {
        let malformed = || FleetError::Malformed {
            record: String::from_utf8_lossy(&bytes[..bytes.len().min(64)]).into_owned(),
        };
        let text = std::str::from_utf8(bytes).map_err(|_| malformed())?;
        let mut words = text.split(' ');
        let (Some("v1"), Some(address), Some(pages), None) =
            (words.next(), words.next(), words.next(), words.next())
        else {
            return Err(malformed());
        };
        if address.is_empty()
            || address.len() > MAX_ADDRESS_LEN
            || pages.is_empty()
            || pages.len() > MAX_ADDRESS_LEN
        {
            return Err(malformed());
        }
        Ok(Self { address: address.to_owned(), pages: (pages != "-").then(|| pages.to_owned()) })
    }

    /// Checks what [`Instance::decode`] would refuse of this one: addresses of 1 to 512
    /// bytes, without spaces.
    fn check(&self) -> Result<(), FleetError> {
        let bad = |a: &str| {
            a.is_empty() || a.len() > MAX_ADDRESS_LEN || a.contains(char::is_whitespace) || a == "-"
        };
        if bad(&self.address) || self.pages.as_deref().is_some_and(bad) {
            return Err(FleetError::Malformed { record: self.encode() });
        }
        Ok(())
    }
}

/// Why a fleet operation failed.
#[derive(Debug)]
pub enum FleetError {
    /// A job name of 0 or more than 256 bytes, or such an instance name or one with a
    /// `/`.
    InvalidName {
        /// What the name is of: `"instance"` or `"job"`.
        what: &'static str,
        /// Its length.
        len: usize,
    },
    /// Another live instance has this name: two instances of one fleet must have two.
    NameTaken {
        /// The name.
        name: String,
        /// The other instance's record.
        by: String,
    },
    /// A record that is not `v1 ADDRESS PAGES`.
    Malformed {
        /// The record's start.
        record: String,
    },
    /// etcd could not be reached or refused the request.
    Unavailable(Box<dyn std::error::Error + Send + Sync>),
}

impl fmt::Display for FleetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidName { what, len } => {
                write!(f, "a {what} name has 1 to 256 bytes (and no / in an instance's), not {len}")
            }
            Self::NameTaken { name, by } => {
                write!(
                    f,
                    "instance name {name:?} is taken by a live instance ({by}): give each instance its own"
                )
            }
            Self::Malformed { record } => write!(f, "not an instance record (v1 ADDRESS PAGES): {record:?}"),
            Self::Unavailable(e) => write!(f, "fleet: etcd unavailable: {e}"),
        }
    }
}

impl std::error::Error for FleetError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Unavailable(e) => Some(&**e),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_and_its_form_is_frozen() {
        let with = Instance { address: "10.0.0.5:50070".into(), pages: Some("10.0.0.5:9464".into()) };
        assert_eq!(with.encode(), "v1 10.0.0.5:50070 10.0.0.5:9464");
        assert_eq!(Instance::decode(with.encode().as_bytes()).unwrap(), with);
        let without = Instance { address: "https://slicer-2:50070".into(), pages: None };
        assert_eq!(without.encode(), "v1 https://slicer-2:50070 -");
        assert_eq!(Instance::decode(b"v1 https://slicer-2:50070 -").unwrap(), without);
    }

    #[test]
    fn anything_else_is_malformed() {
        for bad in [&b""[..], b"v1", b"v1 a", b"v2 a -", b"v1 a - extra", b"v1  -", b"\xff\xfe"] {
            assert!(matches!(Instance::decode(bad), Err(FleetError::Malformed { .. })), "{bad:?}");
        }
        assert!(Instance { address: "a b".into(), pages: None }.check().is_err());
        assert!(Instance { address: "a".into(), pages: Some(String::new()) }.check().is_err());
        assert!(Instance { address: "a".into(), pages: Some("p".into()) }.check().is_ok());
    }
}
