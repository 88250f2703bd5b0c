//! [`DnsConfig`]: what to resolve, how often, where, and how to number the tasks.

use std::net::SocketAddr;
use std::time::Duration;

use steady_core::Zone;

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
    /// In zones: each zone and its name, in the configured order (empty: one name).
    pub(super) zones: Vec<(Zone, String)>,
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
            zones: Vec::new(),
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

    /// One name per zone, each resolved by [`IndexRule::Ordinals`] (a StatefulSet and
    /// headless service per zone, say `web-us-east1-b.prod.svc.cluster.local.`); tasks
    /// listen on `port`. The other settings apply to every name.
    ///
    /// # Numbering (a convention)
    ///
    /// With `Z` zones, the pod of ordinal `o` behind the name of the zone at position `p`
    /// in this list (from 0) is task `o × Z + p` of the job, at locality (zone, `o`):
    /// its StatefulSet ordinal is its index within the zone. Indices interleave the
    /// zones, so a zone growing or shrinking renumbers nobody (in it or elsewhere): its
    /// new pods take new indices, and the other zones' indices do not move. The job's
    /// size is the highest index plus one; the zones' sizes are their highest ordinal
    /// plus one. Backends registering in the etcd registry by hand can follow the same
    /// convention (`registry::Registry::register_in_zone`). The list's order is part of
    /// the numbering: every frontend must list the zones in the same order, and adding a
    /// zone (changing `Z`) renumbers every task.
    ///
    /// # Failures
    ///
    /// A round fails, keeping the last view, when any zone's name fails to resolve. A
    /// zone whose name gives no usable task keeps its tasks of the last view (counted as
    /// an empty answer), as a single name does: all of a zone's pods gone at once is
    /// more often a glitch than a zone scaled to zero. The first resolution fails with
    /// [`DnsError::NoTasks`](super::DnsError::NoTasks) only if no zone has a task.
    ///
    /// ```
    /// use steady_discovery::dns::DnsConfig;
    /// use steady_discovery::Zone;
    ///
    /// let config = DnsConfig::zoned(
    ///     [
    ///         (Zone::new("us-east1-b")?, "web-b.prod.svc.cluster.local."), // p = 0
    ///         (Zone::new("us-east1-c")?, "web-c.prod.svc.cluster.local."), // p = 1
    ///     ],
    ///     50051,
    /// );
    /// // web-c-3 is task 3 × 2 + 1 = 7, at us-east1-c/3.
    /// # let _ = config;
    /// # Ok::<(), steady_discovery::ZoneError>(())
    /// ```
    ///
    /// [`discover`](super::discover) refuses an empty list, a zone listed twice, and
    /// [`IndexRule::SortedAddresses`] with zones.
    pub fn zoned(zones: impl IntoIterator<Item = (Zone, impl Into<String>)>, port: u16) -> Self {
        let zones: Vec<(Zone, String)> = zones.into_iter().map(|(zone, name)| (zone, name.into())).collect();
        let mut config = Self::new(String::new(), port);
        config.zones = zones;
        config
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

    /// The names queried, each with its zone: `_<port name>._tcp.<name>` by ordinals
    /// with a port name, else the name; one per zone in zones, else the one name.
    pub(super) fn query_names(&self) -> Vec<(Option<Zone>, String)> {
        let query = |name: &str| match (&self.port_name, self.rule) {
            (Some(port_name), IndexRule::Ordinals) => format!("_{port_name}._tcp.{name}"),
            _ => name.to_owned(),
        };
        if self.zones.is_empty() {
            return vec![(None, query(&self.name))];
        }
        self.zones.iter().map(|(zone, name)| (Some(zone.clone()), query(name))).collect()
    }

    /// Why the zones cannot work, if they cannot.
    pub(super) fn zones_problem(&self) -> Option<String> {
        if self.zones.is_empty() {
            return self.name.is_empty().then(|| "no name to resolve (no zones either)".to_owned());
        }
        if self.rule != IndexRule::Ordinals {
            return Some("zones need IndexRule::Ordinals (a zone's index is its pods' ordinal)".to_owned());
        }
        let mut seen = std::collections::BTreeSet::new();
        self.zones
            .iter()
            .find(|(zone, _)| !seen.insert(zone.clone()))
            .map(|(zone, _)| format!("zone {zone} is listed twice"))
    }

    /// Whether task ports come from SRV records.
    pub(super) fn port_from_srv(&self) -> bool {
        self.port_name.is_some() && self.rule == IndexRule::Ordinals
    }
}
