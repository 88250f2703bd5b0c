//! One resolution of the configured name through hickory's resolver.

use std::net::{IpAddr, SocketAddr};

use futures_util::stream::{self, StreamExt};
use hickory_resolver::config::{NameServerConfig, ResolverConfig};
use hickory_resolver::name_server::TokioConnectionProvider;
use hickory_resolver::proto::xfer::Protocol;
use hickory_resolver::{Name, ResolveError, TokioResolver};
use steady_core::{JobView, Zone};

use super::view::{self, Tally, Target};
use super::{DnsConfig, DnsError, IndexRule};
use crate::identity::ordinal_of;

/// How many target address lookups one resolution runs at once.
const TARGET_LOOKUPS_IN_FLIGHT: usize = 16;

/// What one resolution found.
#[derive(Debug)]
pub(super) struct Resolution {
    /// The view (size 0 when the answer had no usable task). In zones, the zones'
    /// views merged by the zoned numbering.
    pub(super) view: JobView<String>,
    /// In zones, the positions of the zones whose answer had no usable task.
    pub(super) empty_zones: Vec<usize>,
    /// What the index rule left out.
    pub(super) tally: Tally,
    /// Whether the answer was cut at the cap.
    pub(super) capped: bool,
}

/// The resolver and what to ask it.
#[derive(Debug)]
pub(super) struct Lookup {
    resolver: TokioResolver,
    /// The names asked, each with its zone (one name without zones).
    queries: Vec<(Option<Zone>, Name)>,
    /// The names, for logs and errors.
    names: String,
    rule: IndexRule,
    port: u16,
    port_from_srv: bool,
    max_tasks: usize,
}

impl Lookup {
    /// A resolver for `config`, with its cache off: every round asks the nameserver, so
    /// a change is seen within one period whatever the records' TTL.
    pub(super) fn new(config: &DnsConfig) -> Result<Self, DnsError> {
        if let Some(reason) = config.zones_problem() {
            return Err(DnsError::InvalidConfig { reason });
        }
        let queries = config
            .query_names()
            .into_iter()
            .map(|(zone, name)| {
                Name::from_utf8(&name)
                    .map(|query| (zone, query))
                    .map_err(|e| DnsError::InvalidConfig { reason: format!("name {name:?}: {e}") })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let names = queries.iter().map(|(_, q)| q.to_utf8()).collect::<Vec<_>>().join(", ");
        let mut builder = if config.nameservers.is_empty() {
            TokioResolver::builder_tokio().map_err(|e| DnsError::SystemConfig { reason: e.to_string() })?
        } else {
            let mut servers = ResolverConfig::new();
            for &address in &config.nameservers {
                servers.add_name_server(NameServerConfig::new(address, Protocol::Udp));
                servers.add_name_server(NameServerConfig::new(address, Protocol::Tcp));
            }
            TokioResolver::builder_with_config(servers, TokioConnectionProvider::default())
        };
        let options = builder.options_mut();
        options.timeout = config.timeout;
        options.attempts = config.attempts;
        options.cache_size = 0;
        // EDNS lets a large answer (an SRV record per pod) come in one UDP datagram, and
        // one too large for that comes back truncated and is asked again over TCP.
        // Without it the resolver reads 512 bytes at most, and a server that answers
        // larger anyway (hickory-server does) is dropped as malformed: a timeout.
        options.edns0 = true;
        Ok(Self {
            resolver: builder.build(),
            queries,
            names,
            rule: config.rule,
            port: config.port,
            port_from_srv: config.port_from_srv(),
            max_tasks: config.max_tasks,
        })
    }

    /// How many zones the names are for (0 without zones).
    pub(super) fn zone_count(&self) -> usize {
        self.queries.iter().filter(|(zone, _)| zone.is_some()).count()
    }

    /// The names asked, for logs and errors (comma-separated in zones).
    pub(super) fn names(&self) -> &str {
        &self.names
    }

    /// Resolves once. "No such name" and "no records" are an empty view, not an error.
    ///
    /// # Errors
    ///
    /// The resolver's error when the name, or a target's address, could not be resolved
    /// for any other reason (timeout, refused, server failure): one target's failure
    /// fails the round, so that a flaky query cannot punch a hole in the job.
    pub(super) async fn resolve(&self) -> Result<Resolution, ResolveError> {
        // The cache is off, but clearing it costs nothing and keeps the contract if a
        // future default turns it on.
        self.resolver.clear_cache();
        let [(None, query)] = &self.queries[..] else { return self.by_zone().await };
        match self.rule {
            IndexRule::Ordinals => self.by_ordinal(query).await,
            IndexRule::SortedAddresses => self.by_address(query).await,
        }
    }

    /// Each zone's name by ordinals, one after the other; the views merged by the zoned
    /// numbering. Any zone's failure fails the round.
    async fn by_zone(&self) -> Result<Resolution, ResolveError> {
        let mut parts = Vec::with_capacity(self.queries.len());
        let (mut tally, mut capped, mut empty_zones) = (Tally::default(), false, Vec::new());
        let zoned = self.queries.iter().filter_map(|(zone, query)| Some((zone.clone()?, query)));
        for (position, (zone, query)) in zoned.enumerate() {
            let resolution = self.by_ordinal(query).await?;
            tally.duplicate_ordinals += resolution.tally.duplicate_ordinals;
            tally.skipped += resolution.tally.skipped;
            capped |= resolution.capped;
            if resolution.view.size == 0 {
                empty_zones.push(position);
            }
            parts.push((zone, resolution.view));
        }
        Ok(Resolution { view: view::zoned(parts), empty_zones, tally, capped })
    }

    async fn by_ordinal(&self, query: &Name) -> Result<Resolution, ResolveError> {
        let mut records: Vec<(Name, String, u16)> = match self.resolver.srv_lookup(query.clone()).await {
            Ok(srv) => srv
                .iter()
                .map(|r| (r.target().clone(), r.target().to_lowercase().to_utf8(), r.port()))
                .collect(),
            Err(e) if e.is_no_records_found() => Vec::new(),
            Err(e) => return Err(e),
        };
        // Lowest ordinals first (no ordinal last), then by name: an oversized answer is
        // cut before paying a lookup per target, keeping the tasks the view would keep
        // anyway, and the same ones each round whatever the order of the answer.
        records.sort_by_cached_key(|(_, host, port)| {
            (ordinal_of(host).unwrap_or(usize::MAX), host.clone(), *port)
        });
        records.dedup_by(|a, b| a.1 == b.1);
        let capped = records.len() > self.max_tasks;
        records.truncate(self.max_tasks);
        let targets: Vec<Target> = stream::iter(records)
            .map(|(name, host, srv_port)| async move {
                let port = if self.port_from_srv { srv_port } else { self.port };
                // A target the view will leave out is not worth a query.
                let usable = ordinal_of(&host).is_some_and(|i| i < self.max_tasks);
                let ip = if usable { self.first_address(name).await? } else { None };
                Ok::<_, ResolveError>(Target { host, address: ip.map(|ip| SocketAddr::new(ip, port)) })
            })
            .buffer_unordered(TARGET_LOOKUPS_IN_FLIGHT)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<Result<_, _>>()?;
        let (view, tally) = view::by_ordinal(targets, self.max_tasks);
        Ok(Resolution { view, empty_zones: Vec::new(), tally, capped })
    }

    async fn by_address(&self, query: &Name) -> Result<Resolution, ResolveError> {
        let mut ips: Vec<IpAddr> = match self.resolver.lookup_ip(query.clone()).await {
            Ok(ips) => ips.iter().collect(),
            Err(e) if e.is_no_records_found() => Vec::new(),
            Err(e) => return Err(e),
        };
        ips.sort();
        ips.dedup();
        let capped = ips.len() > self.max_tasks;
        ips.truncate(self.max_tasks);
        let view = view::by_address(ips.into_iter().map(|ip| SocketAddr::new(ip, self.port)).collect());
        Ok(Resolution { view, empty_zones: Vec::new(), tally: Tally::default(), capped })
    }

    /// A target's address: the smallest of its A records, else of its AAAA records (the
    /// smallest, not the first, as servers rotate them); `None` if it has none.
    async fn first_address(&self, host: Name) -> Result<Option<IpAddr>, ResolveError> {
        match self.resolver.lookup_ip(host).await {
            Ok(ips) => Ok(ips.iter().min()),
            Err(e) if e.is_no_records_found() => Ok(None),
            Err(e) => Err(e),
        }
    }
}
