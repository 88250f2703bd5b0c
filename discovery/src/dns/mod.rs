//! Job views from DNS: a name re-resolved on a period (see `docs/discovery.md`).
//!
//! A Kubernetes headless service in front of a StatefulSet publishes, for each ready pod,
//! an SRV record whose target is the pod's own name (`web-3.web.prod.svc.cluster.local`)
//! and an A record for that name. [`discover`] resolves them, numbers each pod by its
//! ordinal ([`IndexRule::Ordinals`]) and keeps a [`Discovery`] up to date:
//!
//! ```no_run
//! # async fn run() -> Result<(), steady_discovery::dns::DnsError> {
//! use steady_discovery::dns::{self, DnsConfig};
//!
//! let backends = dns::discover(DnsConfig::new("web.prod.svc.cluster.local.", 50051)).await?;
//! let views = backends.views(); // hand these to the balancer or the channel
//! # let _ = views; Ok(()) }
//! ```
//!
//! # Contract
//!
//! * The first resolution happens inside [`discover`]: if it fails or gives no task, the
//!   caller gets the [`DnsError`] and no source.
//! * Then a task re-resolves every [`DnsConfig::period`] and publishes a new view only
//!   when it differs from the last one. A change reaches the view within one period
//!   plus one resolution; the resolver's cache is off, so record TTLs add nothing.
//! * A resolution that fails (timeout, refused, server failure; any one target's address
//!   lookup failing) or that finds no task at all (no such name, no records) **keeps the
//!   last view**: it is logged and counted ([`DnsCounters`]). An empty answer is taken for
//!   a glitch rather than a job scaled to zero, since emptying every frontend's view at
//!   once is the worse mistake; a job really scaled to zero keeps its last addresses,
//!   which then refuse connections.
//! * Odd answers never panic: records past [`DnsConfig::max_tasks`] and ordinals at or
//!   above it are left out, two targets claiming one ordinal leave it to the one whose
//!   name sorts first, and each is counted.
//! * Only ready pods are in a headless service's records, so a pod that is not ready is
//!   a hole at its ordinal, which the balancer skips: no other task's index moves.
//!
//! # Zones
//!
//! [`DnsConfig::zoned`] takes one name per zone (a StatefulSet and headless service per
//! zone). Each pod's ordinal is its index within its zone, and with `Z` zones the pod of
//! ordinal `o` in the zone at position `p` of the list is task `o × Z + p` of the job, so
//! that resizing one zone renumbers nobody. Every task of the view carries its
//! [`Locality`](steady_core::Locality). A zone whose name answers nothing keeps its last
//! tasks; any zone's failure keeps the whole last view.

mod config;
mod counters;
mod error;
mod lookup;
mod view;

use std::time::Duration;

use steady_core::JobView;
use tokio::sync::watch;
use tokio::time::{interval_at, Instant, MissedTickBehavior};

use crate::Discovery;

pub use config::{DnsConfig, IndexRule};
pub use counters::{DnsCounters, DnsCountsSnapshot};
pub use error::DnsError;

use counters::Count;
use lookup::{Lookup, Resolution};

/// Resolves `config`'s name once, then follows it on a task of its own (stopped when
/// the [`Discovery`] is dropped). Must be called inside a tokio runtime.
///
/// # Errors
///
/// [`DnsError::InvalidConfig`] for a zero period or cap, or a name that is not one;
/// [`DnsError::SystemConfig`] when no nameserver is given and the system's cannot be
/// read; [`DnsError::Resolve`] when the first resolution fails;
/// [`DnsError::NoTasks`] when it gives no usable task.
pub async fn discover(config: DnsConfig) -> Result<Discovery, DnsError> {
    if config.period.is_zero() {
        return Err(DnsError::InvalidConfig { reason: "the re-resolve period is zero".to_owned() });
    }
    if config.max_tasks == 0 {
        return Err(DnsError::InvalidConfig { reason: "the cap on tasks is zero".to_owned() });
    }
    let lookup = Lookup::new(&config)?;
    let name = lookup.names().to_owned();
    config.counters.add(Count::Resolutions, 1);
    let first = lookup.resolve().await.map_err(|e| {
        config.counters.add(Count::Failures, 1);
        DnsError::Resolve { name: name.clone(), reason: e.to_string() }
    })?;
    count_anomalies(&config.counters, &first);
    config.counters.add(Count::EmptyAnswers, first.empty_zones.len() as u64);
    if first.view.size == 0 {
        if first.empty_zones.is_empty() {
            config.counters.add(Count::EmptyAnswers, 1);
        }
        return Err(DnsError::NoTasks { name });
    }
    tracing::info!(name = %name, size = first.view.size, tasks = first.view.tasks.len(), "dns: first view");
    let (publisher, views) = watch::channel(first.view);
    let worker = Worker { lookup, publisher, counters: config.counters, period: config.period };
    Ok(Discovery::spawned(views, tokio::spawn(worker.run())))
}

/// Re-resolves on the period and publishes changed views.
#[derive(Debug)]
struct Worker {
    lookup: Lookup,
    publisher: watch::Sender<JobView<String>>,
    counters: DnsCounters,
    period: Duration,
}

impl Worker {
    async fn run(self) {
        let mut ticks = interval_at(Instant::now() + self.period, self.period);
        // A slow resolution (a dead server: timeout × attempts) pushes the next one back
        // rather than firing a burst to catch up.
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            self.refresh().await;
        }
    }

    /// One round: resolve, then publish the view if it is usable and new.
    async fn refresh(&self) {
        let name = self.lookup.names();
        self.counters.add(Count::Resolutions, 1);
        let resolution = match self.lookup.resolve().await {
            Ok(resolution) => resolution,
            Err(error) => {
                self.counters.add(Count::Failures, 1);
                tracing::warn!(name = %name, %error, "dns: resolution failed; keeping the last view");
                return;
            }
        };
        count_anomalies(&self.counters, &resolution);
        let Resolution { mut view, tally, capped, empty_zones } = resolution;
        if !empty_zones.is_empty() {
            self.counters.add(Count::EmptyAnswers, empty_zones.len() as u64);
            tracing::warn!(name = %name, ?empty_zones, "dns: no usable task in some zones' answers; keeping their last tasks");
            let last = self.publisher.borrow().clone();
            view = view::keep_empty_zones(view, &empty_zones, self.lookup.zone_count(), &last);
        }
        if view.size == 0 {
            self.counters.add(Count::EmptyAnswers, 1);
            tracing::warn!(name = %name, "dns: no usable task in the answer; keeping the last view");
            return;
        }
        // Only this worker publishes, so the view compared is the view replaced; the
        // change is counted before it is published, so that whoever sees the new view
        // also sees it counted.
        let changed = *self.publisher.borrow() != view;
        if changed {
            self.counters.add(Count::Changes, 1);
            self.publisher.send_replace(view);
        }
        if changed {
            let current = self.publisher.borrow();
            tracing::info!(
                name = %name,
                size = current.size,
                tasks = current.tasks.len(),
                duplicate_ordinals = tally.duplicate_ordinals,
                skipped = tally.skipped,
                capped,
                "dns: view changed"
            );
        }
    }
}

/// Counts what the index rule left out of `resolution`.
fn count_anomalies(counters: &DnsCounters, resolution: &Resolution) {
    counters.add(Count::DuplicateOrdinals, resolution.tally.duplicate_ordinals);
    counters.add(Count::SkippedRecords, resolution.tally.skipped);
    counters.add(Count::CappedAnswers, u64::from(resolution.capped));
}
