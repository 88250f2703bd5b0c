//! The experiment's fleet: the backend servers of three zones (killed and restarted in
//! place), the job views each strategy follows, the assignments keyed traffic routes
//! by, and the frontends' channels.
//!
//! Backend task `i` of the job is in zone `i / 4` at zone index `i % 4` (zones a, b, c in
//! that order), and answers every echo with `i` after a fixed service time: the
//! frontends learn from each reply which backend, and so which zone, served it. (The
//! service time makes every backend's latency the same to within the balancer's tie
//! band, as equal backends doing real work are; an echo answered at once has a latency
//! of pure scheduling noise on a busy machine, which Peak EWMA would follow.) Killing a zone stops its servers (they
//! accept no connection; calls in flight finish) while every view still says they serve;
//! halving a zone takes its top zone indices out of every view.

use std::net::SocketAddr;

use clap::ValueEnum;
use serde::{Deserialize, Serialize};
use std::time::Duration;
use steady_balance::{
    Assignment, BalanceConfig, JobView, Locality, NoReplicaPolicy, SliceKey, Task, TaskState, Zone,
    ZoneRouting, ZoneSizes,
};
use steady_slice::Slice;

use steady_testing::echo::echo_server::{Echo, EchoServer};
use steady_testing::echo::{EchoReply, EchoRequest};
use steady_testing::loopback::{self, Loopback, ServerGuard};
use steady_tonic::{SteadyChannel, TaskEndpoint};
use tokio::sync::watch;

/// The zones' labels, by zone number.
pub(crate) const ZONES: [&str; 3] = ["a", "b", "c"];
/// Backends each zone starts with.
pub(crate) const BACKENDS_PER_ZONE: usize = 4;
/// Frontends each zone starts with: demand 50/25/25%.
pub(crate) const FRONTENDS: [usize; 3] = [6, 3, 3];
/// Each frontend's subset size: a zone's 4 backends (per zone, zone-aware), or 4 of the
/// job's 12 (zone-unaware): the same number of connections whatever the strategy.
pub(crate) const SUBSET_SIZE: usize = 4;
/// Slices of the keyed assignment: 24 equal ranges, 6 per backend of each zone.
const SLICES: usize = 24;

/// How a frontend chooses its backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Strategy {
    /// Plain Rocksteadier over the whole job, `BalanceConfig::new(global index, k)`.
    ZoneUnaware,
    /// One channel per zone: each frontend sees only its zone's backends, renumbered by
    /// zone index, with its zone index as its frontend index. Nothing spills.
    PerZone,
    /// steady's zone-aware mode: `BalanceConfig::new(zone index, k).with_zones(..)` over
    /// the whole job, whose tasks carry their `Locality`.
    ZoneAware,
}

impl Strategy {
    pub(crate) const ALL: [Strategy; 3] = [Strategy::ZoneUnaware, Strategy::PerZone, Strategy::ZoneAware];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Strategy::ZoneUnaware => "zone-unaware",
            Strategy::PerZone => "one channel per zone",
            Strategy::ZoneAware => "zone-aware",
        }
    }
}

/// Whether requests carry a slice key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Traffic {
    /// No key: balanced over the subset.
    Unkeyed,
    /// A uniformly random key in `x-slice-key`, routed to its slice's replicas (one in
    /// each zone).
    Keyed,
}

impl Traffic {
    pub(crate) const ALL: [Traffic; 2] = [Traffic::Unkeyed, Traffic::Keyed];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Traffic::Unkeyed => "unkeyed",
            Traffic::Keyed => "keyed",
        }
    }
}

/// The zone of job-wide backend task `task`.
pub(crate) fn zone_of_backend(task: usize) -> usize {
    task / BACKENDS_PER_ZONE
}

/// The job-wide index of zone `zone`'s backend at zone index `index`.
pub(crate) fn backend_of(zone: usize, index: usize) -> usize {
    zone * BACKENDS_PER_ZONE + index
}

/// A backend's service: answers with its task index after `work`.
#[derive(Debug, Clone, Copy)]
struct Worker {
    task: u32,
    work: Duration,
}

#[tonic::async_trait]
impl Echo for Worker {
    async fn echo(
        &self,
        request: tonic::Request<EchoRequest>,
    ) -> Result<tonic::Response<EchoReply>, tonic::Status> {
        tokio::time::sleep(self.work).await;
        Ok(tonic::Response::new(EchoReply { payload: request.into_inner().payload, task: self.task }))
    }
}

/// The backend job's servers and what discovery says of them.
pub(crate) struct Backends {
    /// By job-wide index; kept over kills, so a restart binds the same port.
    addresses: Vec<SocketAddr>,
    /// `None` while killed.
    servers: Vec<Option<ServerGuard>>,
    /// Each request's service time.
    work: Duration,
    /// Whether the frontends' balancers put reconnected members on probation.
    probation: bool,
    /// Backends each zone has in the views (its zone indices `0..n`).
    pub(crate) in_view: [usize; 3],
    /// The views, one sender per kind (see [`Views`]).
    views: Views,
    /// The keyed assignment over the whole job, and each zone's renumbered one.
    assignments: Assignments,
}

/// The job views each strategy follows.
struct Views {
    /// The whole job, no zones (zone-unaware).
    plain: watch::Sender<JobView<TaskEndpoint>>,
    /// The whole job, each task with its `Locality` (zone-aware).
    zoned: watch::Sender<JobView<TaskEndpoint>>,
    /// Each zone's backends alone, by zone index (one channel per zone).
    per_zone: [watch::Sender<JobView<TaskEndpoint>>; 3],
}

/// The keyed assignment each strategy follows.
struct Assignments {
    global: watch::Sender<Assignment>,
    per_zone: [watch::Sender<Assignment>; 3],
}

impl Backends {
    /// Starts `4` backends in each zone on loopback, each request taking `work`, and the
    /// views and assignments; the frontends it makes put reconnected members on
    /// probation when `probation`.
    pub(crate) async fn start(work: Duration, probation: bool) -> Result<Self, Box<dyn std::error::Error>> {
        let mut addresses = Vec::new();
        let mut servers = Vec::new();
        for task in 0..ZONES.len() * BACKENDS_PER_ZONE {
            let worker = Worker { task: task as u32, work };
            let (address, server) = loopback::serve(EchoServer::new(worker)).await;
            addresses.push(address);
            servers.push(Some(server));
        }
        let in_view = [BACKENDS_PER_ZONE; 3];
        let views = Views {
            plain: watch::channel(plain_view(&addresses, in_view, false)).0,
            zoned: watch::channel(plain_view(&addresses, in_view, true)).0,
            per_zone: [0, 1, 2].map(|z| watch::channel(zone_view(&addresses, z, in_view[z])).0),
        };
        let (global, per_zone) = assignments(1, in_view)?;
        let assignments =
            Assignments { global: watch::channel(global).0, per_zone: per_zone.map(|a| watch::channel(a).0) };
        Ok(Self { addresses, servers, work, probation, in_view, views, assignments })
    }

    /// Whether backend `task` is in the views and its server runs.
    pub(crate) fn serving(&self, task: usize) -> bool {
        let zone = zone_of_backend(task);
        self.servers[task].is_some() && task % BACKENDS_PER_ZONE < self.in_view[zone]
    }

    /// For each slice of the assignment in force, its replicas in each zone that serve.
    pub(crate) fn serving_replicas_by_zone(&self) -> Vec<[usize; 3]> {
        let assignment = self.assignments.global.borrow();
        assignment
            .slices()
            .iter()
            .map(|slice| {
                let mut zones = [0; 3];
                for &r in slice.replicas().iter().filter(|&&r| self.serving(r as usize)) {
                    zones[zone_of_backend(r as usize)] += 1;
                }
                zones
            })
            .collect()
    }

    /// The job's backends (in the views or not).
    pub(crate) fn count(&self) -> usize {
        self.addresses.len()
    }

    /// Stops every server of `zone` (each waits for its calls in flight) without telling
    /// discovery: the views still say they serve.
    pub(crate) async fn kill(&mut self, zone: usize) {
        let stops: Vec<_> = (0..BACKENDS_PER_ZONE)
            .filter_map(|i| self.servers[backend_of(zone, i)].take())
            .map(ServerGuard::stop)
            .collect();
        futures_join(stops).await;
    }

    /// Starts `zone`'s killed servers again on their ports.
    pub(crate) async fn restart(&mut self, zone: usize) {
        for i in 0..BACKENDS_PER_ZONE {
            let task = backend_of(zone, i);
            if self.servers[task].is_none() {
                let port = Loopback::bind_to(self.addresses[task]).await;
                let worker = Worker { task: task as u32, work: self.work };
                self.servers[task] = Some(port.serve(EchoServer::new(worker)));
            }
        }
    }

    /// Whether backend `task`'s server runs (whatever the views say).
    pub(crate) fn live(&self, task: usize) -> bool {
        self.servers.get(task).is_some_and(Option::is_some)
    }

    /// Keeps only zone indices `0..backends` of `zone` in every view (0: the zone leaves
    /// them, as a registry shows tasks whose leases expired), the assignments unchanged.
    pub(crate) fn show(&mut self, zone: usize, backends: usize) {
        self.in_view[zone] = backends.min(BACKENDS_PER_ZONE);
        self.views.plain.send_replace(plain_view(&self.addresses, self.in_view, false));
        self.views.zoned.send_replace(plain_view(&self.addresses, self.in_view, true));
        for (z, sender) in self.views.per_zone.iter().enumerate() {
            sender.send_replace(zone_view(&self.addresses, z, self.in_view[z]));
        }
    }

    /// Keeps only zone indices `0..backends` of `zone` in every view, and publishes the
    /// next assignment, whose replicas in `zone` are on those backends only.
    pub(crate) fn resize(&mut self, zone: usize, backends: usize) -> Result<(), Box<dyn std::error::Error>> {
        self.show(zone, backends.clamp(1, BACKENDS_PER_ZONE));
        let generation = self.assignments.global.borrow().generation() + 1;
        let (global, per_zone) = assignments(generation, self.in_view)?;
        self.assignments.global.send_replace(global);
        for (sender, a) in self.assignments.per_zone.iter().zip(per_zone) {
            sender.send_replace(a);
        }
        Ok(())
    }

    /// A zone-aware frontend for keyed traffic in `zone` (its zone index `index`, the
    /// frontend job's size in each zone `frontends`) that follows `assignments` instead
    /// of the fleet's own. A keyed request whose slice has no ready replica fails
    /// (`NoReplicaPolicy::Fail`) instead of going to the subset: a service whose keys
    /// must reach one of their owners, so that a failed request counts a key with no
    /// live owner.
    pub(crate) fn keyed_frontend(
        &self,
        zone: usize,
        index: usize,
        frontends: [usize; 3],
        assignments: watch::Receiver<Assignment>,
    ) -> Result<SteadyChannel, steady_balance::ConfigError> {
        let mut config = BalanceConfig::new(index, SUBSET_SIZE)
            .with_zones(ZoneRouting::new(zone_label(zone), frontend_zones(frontends)));
        config.slow_start = config.slow_start.with_probation(self.probation);
        config.no_replica = NoReplicaPolicy::Fail;
        let channel = SteadyChannel::builder(config).from_job(self.views.zoned.subscribe())?;
        channel.balance().follow_assignment_watch(assignments);
        Ok(channel)
    }

    /// A frontend of `strategy` in `zone`: its global index `global` (over every zone's
    /// frontends), its index `index` within the zone, and the frontends each zone has.
    pub(crate) fn frontend(
        &self,
        strategy: Strategy,
        traffic: Traffic,
        zone: usize,
        index: usize,
        global: usize,
        frontends: [usize; 3],
    ) -> Result<SteadyChannel, steady_balance::ConfigError> {
        let (config, views) = match strategy {
            Strategy::ZoneUnaware => (BalanceConfig::new(global, SUBSET_SIZE), self.views.plain.subscribe()),
            Strategy::PerZone => {
                (BalanceConfig::new(index, SUBSET_SIZE), self.views.per_zone[zone].subscribe())
            }
            Strategy::ZoneAware => (
                BalanceConfig::new(index, SUBSET_SIZE)
                    .with_zones(ZoneRouting::new(zone_label(zone), frontend_zones(frontends))),
                self.views.zoned.subscribe(),
            ),
        };
        let mut config = config;
        config.slow_start = config.slow_start.with_probation(self.probation);
        let channel = SteadyChannel::builder(config).from_job(views)?;
        if traffic == Traffic::Keyed {
            let assignments = match strategy {
                Strategy::PerZone => self.assignments.per_zone[zone].subscribe(),
                _ => self.assignments.global.subscribe(),
            };
            channel.balance().follow_assignment_watch(assignments);
        }
        Ok(channel)
    }
}

/// Zone `zone`'s label.
pub(crate) fn zone_label(zone: usize) -> Zone {
    Zone::new(ZONES[zone]).expect("a valid zone label")
}

/// The frontend job's size in each zone, as `set_frontend_zones` takes it.
pub(crate) fn frontend_zones(frontends: [usize; 3]) -> ZoneSizes {
    (0..3).map(|z| (zone_label(z), frontends[z])).collect()
}

/// Waits for every future of `stops`, concurrently.
async fn futures_join(stops: Vec<impl std::future::Future<Output = ()> + Send + 'static>) {
    let handles: Vec<_> = stops.into_iter().map(tokio::spawn).collect();
    for h in handles {
        let _ = h.await;
    }
}

fn endpoint(address: SocketAddr) -> TaskEndpoint {
    TaskEndpoint(loopback::endpoint(address))
}

/// The whole job: zone `z`'s backends at zone indices `0..in_view[z]`, with their
/// `Locality` when `zoned`. The job's size stays 12; the tasks out of the view leave
/// holes (as the registry shows a task that left).
fn plain_view(addresses: &[SocketAddr], in_view: [usize; 3], zoned: bool) -> JobView<TaskEndpoint> {
    let mut view = JobView::default().with_size(addresses.len());
    let tasks = std::sync::Arc::make_mut(&mut view.tasks);
    for (task, &address) in addresses.iter().enumerate() {
        let (zone, index) = (zone_of_backend(task), task % BACKENDS_PER_ZONE);
        if index >= in_view[zone] {
            continue;
        }
        let mut t = Task::new(endpoint(address), TaskState::Serving);
        if zoned {
            t = t.in_zone(Locality::new(zone_label(zone), index));
        }
        tasks.insert(task, t);
    }
    view
}

/// Zone `zone`'s backends alone, renumbered by zone index: a job of `backends`.
fn zone_view(addresses: &[SocketAddr], zone: usize, backends: usize) -> JobView<TaskEndpoint> {
    JobView::serving((0..backends).map(|i| endpoint(addresses[backend_of(zone, i)])))
}

/// Generation `generation` of the keyed assignment: [`SLICES`] equal ranges, slice `s`
/// with one replica in each zone (`s`'s turn over the zone's backends in the view), and
/// the same slices for each zone alone, its replica renumbered by zone index.
fn assignments(
    generation: u64,
    in_view: [usize; 3],
) -> Result<(Assignment, [Assignment; 3]), steady_slice::AssignmentError> {
    let width = u64::MAX / SLICES as u64;
    // Zone z's replica of slice s, by zone index: the zones start one backend apart, so
    // no two zones' replicas of a slice share an index.
    let replica = |s: usize, z: usize| (s + z) % BACKENDS_PER_ZONE % in_view[z].max(1);
    let start = |s: usize| SliceKey(s as u64 * width);
    let global = (0..SLICES)
        .map(|s| {
            Slice::new(start(s), (0..3).map(|z| backend_of(z, replica(s, z)) as u32).collect::<Vec<_>>())
        })
        .collect();
    let global = Assignment::new(generation, global)?;
    let mut per_zone = Vec::new();
    for z in 0..3 {
        let slices = (0..SLICES).map(|s| Slice::new(start(s), vec![replica(s, z) as u32])).collect();
        per_zone.push(Assignment::new(generation, slices)?);
    }
    let per_zone: [Assignment; 3] = per_zone.try_into().expect("three zones");
    Ok((global, per_zone))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_backend_in_the_view_holds_an_even_share_of_the_slices() {
        let count =
            |a: &Assignment, task: u32| a.slices().iter().filter(|s| s.replicas().contains(&task)).count();
        let (global, per_zone) = assignments(1, [4, 4, 4]).unwrap();
        for task in 0..12 {
            assert_eq!(count(&global, task), SLICES / 4, "task {task}");
        }
        for (z, a) in per_zone.iter().enumerate() {
            for (s, slice) in a.slices().iter().enumerate() {
                // The zone's assignment names the same backend as the global one.
                let named = backend_of(z, slice.replicas()[0] as usize) as u32;
                assert_eq!(global.slices()[s].replicas()[z], named);
            }
        }
        // Zone c halved: its two backends hold half of the slices each.
        let (global, _) = assignments(2, [4, 4, 2]).unwrap();
        assert_eq!((count(&global, 8), count(&global, 9), count(&global, 10)), (12, 12, 0));
        assert_eq!(count(&global, 0), SLICES / 4);
    }

    #[test]
    fn views_keep_the_job_size_and_leave_holes_for_the_tasks_out_of_them() {
        let addresses: Vec<SocketAddr> =
            (0..12).map(|p| SocketAddr::from(([127, 0, 0, 1], 1000 + p))).collect();
        let view = plain_view(&addresses, [4, 4, 2], true);
        assert_eq!(view.size, 12);
        assert!(view.serving_task(9).is_some() && view.serving_task(10).is_none());
        assert_eq!(view.zone_of(5).map(Zone::as_str), Some("b"));
        assert!(!plain_view(&addresses, [4, 4, 4], false).has_zones());
        // A zone out of the views (its leases expired): holes, the job's size kept.
        let a_gone = plain_view(&addresses, [0, 4, 4], true);
        assert_eq!(a_gone.size, 12);
        assert!((0..4).all(|t| a_gone.serving_task(t).is_none()) && a_gone.serving_task(4).is_some());
        let c = zone_view(&addresses, 2, 2);
        assert_eq!(c.size, 2);
        assert_eq!(c.serving_task(1).map(|e| e.0.uri().port_u16()), Some(Some(1009)));
    }
}
