//! The fleet: every job of a spec store served by every instance, each job's Assigner on
//! the one instance the spread names.
//!
//! An instance ([`Fleet`]) follows three things and keeps its jobs in line with them:
//!
//! * the job specs ([`SpecStore::watch`]): a job created is served from then on, a
//!   changed spec takes effect (the drained tasks live; anything else restarts the job's
//!   Assigner, which resigns first so that the new one leads at once), a removed job is
//!   no longer served, and a spec refused (a value that does not parse or validate) is
//!   one event naming the job while its last good spec stays in force;
//! * the live instances ([`EtcdFleet::watch_instances`], or this instance alone on the
//!   memory store);
//! * the operator's run requests ([`EtcdFleet::watch_run_requests`]).
//!
//! For every job it follows the assignment in the store into its [`Distributor`] (so
//! every instance serves every job's Watch, from the same store) and into its
//! [`LoadBook`] (so every instance takes every job's load reports: a Slicelet reports to
//! every instance, and an instance that takes a job over has the load already). The
//! jobs are spread over the live instances by [`Spread`] (rendezvous hashing with a cap:
//! within one job of even, few moved when an instance joins or goes); an instance runs
//! the Assigner of each job the spread gives it, which campaigns in the store as the
//! instance (elected per job; the fencing stays per job), and hands over (resigns) each
//! job the spread gives another. Instances agree on the spread because they see the same
//! instances and jobs; while two views differ (for the moment an instance joins), two
//! instances may campaign for one job, and the store's election keeps one writer.
//!
//! The control task never ends by itself: an Assigner that stops, or whose tasks cannot
//! be followed yet (a registry or DNS name that does not answer), is started again with
//! backoff; a watch that fails is made again.
//!
//! # Bounds
//!
//! At most [`steady_slicer::specs::MAX_JOBS`] jobs (the spec store's bound) and
//! [`steady_slicer::fleet::MAX_INSTANCES`] instances. Per job an instance keeps a watch
//! of the store, the Distributor's current assignment, the book's last 4 generations and
//! a report per task, and (with [`Fleet::endpoint_names`], for a job whose tasks are in a
//! registry) a watch of its registry and a name per task; per job it leads, an Assigner
//! service and its task source (its
//! leader key sits on the store's session lease, when the store has one:
//! `EtcdConfig::session_lease`). A thousand jobs' registries on one cluster share one connection.
//!
//! # Example
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//! use steady_slicer::fleet::Instance;
//! use steady_slicer::load::LoadBook;
//! use steady_slicer::specs::{SpecDirectory, SpecStore};
//! use steady_slicer::{Distributor, MemoryStore};
//! use steady_slicer_server::fleet::Fleet;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let specs = SpecStore::Directory(SpecDirectory::open("/etc/steady/jobs", Duration::from_secs(5))?);
//! let (distributor, book) = (Distributor::new(), LoadBook::new());
//! let me = Instance { address: "127.0.0.1:50070".into(), pages: None };
//! let fleet = Fleet::new("slicer-a", me, Arc::new(MemoryStore::new()), distributor.clone(), book.clone())
//!     .specs(specs)
//!     .on_event(|event| eprintln!("steady-slicer: {event}"))
//!     .spawn();
//! // Serve distributor.service() and a LoadCollector on book; read fleet.status().
//! fleet.stop().await; // every Assigner here resigns
//! # Ok(())
//! # }
//! ```

mod gate;
mod job;
mod sources;
mod status;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use steady_assigner::Tasks;
use steady_slicer::assigner_service::AssignerConfig;
use steady_slicer::autosharding::EndpointNames;
use steady_slicer::fleet::{Instance, RunRequests};
use steady_slicer::load::LoadBook;
use steady_slicer::specs::{JobConfig, SpecChange, SpecStore, SpecStoreError};
use steady_slicer::spread::Spread;
use steady_slicer::store::EtcdAccess;
use steady_slicer::{AssignmentStore, Distributor};
use tokio::sync::watch;
use tokio::task::JoinHandle;

#[cfg(doc)]
use steady_slicer::fleet::EtcdFleet;

use job::{Job, Shared};
pub use status::{FleetStatus, JobStatus};

/// Where a fleet's jobs come from.
#[derive(Debug)]
enum Specs {
    Store(SpecStore),
    Fixed(Vec<JobConfig>),
}

type SpecItems =
    std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<SpecChange, SpecStoreError>> + Send>>;

impl Specs {
    fn watch(&self) -> SpecItems {
        match self {
            Self::Store(store) => Box::pin(store.watch()),
            Self::Fixed(jobs) => Box::pin(
                futures_util::stream::once(std::future::ready(Ok(SpecChange::Current(jobs.clone()))))
                    .chain(futures_util::stream::pending()),
            ),
        }
    }
}

/// How long an Assigner that stopped by itself (or whose tasks could not be followed),
/// or a job's naming whose registry did not answer, waits before it is started again, at
/// first; doubled up to [`MAX_RESTART`].
const FIRST_RESTART: Duration = Duration::from_millis(500);
const MAX_RESTART: Duration = Duration::from_secs(30);

/// How often the control task looks for Assigners that stopped (what its status shows
/// is sent as it changes).
const HEALTH_EVERY: Duration = Duration::from_secs(1);

/// The live instances as a fleet's members watch gives them (`None` until listed).
pub type Members = watch::Receiver<Option<BTreeMap<String, Instance>>>;

/// Where a fleet instance says what happens to its jobs: one line per event (a spec
/// refused, the spread changed, an Assigner that cannot start).
#[derive(Clone)]
pub(crate) struct Events(Arc<dyn Fn(&str) + Send + Sync>);

impl Events {
    pub(crate) fn say(&self, event: impl AsRef<str>) {
        (self.0)(event.as_ref());
    }
}

impl fmt::Debug for Events {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Events")
    }
}

/// One instance of the control plane's fleet, before it runs; see the module
/// documentation.
#[derive(Debug)]
pub struct Fleet {
    instance: String,
    me: Instance,
    store: Arc<dyn AssignmentStore>,
    specs: Specs,
    distributor: Distributor,
    book: LoadBook,
    members: Option<Members>,
    run_requests: Option<RunRequests>,
    access: EtcdAccess,
    events: Events,
    given_tasks: BTreeMap<String, watch::Receiver<Tasks>>,
    tune: Option<Tune>,
    endpoint_names: Option<EndpointNames>,
}

/// A program's adjustment of each job's Assigner configuration ([`Fleet::tune`]).
#[derive(Clone)]
pub(crate) struct Tune(Arc<TuneFn>);

/// The function of a [`Tune`].
type TuneFn = dyn Fn(&JobConfig, &mut AssignerConfig) + Send + Sync;

impl Tune {
    pub(crate) fn apply(&self, job: &JobConfig, config: &mut AssignerConfig) {
        (self.0)(job, config);
    }
}

impl fmt::Debug for Tune {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Tune")
    }
}

impl Fleet {
    /// Instance `instance` (its name in every job's election), reached at `me`, serving
    /// jobs (from [`Fleet::specs`] or [`Fleet::jobs`]; none without) from `store` into
    /// `distributor` and `book`; alone (every job here) unless [`Fleet::members`] says
    /// who else is alive.
    pub fn new(
        instance: impl Into<String>,
        me: Instance,
        store: Arc<dyn AssignmentStore>,
        distributor: Distributor,
        book: LoadBook,
    ) -> Self {
        Self {
            instance: instance.into(),
            me,
            store,
            specs: Specs::Fixed(Vec::new()),
            distributor,
            book,
            members: None,
            run_requests: None,
            access: EtcdAccess::new(),
            events: Events(Arc::new(|event| tracing::info!(event, "fleet"))),
            given_tasks: BTreeMap::new(),
            tune: None,
            endpoint_names: None,
        }
    }

    /// Takes `job`'s tasks from `tasks` (the program's own discovery, or a lab's hand),
    /// not from its spec's source.
    pub fn tasks_from(mut self, job: impl Into<String>, tasks: watch::Receiver<Tasks>) -> Self {
        self.given_tasks.insert(job.into(), tasks);
        self
    }

    /// Adjusts each job's Assigner configuration past what its spec says (what a spec
    /// does not carry: `min_interval`, `stale_after`; a lab compressing time), each time
    /// its Assigner starts here.
    pub fn tune(mut self, tune: impl Fn(&JobConfig, &mut AssignerConfig) + Send + Sync + 'static) -> Self {
        self.tune = Some(Tune(Arc::new(tune)));
        self
    }

    /// Names the tasks of each job in `names` (what the A119 server,
    /// `steady_slicer::autosharding::Autosharding`, sends clients), by the addresses its
    /// registry gives, on this instance whether or not the job's Assigner runs here (each
    /// instance follows the registry of each job it serves for it; a count's and a DNS
    /// name's tasks are named by their index: the spec's DNS name has no port), for as
    /// long as the job is served here.
    pub fn endpoint_names(mut self, names: EndpointNames) -> Self {
        self.endpoint_names = Some(names);
        self
    }

    /// Serves the jobs of `specs`, as they are created, changed and removed.
    pub fn specs(mut self, specs: SpecStore) -> Self {
        self.specs = Specs::Store(specs);
        self
    }

    /// Serves these jobs, for good (a one-job fleet: `steady-slicer --job`).
    pub fn jobs(mut self, jobs: Vec<JobConfig>) -> Self {
        self.specs = Specs::Fixed(jobs);
        self
    }

    /// Spreads the jobs over the instances `members` names (this one must be among them
    /// to run any Assigner: until its own membership shows, it runs none).
    pub fn members(mut self, members: Members) -> Self {
        self.members = Some(members);
        self
    }

    /// Runs a job at once when an operator asks for it.
    pub fn run_requests(mut self, requests: RunRequests) -> Self {
        self.run_requests = Some(requests);
        self
    }

    /// Reaches the etcd registries jobs' tasks are followed in with `access`.
    pub fn registry_access(mut self, access: EtcdAccess) -> Self {
        self.access = access;
        self
    }

    /// Says each event to `sink` (default: tracing, at info).
    pub fn on_event(mut self, sink: impl Fn(&str) + Send + Sync + 'static) -> Self {
        self.events = Events(Arc::new(sink));
        self
    }

    /// Starts the control task.
    pub fn spawn(self) -> FleetHandle {
        let (status_tx, status) = watch::channel(Arc::new(FleetStatus::default()));
        let (stop, stopped) = watch::channel(Halt::Run);
        let task = tokio::spawn(self.control(status_tx, stopped));
        FleetHandle { status, stop, task: Some(task) }
    }

    async fn control(mut self, status: watch::Sender<Arc<FleetStatus>>, mut stopped: watch::Receiver<Halt>) {
        let shared = Shared {
            instance: self.instance.clone(),
            store: self.store.clone(),
            distributor: self.distributor.clone(),
            book: self.book.clone(),
            registries: sources::Registries::new(self.access.clone()),
            events: self.events.clone(),
            given_tasks: Arc::new(std::mem::take(&mut self.given_tasks)),
            tune: self.tune.take(),
            endpoint_names: self.endpoint_names.take(),
            changed: Arc::new(tokio::sync::Notify::new()),
        };
        let mut control = Control {
            shared,
            jobs: BTreeMap::new(),
            instances: match self.members {
                None => Some(BTreeMap::from([(self.instance.clone(), self.me.clone())])),
                Some(_) => None,
            },
            listed: false,
            spread: None,
            retired: Default::default(),
            resigning: BTreeMap::new(),
        };
        let mut specs = self.specs.watch();
        let changed = control.shared.changed.clone();
        let mut health = tokio::time::interval(HEALTH_EVERY);
        health.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let halt = loop {
            // Whether the jobs or instances may have changed (a job's Assigner changing
            // what the status shows of it changes neither: the spread is not made again).
            let spread_anew = tokio::select! {
                biased;
                halt = halted(&mut stopped) => break halt,
                item = specs.next() => {
                    match item {
                        Some(Ok(change)) => control.apply(change),
                        Some(Err(refused)) => self.events.say(format!("{refused}; its last good spec stays")),
                        None => {
                            // A spec watch never ends; were it to, follow the specs anew.
                            self.events.say("the spec watch ended; watching again");
                            specs = self.specs.watch();
                        }
                    }
                    true
                }
                members = next_members(&mut self.members) => {
                    control.instances = members;
                    true
                }
                asked = next_requests(&mut self.run_requests) => {
                    control.run(&asked);
                    false
                }
                () = changed.notified() => false,
                _ = health.tick() => {
                    control.restart_ended();
                    true
                }
            };
            if spread_anew {
                control.reconcile();
            }
            control.show(&status);
        };
        // Every Assigner here resigns, so that the jobs' next owners lead at once (or, as
        // a crash, leaves its term to lapse).
        let stopped: Vec<JoinHandle<()>> = std::mem::take(&mut control.jobs)
            .into_values()
            .filter_map(|job| job.remove(&control.shared, halt))
            .collect();
        futures_util::future::join_all(stopped).await;
    }
}

/// How an Assigner, or the whole instance, is told to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Halt {
    /// Not yet.
    Run,
    /// Resign every term, so that the next owners lead at once.
    Resign,
    /// As a crash would: terms left to lapse (fault injection: tests, the lab).
    Crash,
}

/// Returns how `halt` says to stop, once it does (a sender gone: resign).
pub(crate) async fn halted(halt: &mut watch::Receiver<Halt>) -> Halt {
    let said = halt.wait_for(|h| *h != Halt::Run).await.map(|h| *h);
    said.unwrap_or(Halt::Resign)
}

/// The next value of the members watch (pending for ever without one, or once its
/// follower is gone: the last value stays).
async fn next_members(members: &mut Option<Members>) -> Option<BTreeMap<String, Instance>> {
    let Some(rx) = members.as_mut() else { return std::future::pending().await };
    if rx.changed().await.is_err() {
        return std::future::pending().await;
    }
    let value = rx.borrow_and_update().clone();
    value
}

/// The next run requests (pending for ever without a source).
async fn next_requests(requests: &mut Option<RunRequests>) -> Vec<String> {
    let Some(rx) = requests.as_mut() else { return std::future::pending().await };
    match rx.next().await {
        Some(jobs) => jobs,
        None => std::future::pending().await,
    }
}

/// The control task's state.
struct Control {
    shared: Shared,
    jobs: BTreeMap<String, Job>,
    /// The live instances (`None` until first listed).
    instances: Option<BTreeMap<String, Instance>>,
    /// Whether the specs were listed once (before, no job is led: the spread of a
    /// partial set would hand jobs around).
    listed: bool,
    spread: Option<Spread>,
    /// Removed jobs the Distributor keeps for their watchers (at most one per watcher).
    retired: std::collections::BTreeSet<String>,
    /// The Assigners of removed jobs still resigning, by job (at most one per job
    /// removed in the last moments).
    resigning: BTreeMap<String, JoinHandle<()>>,
}

impl Control {
    fn apply(&mut self, change: SpecChange) {
        match change {
            SpecChange::Current(all) => {
                self.listed = true;
                let named: std::collections::BTreeSet<&str> = all.iter().map(|c| c.job.as_str()).collect();
                let gone: Vec<String> =
                    self.jobs.keys().filter(|j| !named.contains(j.as_str())).cloned().collect();
                for job in gone {
                    self.remove(&job);
                }
                for config in all {
                    self.put(config);
                }
            }
            SpecChange::Put(config) => self.put(config),
            SpecChange::Removed(job) => self.remove(&job),
        }
    }

    fn put(&mut self, config: JobConfig) {
        match self.jobs.get_mut(&config.job) {
            Some(job) if *job.config == config => {}
            Some(job) => {
                let name = config.job.clone();
                if job.reconfigure(config, &self.shared) {
                    self.shared.events.say(format!("job {name}: spec changed; its Assigner here restarts"));
                }
            }
            None => {
                let name = config.job.clone();
                self.retired.remove(&name);
                // Removed and back: its new Assigner starts after the old one resigned.
                let resigning = self.resigning.remove(&name);
                self.jobs.insert(name, Job::follow(config, &self.shared, resigning));
            }
        }
    }

    fn remove(&mut self, job: &str) {
        if let Some(removed) = self.jobs.remove(job) {
            if let Some(resigning) = removed.remove(&self.shared, Halt::Resign) {
                self.resigning.insert(job.to_owned(), resigning);
            }
            if !self.shared.distributor.retire(job) {
                // Watchers still have it open: forgotten once they are gone.
                self.retired.insert(job.to_owned());
            }
            self.shared.events.say(format!("job {job}: removed; no longer served"));
        }
    }

    fn run(&self, jobs: &[String]) {
        for job in jobs {
            if self.jobs.get(job).is_some_and(Job::run_now) {
                self.shared.events.say(format!("job {job}: a run was asked for; running"));
            }
        }
    }

    /// Starts again the Assigners whose task ended (none should: they restart
    /// themselves), retires the removed jobs whose last watchers have gone, and takes
    /// back what the Assigner of a removed job published while it stopped.
    fn restart_ended(&mut self) {
        let (book, retired) = (&self.shared.book, &mut self.retired);
        self.resigning.retain(|job, task| {
            if !task.is_finished() {
                return true;
            }
            // A run that was writing when the job was removed may have published after
            // the removal: its Assigner has stopped now, so this is for good.
            book.forget(job);
            retired.insert(job.clone());
            false
        });
        let distributor = &self.shared.distributor;
        self.retired.retain(|job| !distributor.retire(job));
        for (name, job) in &mut self.jobs {
            if job.assigner_ended() {
                self.shared.events.say(format!("job {name}: its Assigner's task ended; starting it again"));
                job.hand_over();
            }
        }
    }

    /// Runs here the Assigners of the jobs the spread gives this instance, and hands
    /// over the others.
    fn reconcile(&mut self) {
        let Some(instances) = self.instances.as_ref().filter(|_| self.listed) else { return };
        let spread = Spread::of(self.jobs.keys().map(String::as_str), instances.keys().map(String::as_str));
        let me = self.shared.instance.as_str();
        let (mut started, mut handed) = (0, 0);
        for (name, job) in &mut self.jobs {
            if spread.owner(name) == Some(me) {
                if !job.runs_here() {
                    job.lead(&self.shared);
                    started += 1;
                }
            } else if job.hand_over() {
                handed += 1;
            }
        }
        if started + handed > 0 || self.spread.as_ref().is_some_and(|s| s.counts() != spread.counts()) {
            let here = spread.jobs_of(me).count();
            self.shared.events.say(format!(
                "spread: {} jobs over {} instances, {here} here (started {started}, handed over {handed})",
                self.jobs.len(),
                instances.len(),
            ));
        }
        self.spread = Some(spread);
    }

    /// Sends the status if anything it shows changed.
    fn show(&self, status: &watch::Sender<Arc<FleetStatus>>) {
        let instances = self.instances.clone().unwrap_or_default();
        let current = status.borrow().clone();
        let same = current.instances == instances
            && current.jobs.len() == self.jobs.len()
            && current.jobs.iter().zip(&self.jobs).all(|((a, s), (b, j))| {
                a == b
                    && Arc::ptr_eq(&s.config, &j.config)
                    && s.owner.as_deref() == self.owner(b)
                    && same_as(s.assigner.as_ref(), j.stats().as_ref(), Arc::ptr_eq)
                    && same_as(s.tasks.as_ref(), j.tasks().as_ref(), watch::Receiver::same_channel)
            });
        if same {
            return;
        }
        let jobs = self
            .jobs
            .iter()
            .map(|(name, job)| {
                let status = JobStatus {
                    config: job.config.clone(),
                    owner: self.owner(name).map(str::to_owned),
                    assigner: job.stats(),
                    tasks: job.tasks(),
                };
                (name.clone(), status)
            })
            .collect();
        status.send_replace(Arc::new(FleetStatus { instances, jobs }));
    }

    fn owner(&self, job: &str) -> Option<&str> {
        self.spread.as_ref().and_then(|s| s.owner(job))
    }
}

/// Whether a status shows this very thing (`same` says when two are one), or, as now,
/// none.
fn same_as<T>(shown: Option<&T>, now: Option<&T>, same: impl Fn(&T, &T) -> bool) -> bool {
    match (shown, now) {
        (Some(a), Some(b)) => same(a, b),
        (None, None) => true,
        _ => false,
    }
}

/// A running fleet instance ([`Fleet::spawn`]). Dropping it stops the instance at once,
/// its tasks aborted (terms are neither resigned nor renewed); [`FleetHandle::stop`]
/// resigns first.
#[derive(Debug)]
pub struct FleetHandle {
    status: watch::Receiver<Arc<FleetStatus>>,
    stop: watch::Sender<Halt>,
    task: Option<JoinHandle<()>>,
}

impl Drop for FleetHandle {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

impl FleetHandle {
    /// What the instance shows of its jobs and its fleet, as it changes.
    pub fn status(&self) -> watch::Receiver<Arc<FleetStatus>> {
        self.status.clone()
    }

    /// Whether the control task runs (it ends only on [`FleetHandle::stop`], or with the
    /// runtime).
    pub fn is_running(&self) -> bool {
        self.task.as_ref().is_some_and(|task| !task.is_finished())
    }

    /// Stops the instance: every Assigner here resigns before the return, so that the
    /// jobs' next owners lead at once.
    pub async fn stop(mut self) {
        self.stop.send_replace(Halt::Resign);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }

    /// Stops the instance as a crash would, for fault injection (tests, the lab): no
    /// Assigner here resigns; each term is left to lapse (on etcd, within the lease; the
    /// memory store has no lease and hands over at once). Returns once stopped.
    pub async fn kill(mut self) {
        self.stop.send_replace(Halt::Crash);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

#[cfg(test)]
mod tests;
