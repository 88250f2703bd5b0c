//! [`DnsConfig`]: what to resolve, how often, where, and how to number the tasks.

use std::net::SocketAddr;
use std::time::Duration;

use super::DnsCounters;

/// How a DNS answer becomes task indices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IndexRule {
    /// StatefulSet ordinals (the default). The name's SRV records are resolved (a
    /// Kubernetes headless service publishes one per ready pod, its target
    /// `web-3.web.ns.svc.cluster.local`); a target's index is the ordinal of its first
    /// label ([`ordinal_of`](crate::identity::ordinal_of)) and its address the target's
    /// own A (else AAAA) record. The job size is the largest ordinal plus one; a missing
    /// ordinal (a pod not ready, or gone from the middle) is a hole the balancer skips,
    /// and no other task's index moves.
    #[default]
    Ordinals,
    /// Plain A (else AAAA) records of the name, indexed in address order (numeric, IPv4
    /// first). For services whose pods have no ordinals (a Deployment).
    ///
    /// **Churn**: indices follow the addresses, not the pods. An address added or
    /// removed anywhere but at the end shifts every later index by one, so nearly every
    /// frontend's subset moves (the minimal-movement guarantee of decimal Rocksteadier
    /// and Rocksteadier is per index, and here the indices themselves move); pod
    /// addresses are allocated at random, so that is the usual case, not the worst one.
    /// Prefer [`IndexRule::Ordinals`].
    SortedAddresses,
}

/// Where and how a DNS source resolves, built in steps:
///
/// ```
/// # use std::time::Duration;
/// use steady_discovery::dns::{DnsConfig, IndexRule};
///
/// let config = DnsConfig::new("web.prod.svc.cluster.local.", 50051)
///     .port_name("grpc") // _grpc._tcp.web.prod.svc.cluster.local., port from SRV
///     .period(Duration::from_secs(5));
/// let by_address = DnsConfig::new("api.prod.svc.cluster.local.", 8080)
///     .index_rule(IndexRule::SortedAddresses);
/// # let _ = (config, by_address);
/// ```
///
/// A name with a trailing dot is absolute and costs one query per round; without it the
/// resolver's search list applies first (in a Kubernetes pod, `ndots:5` tries every
/// search domain before the name itself).
#[derive(Debug, Clone)]
pub struct DnsConfig {
    pub(super) name: String,
    pub(super) port: u16,
    pub(super) port_name: Option<String>,
    pub(super) rule: IndexRule,
    pub(super) period: Duration,
    pub(super) nameservers: Vec<SocketAddr>,
    pub(super) timeout: Duration,
    pub(super) attempts: usize,
    pub(super) max_tasks: usize,
    pub(super) counters: DnsCounters,
}

impl DnsConfig {
    /// The default re-resolve period.
    pub const DEFAULT_PERIOD: Duration = Duration::from_secs(5);
    /// The default cap on records per answer and on ordinals.
    pub const DEFAULT_MAX_TASKS: usize = 4096;

    /// Resolve `name` by [`IndexRule::Ordinals`] every 5 s through the system's
    /// nameservers; tasks listen on `port`.
    pub fn new(name: impl Into<String>, port: u16) -> Self {
        Self {
            name: name.into(),
            port,
            port_name: None,
            rule: IndexRule::default(),
            period: Self::DEFAULT_PERIOD,
            nameservers: Vec::new(),
            timeout: Duration::from_secs(2),
            attempts: 2,
            max_tasks: Self::DEFAULT_MAX_TASKS,
            counters: DnsCounters::default(),
        }
    }

    /// How answers become indices.
    pub fn index_rule(mut self, rule: IndexRule) -> Self {
        self.rule = rule;
        self
    }

    /// By ordinals, query the SRV records of the named port, `_<port_name>._tcp.<name>`,
    /// and take each task's port from its SRV record instead of the configured port.
    /// Without it the name's own SRV records are queried (Kubernetes answers one per pod
    /// and port) and the configured port is used. No effect on sorted addresses.
    pub fn port_name(mut self, port_name: impl Into<String>) -> Self {
        self.port_name = Some(port_name.into());
        self
    }

    /// How often to re-resolve (default 5 s; must not be zero). A change reaches the view
    /// within one period plus the time a resolution takes.
    pub fn period(mut self, period: Duration) -> Self {
        self.period = period;
        self
    }

    /// Ask these nameservers (UDP, and TCP for truncated answers) instead of the
    /// system's `/etc/resolv.conf`.
    pub fn nameservers(mut self, nameservers: impl IntoIterator<Item = SocketAddr>) -> Self {
        self.nameservers = nameservers.into_iter().collect();
        self
    }

    /// How long one query may take (default 2 s) and how many times it is tried
    /// (default 2). A round against a dead nameserver fails after about
    /// `timeout × attempts`.
    pub fn timeout(mut self, timeout: Duration, attempts: usize) -> Self {
        self.timeout = timeout;
        self.attempts = attempts;
        self
    }

    /// The cap on records taken from one answer and on ordinals (default 4096; must not
    /// be zero), so that an odd answer cannot make a huge job or a round of thousands of
    /// queries: records past it (by ordinals, the highest ordinals and those with none;
    /// by addresses, the highest addresses) and ordinals at or above it are left out and
    /// counted.
    pub fn max_tasks(mut self, max_tasks: usize) -> Self {
        self.max_tasks = max_tasks;
        self
    }

    /// Count into `counters` (by default into a handle nobody reads).
    pub fn counters(mut self, counters: DnsCounters) -> Self {
        self.counters = counters;
        self
    }

    /// The name queried: `_<port name>._tcp.<name>` by ordinals with a port name, else
    /// the name.
    pub(super) fn query_name(&self) -> String {
        match (&self.port_name, self.rule) {
            (Some(port_name), IndexRule::Ordinals) => format!("_{port_name}._tcp.{}", self.name),
            _ => self.name.clone(),
        }
    }

    /// Whether task ports come from SRV records.
    pub(super) fn port_from_srv(&self) -> bool {
        self.port_name.is_some() && self.rule == IndexRule::Ordinals
    }
}
