//! Where a steady frontend gets its backends and its own index (see `docs/discovery.md`).
//!
//! Index-based subsetting (decimal Rocksteadier, the default, or Rocksteadier) needs each
//! frontend to know its index `m` in `0..M` and each backend task's index in `0..N`. This
//! crate provides both, so that nobody numbers tasks by hand:
//!
//! * **Job views** ([`Discovery`]): a `watch` of [`JobView`]s of `host:port` addresses,
//!   which `steady_tonic::SteadyChannelBuilder::from_addresses` (and the balancer) take:
//!   * [`Discovery::fixed`]: a static list;
//!   * [`dns`] (feature `dns`): a name re-resolved on a period, indices from
//!     StatefulSet-style ordinals in host names;
//!   * [`registry`] (feature `etcd`): tasks registered under
//!     `/steady/jobs/<job>/tasks/<index>` with a lease, the view following the prefix.
//! * **Task identity** ([`identity`]): from an explicit value, an environment variable,
//!   a StatefulSet hostname ordinal, or (feature `etcd`) the lowest free index of the
//!   job taken under a lease; with none of them, a random index for random subsetting
//!   (gRFC A68) with a warning.
//!
//! # Example
//!
//! The three setups of a frontend, each a few lines (`steady-tonic` builds the channel):
//!
//! ```no_run
//! # async fn setups() -> Result<(), Box<dyn std::error::Error>> {
//! use steady_discovery::identity::{self, IdentitySource};
//! use steady_discovery::{dns, registry, Discovery};
//! use steady_balance::BalanceConfig;
//! use steady_tonic::SteadyChannel;
//!
//! // A static list; the index from the environment or a StatefulSet hostname (`web-3`).
//! let me = identity::resolve(&[IdentitySource::Env("TASK_INDEX".into()), IdentitySource::HostnameOrdinal])?;
//! let backends = Discovery::fixed(["10.0.0.1:50051", "10.0.0.2:50051"]);
//! let channel = SteadyChannel::builder(BalanceConfig::new(me.index(), 10).with_algorithm(me.algorithm())).from_addresses(backends.views())?;
//!
//! // DNS: a Kubernetes headless service of a StatefulSet, indices from pod ordinals.
//! let backends = dns::discover(dns::DnsConfig::new("web.prod.svc.cluster.local.", 50051)).await?;
//! let channel = SteadyChannel::builder(BalanceConfig::new(me.index(), 10).with_algorithm(me.algorithm())).from_addresses(backends.views())?;
//!
//! // etcd: backends registered under /steady/jobs/web/tasks/<i>; this frontend takes the
//! // lowest free index of its own job under a lease.
//! let etcd = registry::Registry::connect(registry::RegistryConfig::new(["http://etcd:2379"])).await?;
//! let me = etcd.claim_index("web-frontends", "frontend-pod-a").await?;
//! let backends = registry::watch_job(&etcd, "web").await?;
//! let channel = SteadyChannel::builder(BalanceConfig::new(me.index(), 10).with_algorithm(me.algorithm())).from_addresses(backends.views())?;
//! # drop(channel);
//! # Ok(())
//! # }
//! ```
//!
//! # Zones
//!
//! Every source can say which zone each task is in ([`Task::locality`]: the zone and the
//! task's index within it): the registry's records (`zone=<zone>/<zone-index>`, claimed
//! race-free with `registry::Registry::claim_in_zone`), [`Discovery::fixed_in_zones`], and
//! `dns::DnsConfig::zoned` (one name per zone). A frontend's own zone comes from
//! [`identity::resolve_zone`] (`STEADY_ZONE` by convention) or the registry's zoned
//! claim, and its [`identity::Identity::index`] is then its index within the zone. A
//! zone-aware frontend keeps its balancer told of its own job's zone sizes:
//!
//! ```no_run
//! # async fn zoned() -> Result<(), Box<dyn std::error::Error>> {
//! use steady_balance::{BalanceConfig, ZoneRouting};
//! use steady_discovery::identity::{self, ZoneSource};
//! use steady_discovery::registry::{self, Registry, RegistryConfig};
//! use steady_tonic::SteadyChannel;
//!
//! let etcd = Registry::connect(RegistryConfig::new(["http://etcd:2379"])).await?;
//! let zone = identity::resolve_zone(&[ZoneSource::env()])?.ok_or("STEADY_ZONE is not set")?;
//! let me = etcd.claim_index_in_zone("web-frontends", &zone, "frontend-pod-a").await?;
//! let frontends = registry::watch_job(&etcd, "web-frontends").await?;
//! let backends = registry::watch_job(&etcd, "api").await?;
//! let routing = ZoneRouting::new(zone, frontends.current().zone_sizes());
//! let config = BalanceConfig::new(me.index(), 10).with_zones(routing);
//! let channel = SteadyChannel::builder(config).from_addresses(backends.views())?;
//! // Every change of the frontend job's zone sizes reaches the balancer.
//! let (mut views, follower) = (frontends.views(), channel.clone());
//! tokio::spawn(async move {
//!     while views.changed().await.is_ok() {
//!         let sizes = views.borrow_and_update().zone_sizes();
//!         follower.set_frontend_zones(sizes);
//!     }
//! });
//! # drop((me, frontends, channel));
//! # Ok(())
//! # }
//! ```
//!
//! # Dependencies
//!
//! `steady-core` (for [`JobView`]), `steady-subset` (for [`identity`]'s algorithm
//! choice), tokio, and optionally an etcd client and a DNS resolver. It never depends on
//! the balancer, and the balancer and the channel never depend on it: they take the
//! views it produces.

#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub, rust_2018_idioms)]

#[cfg(feature = "dns")]
pub mod dns;
pub mod identity;
#[cfg(feature = "metrics")]
mod metrics;
#[cfg(feature = "etcd")]
pub mod registry;
mod source;

pub use source::Discovery;
pub use steady_core::{JobView, Locality, Task, TaskState, Zone, ZoneError};
