//! [`DnsError`]: why a DNS source could not start.

use std::fmt;

/// Why [`discover`](super::discover) returned no source.
///
/// These arise only before the source runs: once it has published a first view, a
/// failed or empty re-resolution keeps the last view and is counted in
/// [`DnsCounters`](super::DnsCounters) instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DnsError {
    /// The configuration cannot work (a zero period, an invalid name, ...).
    InvalidConfig {
        /// What is wrong.
        reason: String,
    },
    /// No nameserver was given and the system's (`/etc/resolv.conf`) could not be read.
    SystemConfig {
        /// The resolver's message.
        reason: String,
    },
    /// The first resolution failed: timeout, refused connection, server failure.
    Resolve {
        /// The name queried.
        name: String,
        /// The resolver's message.
        reason: String,
    },
    /// The first resolution succeeded but gave no task: no such name, no records, or (by
    /// ordinals) no target with a usable ordinal and address.
    NoTasks {
        /// The name queried.
        name: String,
    },
}

impl fmt::Display for DnsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidConfig { reason } => write!(f, "dns discovery: invalid configuration: {reason}"),
            Self::SystemConfig { reason } => {
                write!(f, "dns discovery: no nameserver given and the system's is unreadable: {reason}")
            }
            Self::Resolve { name, reason } => write!(f, "dns discovery: resolving {name} failed: {reason}"),
            Self::NoTasks { name } => write!(f, "dns discovery: {name} resolved to no usable task"),
        }
    }
}

impl std::error::Error for DnsError {}
