//! The backend's side of steady's keyed routing (Slicer's Slicelet, in our words): what
//! every backend task links to know which slices it holds, count the requests that
//! reached it for keys it does not hold (misroutes), and measure and report its keyed
//! load to the Assigner.
//!
//! * [`Slicelet`]: one task's view of the assignment in force, its counters and its
//!   load meter. Feed it assignments ([`Slicelet::follow`] a
//!   [`steady_proto::watch_assignments`] stream, or [`Slicelet::set_assignment`]).
//! * [`SliceletLayer`] / [`SliceletService`]: the tower layer for the tonic server that
//!   records every keyed request (metadata `x-slice-key` by default) and serves, refuses
//!   or forwards the ones whose key this task does not hold ([`OnMisroute`], with the old
//!   owner's grace period: a handover's last steps).
//! * [`LoadReporter`]: the task [`Slicelet::report_to`] starts, streaming load reports
//!   to the Assigner's `LoadCollector` and reconnecting with backoff.
//! * [`report`]: the [`LoadReport`] itself, validated and bounded, and its wire message.
//! * [`Ownership`], [`SliceChanges`]: for the application, what the task holds and since
//!   which generation without a break ([`Slicelet::held_since`],
//!   [`Slicelet::is_assigned_continuously`]), and the slices it acquires and releases
//!   ([`Slicelet::slice_changes`]), so a cache can load, warm and flush, and never serve an
//!   entry another owner may have overwritten; the ranges it warms before a handover's
//!   switch ([`Warming`]).
//!
//! Inside: `meter` keeps per-slice request counters tied to the assignment in force, a
//! sampled heavy-hitters sketch (`sketch`: Space-Saving), and the reader-side decay that
//! turns them into rates.
//!
//! # Dependencies
//!
//! What every backend binary links must stay small: `steady-slice`, `steady-core`,
//! `steady-proto`, tonic, tower and tokio. No etcd client, no command-line parser, no
//! assigner and no client balancer: `tests/tests/layout.rs` checks it. The control plane
//! (the `Distributor`, the `LoadCollector`, the Assigner service, the stores) is in
//! `steady-slicer`.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use steady_slicelet::Slicelet;
//! use tonic::transport::Endpoint;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! // Backend task 3 of job "users" follows the Distributor's assignments...
//! let slicelet = Slicelet::new(3);
//! let distributor = Endpoint::from_static("http://distributor:50051");
//! slicelet.follow(steady_proto::watch_assignments(distributor, "users", Default::default())?);
//! // ...reports its keyed load to the Assigner every second...
//! let _reporter = slicelet.report_to(Endpoint::from_static("http://assigner:50052"), "users", Duration::from_secs(1));
//! // ...and counts every keyed request its tonic server receives.
//! # let your_services = tonic::service::Routes::default();
//! tonic::transport::Server::builder()
//!     .layer(slicelet.layer())
//!     .add_routes(your_services)
//!     .serve("0.0.0.0:50051".parse()?)
//!     .await?;
//! # Ok(())
//! # }
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub, rust_2018_idioms)]

// Without the `exclusive` feature nothing drives the lease clock or writes a belief (the
// driver is the feature), so those parts are unused but kept: the verdict still reads them.
#[cfg_attr(not(feature = "exclusive"), allow(dead_code))]
mod exclusive;
mod layer;
mod meter;
#[cfg(feature = "metrics")]
mod metrics;
mod misroute;
mod ownership;
pub mod report;
mod reporter;
mod serve;
mod sketch;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::{ArcSwapOption, RefCnt};
use futures_util::{Stream, StreamExt};
use http::HeaderName;
use steady_core::{Backoff, ConfigError};
use steady_proto::DEFAULT_KEY_HEADER;
use steady_slice::{Assignment, SliceKey};
use tonic::transport::Endpoint;

pub use exclusive::KeyHandle;
#[cfg(feature = "exclusive")]
pub use exclusive::{ExclusiveConfig, LeaseHolder};
pub use layer::{SliceletFuture, SliceletLayer, SliceletService};
pub use meter::{MeterConfig, MeterConfigError};
pub use misroute::{ForwardService, OnMisroute};
pub use ownership::{Ownership, SliceChange, SliceChanges, Warming, MAX_RECENT_RELEASES};
pub use report::LoadReport;
pub use reporter::{LoadReporter, MIN_REPORT_INTERVAL};
pub use serve::{AssignmentService, SliceletWatchStream, MAX_SLICELET_WATCHERS};
pub use steady_slice::guard::Consistency;

use exclusive::{Exclusive, Tenure};
use meter::{LoadMeter, MeteredAssignment};
use misroute::{Misroute, MisrouteCounters, MisroutePolicy, Verdict};

#[derive(Debug)]
struct State {
    /// The assignment in force with its per-slice counters: swapped as one.
    assignment: ArcSwapOption<MeteredAssignment>,
    /// Held while an assignment is installed, so that each ownership follows the one
    /// before it (installs are rare: the request path never takes it).
    installs: Mutex<()>,
    /// The ownership of the generation in force, for the application.
    ownership: tokio::sync::watch::Sender<Option<Arc<Ownership>>>,
    keyed: AtomicU64,
    misrouted: AtomicU64,
    misroutes: MisrouteCounters,
    meter: LoadMeter,
    /// In an exclusive job, what the lease protocol lets this task believe.
    exclusive: Option<Exclusive>,
}

/// What one backend task knows of the assignment, its misroute counter, and its load
/// meter.
///
/// Clone it freely; clones share state. Feed it assignments with
/// [`Slicelet::follow`] (e.g. from [`steady_proto::watch_assignments`]) or
/// [`Slicelet::set_assignment`]; put [`Slicelet::layer`] on the tonic server to count
/// every keyed request it receives; read its load with [`Slicelet::load_report`], or
/// stream it to the Assigner's `LoadCollector` with [`Slicelet::report_to`].
///
/// # Load
///
/// Every keyed request is counted against the slice that holds its key in the
/// assignment in force (held by this task or not: a misrouted request is load too, but
/// only held slices are reported), and one in [`MeterConfig::sample_one_in`] feeds a
/// heavy-hitters sketch of keys. The request path does an atomic add on the slice's
/// counter and, when sampled, a short locked update of the sketch; the counts become
/// decayed rates only when a report is made. (Its cost:
/// `docs/benchmarks.md#the-slicelet-per-request-on-the-backend`.)
///
/// Each assignment gets fresh counters, installed with it in one atomic swap, so a
/// request is always counted in the generation it was checked against. Reports are for
/// the generation in force: a request that read the old generation just before a swap
/// (the few in flight at that instant) counts in the old one's counters and is not
/// reported, and the new generation's rates start from its own install (the old one's
/// rates are not carried over: its slices may differ).
#[derive(Debug, Clone)]
pub struct Slicelet {
    task: u32,
    state: Arc<State>,
}

impl Slicelet {
    /// The slicelet of backend task `task`, measuring load with the default
    /// [`MeterConfig`] (half-life 10 s).
    pub fn new(task: u32) -> Self {
        Self::with_meter(task, MeterConfig::default()).expect("the default meter config is valid")
    }

    /// The slicelet of backend task `task`, measuring load as `config` says.
    ///
    /// # Errors
    ///
    /// [`MeterConfigError`] naming the value that cannot be used.
    pub fn with_meter(task: u32, config: MeterConfig) -> Result<Self, MeterConfigError> {
        Self::build(task, config, Consistency::Eventual)
    }

    /// The slicelet of backend task `task` in an exclusive job (see `docs/exclusive.md`):
    /// it believes it owns a key only while the lease protocol says so, which takes
    /// `Slicelet::hold_leases` (feature `exclusive`) on the job's etcd. Until then, and
    /// whenever its lease cannot be renewed in time, it owns nothing: every keyed request
    /// is refused with the misroute status (or forwarded, with [`OnMisroute::Forward`]),
    /// and no [`KeyHandle`] is given. Assignments it is fed ([`Slicelet::follow`],
    /// [`Slicelet::set_assignment`]) count load and name generations in refusals; they
    /// grant nothing.
    pub fn exclusive(task: u32) -> Self {
        Self::build(task, MeterConfig::default(), Consistency::Exclusive)
            .expect("the default meter config is valid")
    }

    /// [`Slicelet::exclusive`] or [`Slicelet::with_meter`], as `consistency` says.
    ///
    /// # Errors
    ///
    /// [`MeterConfigError`] naming the value that cannot be used.
    pub fn build(task: u32, config: MeterConfig, consistency: Consistency) -> Result<Self, MeterConfigError> {
        let state = State {
            assignment: ArcSwapOption::empty(),
            installs: Mutex::new(()),
            ownership: tokio::sync::watch::Sender::new(None),
            keyed: AtomicU64::new(0),
            misrouted: AtomicU64::new(0),
            misroutes: MisrouteCounters::default(),
            meter: LoadMeter::new(config)?,
            exclusive: (consistency == Consistency::Exclusive).then(Exclusive::new),
        };
        Ok(Self { task, state: Arc::new(state) })
    }

    /// The backend task this slicelet speaks for.
    pub fn task(&self) -> u32 {
        self.task
    }

    /// In an exclusive job, the hold its ownership rests on now, as written in etcd
    /// (`None`: it owns nothing, or the job is eventual).
    pub fn hold(&self) -> Option<steady_slice::guard::Hold> {
        self.state.exclusive.as_ref().and_then(|e| e.belief().hold)
    }

    /// The consistency mode it was built for.
    pub fn consistency(&self) -> Consistency {
        if self.state.exclusive.is_some() {
            Consistency::Exclusive
        } else {
            Consistency::Eventual
        }
    }

    /// A handle on `key` if this task owns it now (Slicer's slice key handle): check
    /// [`KeyHandle::is_valid`] before making the effects of work on the key visible.
    /// `None` when it does not own the key (or, in an exclusive job, while its ownership
    /// is in doubt: no lease renewed in time).
    pub fn key_handle(&self, key: SliceKey) -> Option<KeyHandle> {
        let state = self.state.clone();
        match &self.state.exclusive {
            Some(exclusive) => {
                let belief = exclusive.belief();
                let since = belief.held_since(key, tokio::time::Instant::now())?;
                Some(KeyHandle { key, since, tenure: Tenure::Exclusive { state, epoch: belief.epoch } })
            }
            None => {
                let since = self.held_since(key)?;
                Some(KeyHandle { key, since, tenure: Tenure::Eventual { state } })
            }
        }
    }

    /// How it measures load.
    pub fn meter_config(&self) -> MeterConfig {
        self.state.meter.config()
    }

    /// Installs `assignment` if it is newer than the one held; returns whether it was.
    ///
    /// Safe to call from many threads at once: the newest generation offered always
    /// wins, and the generation held never goes down. Costs `O(slices)` (fresh load
    /// counters, 8 bytes per slice).
    pub fn set_assignment(&self, assignment: Assignment) -> bool {
        let newer = |s: &State| {
            s.assignment.load().as_ref().is_none_or(|c| c.assignment.generation() < assignment.generation())
        };
        if !newer(&self.state) {
            return false;
        }
        let _installing = self.state.installs.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if !newer(&self.state) {
            return false;
        }
        if self.state.exclusive.is_some() {
            // Exclusive: an assignment grants nothing; the belief publishes ownership.
            return install_if_newer(
                &self.state.assignment,
                MeteredAssignment::new(assignment, self.task),
                || {},
            );
        }
        let ownership = Ownership::next(self.state.ownership.borrow().as_deref(), &assignment, self.task);
        if !install_if_newer(&self.state.assignment, MeteredAssignment::new(assignment, self.task), || {}) {
            return false;
        }
        self.state.ownership.send_replace(Some(Arc::new(ownership)));
        true
    }

    /// What this task holds in the generation in force, and since when (`None` before
    /// the first assignment). Made when the assignment is installed, off the request path.
    ///
    /// In an exclusive job: what it believes it owns, as last changed by the lease
    /// protocol (the lease's deadline is not applied here: use [`Slicelet::key_handle`]
    /// or [`Slicelet::holds`] to act on a key).
    pub fn ownership(&self) -> Option<Arc<Ownership>> {
        self.state.ownership.borrow().clone()
    }

    /// The generation since which this task has held `key` in every generation it
    /// installed; `None` if it does not hold `key` now (or has no assignment). A skipped
    /// generation breaks continuity (see [`Slicelet::is_assigned_continuously`]).
    ///
    /// In an exclusive job: since when the lease protocol has let it believe it owns `key`
    /// without a break, and `None` while its ownership is in doubt.
    pub fn held_since(&self, key: SliceKey) -> Option<u64> {
        if let Some(exclusive) = &self.state.exclusive {
            return exclusive.belief().held_since(key, tokio::time::Instant::now());
        }
        self.state.ownership.borrow().as_ref().and_then(|o| o.held_since(key))
    }

    /// Whether this task has held `key` without a break since generation `since` (Dicer's
    /// `isAssignedContinuously`): a cache entry for `key` written at generation `since` or
    /// later is still the only copy that anyone wrote. Conservative: when this Slicelet
    /// skipped a generation (5, then 8), it does not know what 6 and 7 said, so keys count
    /// as held since 8.
    pub fn is_assigned_continuously(&self, key: SliceKey, since: u64) -> bool {
        self.held_since(key).is_some_and(|held| held <= since)
    }

    /// The `AssignmentDistributor.Watch` service for `job`, re-serving every assignment
    /// this Slicelet installs, for frontends that watch backends beside the distributor
    /// (`steady_proto::watch_assignments_any`). Add it to the backend's own server:
    /// `Server::builder().add_service(slicelet.assignment_service("users").into_server())`.
    pub fn assignment_service(&self, job: impl Into<String>) -> AssignmentService {
        AssignmentService::new(self.clone(), job.into())
    }

    /// Waits until the assignment in force gives this task no slice (at once if it
    /// holds none): on shutdown, after the task drained, so that it stops only once the
    /// Assigner has moved every slice it held to other tasks and no slice is left without
    /// a serving replica. Bound it with a timeout: an Assigner that is down moves nothing.
    /// Before the first assignment it waits for one.
    pub async fn wait_until_released(&self) {
        let mut installs = self.state.ownership.subscribe();
        // The sender lives in `self.state`: the wait ends only by the condition.
        let _ = installs.wait_for(|o| o.as_ref().is_some_and(|o| o.holds_nothing())).await;
    }

    /// The slice changes (acquired, released) of every generation installed from now on,
    /// starting with what is held now, for the application to load, warm or flush state.
    /// Any number of these may be open; each folds the generations it has not read yet
    /// into one change, so none is lost and memory stays bounded.
    pub fn slice_changes(&self) -> SliceChanges {
        SliceChanges::new(self.state.ownership.subscribe())
    }

    /// Follows an assignment source on a task of its own (invalid items are logged and
    /// skipped; e.g. [`steady_proto::watch_assignments`]).
    pub fn follow<A, E>(&self, source: A) -> tokio::task::JoinHandle<()>
    where
        A: Stream<Item = Result<Assignment, E>> + Send + 'static,
        E: std::fmt::Display,
    {
        let me = self.clone();
        tokio::spawn(async move {
            futures_util::pin_mut!(source);
            while let Some(item) = source.next().await {
                match item {
                    Ok(a) => {
                        me.set_assignment(a);
                    }
                    Err(error) => {
                        tracing::warn!(%error, task = me.task, "slicelet: invalid assignment ignored")
                    }
                }
            }
        })
    }

    /// The generation held (`None` before the first assignment).
    pub fn generation(&self) -> Option<u64> {
        self.state.assignment.load().as_ref().map(|a| a.assignment.generation())
    }

    /// Whether this task holds `key` (`None` before the first assignment). In an
    /// exclusive job: whether it owns `key` now, by the lease protocol.
    pub fn holds(&self, key: SliceKey) -> Option<bool> {
        if let Some(exclusive) = &self.state.exclusive {
            return Some(exclusive.belief().held_since(key, tokio::time::Instant::now()).is_some());
        }
        let a = self.state.assignment.load();
        a.as_ref().map(|a| a.assignment.slice_for(key).replicas().contains(&self.task))
    }

    /// The start keys of the slices this task holds (in an exclusive job, of the key
    /// ranges it owns now).
    pub fn held_slices(&self) -> Vec<SliceKey> {
        if let Some(exclusive) = &self.state.exclusive {
            let belief = exclusive.belief();
            let trusted = belief.clock.as_ref().is_some_and(|c| c.trusted(tokio::time::Instant::now()));
            return if trusted { belief.ownership.held().map(|r| r.start()).collect() } else { Vec::new() };
        }
        let a = self.state.assignment.load();
        a.as_ref()
            .map(|a| {
                let a = &a.assignment;
                a.slices().iter().filter(|s| s.replicas().contains(&self.task)).map(|s| s.start).collect()
            })
            .unwrap_or_default()
    }

    /// Records a request with `key`: counts it, against its slice in the assignment in
    /// force and in the hot-key sketch (when sampled), and counts a misroute if an
    /// assignment is held and does not give the key to this task. Returns whether it
    /// was misrouted.
    #[inline]
    pub fn record(&self, key: SliceKey) -> bool {
        self.state.keyed.fetch_add(1, Ordering::Relaxed);
        let misrouted = self.state.assignment.load().as_ref().is_some_and(|a| !a.count(key, self.task));
        if misrouted {
            self.state.misrouted.fetch_add(1, Ordering::Relaxed);
        }
        self.state.meter.sample(key);
        misrouted
    }

    /// Records a keyed request and decides, under `policy`, whether to serve, refuse or
    /// forward it (see the `misroute` module); `request` is read only for a misroute.
    pub(crate) fn verdict<'p>(
        &self,
        key: SliceKey,
        policy: &'p MisroutePolicy,
        request: impl FnOnce() -> Misroute,
    ) -> Verdict<'p> {
        if let Some(exclusive) = &self.state.exclusive {
            return self.exclusive_verdict(exclusive, key, policy, request);
        }
        if !self.record(key) || !policy.acts() {
            return Verdict::Serve;
        }
        let Some(own) = self.generation() else { return Verdict::Serve };
        let request = request();
        if request.client_generation.is_some_and(|g| g >= own) {
            return Verdict::Serve;
        }
        if !policy.grace.is_zero() {
            let released = self.state.ownership.borrow().as_ref().and_then(|o| o.released_at(key));
            if released.is_some_and(|at| at.elapsed() < policy.grace) {
                self.state.misroutes.in_grace.fetch_add(1, Ordering::Relaxed);
                return Verdict::Serve;
            }
        }
        match &policy.on_misroute {
            OnMisroute::Reject => {
                self.state.misroutes.rejected.fetch_add(1, Ordering::Relaxed);
                Verdict::Reject { generation: own }
            }
            OnMisroute::Forward(service) if !request.forwarded => {
                self.state.misroutes.forwarded.fetch_add(1, Ordering::Relaxed);
                Verdict::Forward(service)
            }
            // Forwarded once already: one hop at most, serve it here.
            OnMisroute::Forward(_) | OnMisroute::Serve => Verdict::Serve,
        }
    }

    /// The verdict of an exclusive job: served only while this task owns the key by the
    /// lease protocol; else refused naming the newest generation it knows (or forwarded
    /// once, with [`OnMisroute::Forward`]). Neither the grace period nor the client's
    /// generation can make it serve a key it does not own.
    fn exclusive_verdict<'p>(
        &self,
        exclusive: &Exclusive,
        key: SliceKey,
        policy: &'p MisroutePolicy,
        request: impl FnOnce() -> Misroute,
    ) -> Verdict<'p> {
        self.record(key);
        if exclusive.belief().held_since(key, tokio::time::Instant::now()).is_some() {
            return Verdict::Serve;
        }
        match &policy.on_misroute {
            OnMisroute::Forward(service) if !request().forwarded => {
                self.state.misroutes.forwarded.fetch_add(1, Ordering::Relaxed);
                Verdict::Forward(service)
            }
            _ => {
                self.state.misroutes.rejected.fetch_add(1, Ordering::Relaxed);
                Verdict::Reject { generation: self.generation().unwrap_or(0) }
            }
        }
    }

    /// Believes exactly `ranges` on `hold` (see the `exclusive` module): the driver's
    /// one way to change what this task owns, published to [`Slicelet::slice_changes`].
    #[cfg(feature = "exclusive")]
    pub(crate) fn believe(
        &self,
        epoch: u64,
        clock: Arc<exclusive::LeaseClock>,
        hold: Option<steady_slice::guard::Hold>,
        generation: u64,
        ranges: &[steady_slice::KeyRange],
    ) {
        let exclusive = self.state.exclusive.as_ref().expect("the driver runs on exclusive slicelets");
        let ownership = exclusive.set(epoch, clock, hold, generation, ranges);
        self.state.ownership.send_replace(Some(ownership));
    }

    /// The key ranges believed now (ascending, touching ones merged).
    #[cfg(feature = "exclusive")]
    pub(crate) fn believed_ranges(&self) -> Vec<steady_slice::KeyRange> {
        self.state.exclusive.as_ref().map(|e| e.belief().ownership.held_merged()).unwrap_or_default()
    }

    /// Believes nothing any more.
    #[cfg(feature = "exclusive")]
    pub(crate) fn forget(&self) {
        if let Some(exclusive) = &self.state.exclusive {
            let ownership = exclusive.forget();
            self.state.ownership.send_replace(Some(ownership));
        }
    }

    /// Misrouted requests refused with the newer generation ([`OnMisroute::Reject`]).
    pub fn misroutes_rejected(&self) -> u64 {
        self.state.misroutes.rejected.load(Ordering::Relaxed)
    }

    /// Misrouted requests forwarded to their key's owner ([`OnMisroute::Forward`]).
    pub fn misroutes_forwarded(&self) -> u64 {
        self.state.misroutes.forwarded.load(Ordering::Relaxed)
    }

    /// Misrouted requests served because this task released their key less than the
    /// grace period ago ([`SliceletLayer::grace`]).
    pub fn misroutes_in_grace(&self) -> u64 {
        self.state.misroutes.in_grace.load(Ordering::Relaxed)
    }

    /// The key ranges this task warms in the generation in force (see [`Warming`]).
    pub fn warming(&self) -> Vec<Warming> {
        self.state.ownership.borrow().as_ref().map(|o| o.warming().to_vec()).unwrap_or_default()
    }

    /// Keyed requests recorded.
    pub fn keyed_requests(&self) -> u64 {
        self.state.keyed.load(Ordering::Relaxed)
    }

    /// Keyed requests whose key this task did not hold.
    pub fn misrouted(&self) -> u64 {
        self.state.misrouted.load(Ordering::Relaxed)
    }

    /// This task's load report for `job` now: the decayed rate of every slice it holds in
    /// the generation in force (ascending by start; the heaviest
    /// [`MAX_REPORTED_SLICES`](crate::report::MAX_REPORTED_SLICES) if it holds more), and
    /// the heaviest keys it served.
    ///
    /// Each call is a tick of the decay: it reads the counters and brings the rates up to
    /// now (a lock held for `O(slices held)`), so calls may come at any intervals; the
    /// request path is never slowed by it beyond that lock's contention with sampled
    /// requests.
    ///
    /// `None` before the first assignment, or when no report could name `job` or this
    /// task (an empty job name or one over `MAX_JOB_NAME_LEN` bytes; a task over
    /// `steady_slice::MAX_TASK`).
    pub fn load_report(&self, job: &str) -> Option<LoadReport> {
        let current = self.state.assignment.load_full()?;
        self.state.meter.report_at(&current, job, self.task, tokio::time::Instant::now())
    }

    /// Streams this task's [`Slicelet::load_report`] for `job` to the `LoadCollector` at
    /// `endpoint` every `interval`, on a task of its own, reconnecting with
    /// [`Backoff::default()`] when the stream breaks (see
    /// [`LoadReporter`]). Must be called within a tokio runtime.
    ///
    /// The reporting stops when the returned [`LoadReporter`] is dropped or stopped.
    pub fn report_to(&self, endpoint: Endpoint, job: impl Into<String>, interval: Duration) -> LoadReporter {
        LoadReporter::spawn(
            self.clone(),
            reporter::Target::plain(endpoint),
            job.into(),
            interval,
            Backoff::default(),
        )
    }

    /// As [`Slicelet::report_to_with_backoff`], over TLS with the settings `tls` holds
    /// when each connection is made: a client identity replaced in it
    /// (`ClientTlsSource::replace`, as rotated certificate files change) is presented
    /// from the next report stream on (the collector's certificate check,
    /// `LoadCollector::authorize_reporters`, sees it then); the stream open keeps the
    /// identity it was opened with. `endpoint` is the collector's `https://` address.
    ///
    /// # Errors
    ///
    /// As [`Slicelet::report_to_with_backoff`].
    #[cfg(feature = "tls")]
    pub fn report_to_tls(
        &self,
        endpoint: Endpoint,
        tls: steady_proto::tls::ClientTlsSource,
        job: impl Into<String>,
        interval: Duration,
        backoff: Backoff,
    ) -> Result<LoadReporter, ConfigError> {
        backoff.validate()?;
        let target = reporter::Target { endpoint, tls: Some(tls) };
        Ok(LoadReporter::spawn(self.clone(), target, job.into(), interval, backoff))
    }

    /// As [`Slicelet::report_to`], reconnecting after `backoff`.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the `backoff` field out of its range (see
    /// [`Backoff::validate`]); nothing is started.
    pub fn report_to_with_backoff(
        &self,
        endpoint: Endpoint,
        job: impl Into<String>,
        interval: Duration,
        backoff: Backoff,
    ) -> Result<LoadReporter, ConfigError> {
        backoff.validate()?;
        Ok(LoadReporter::spawn(
            self.clone(),
            reporter::Target::plain(endpoint),
            job.into(),
            interval,
            backoff,
        ))
    }

    /// A tower layer for the server that records every request's slice key (metadata
    /// `x-slice-key` unless [`SliceletLayer::key_header`] names another, hashed as the
    /// client hashes it).
    pub fn layer(&self) -> SliceletLayer {
        SliceletLayer::new(self.clone(), HeaderName::from_static(DEFAULT_KEY_HEADER))
    }
}

/// Something with a generation, as held in a slicelet's slot.
trait Generation {
    fn generation(&self) -> u64;
}

impl Generation for MeteredAssignment {
    fn generation(&self) -> u64 {
        self.assignment.generation()
    }
}

#[cfg(test)]
impl Generation for Assignment {
    fn generation(&self) -> u64 {
        Assignment::generation(self)
    }
}

/// Puts `assignment` in `slot` if it is newer than what `slot` holds; returns whether
/// it did. `before_swap` runs between each comparison and its swap (a test puts a
/// racing install there).
fn install_if_newer<T: Generation>(
    slot: &ArcSwapOption<T>,
    assignment: T,
    mut before_swap: impl FnMut(),
) -> bool {
    let generation = assignment.generation();
    let new = Some(Arc::new(assignment));
    let mut current = slot.load();
    loop {
        if current.as_ref().is_some_and(|c| c.generation() >= generation) {
            return false;
        }
        before_swap();
        // Swap only if what we compared against is still there: a plain store would let
        // a slower caller overwrite a newer generation installed since its load. When
        // another caller got in first, compare again with what it left.
        let previous = slot.compare_and_swap(&*current, new.clone());
        if RefCnt::as_ptr(&*previous) == RefCnt::as_ptr(&*current) {
            return true;
        }
        current = previous;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::atomic::AtomicBool;
    use std::sync::Barrier;

    /// Generations `1..=n` in an order that depends on `seed` (Fisher-Yates over
    /// SplitMix64), so every round races differently.
    fn shuffled(n: u64, seed: u64) -> Vec<u64> {
        let mut state = seed;
        let mut next = move || {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        let mut out: Vec<u64> = (1..=n).collect();
        for i in (1..out.len()).rev() {
            out.swap(i, (next() % (i as u64 + 1)) as usize);
        }
        out
    }

    /// Races `THREADS` installers over generations `1..=1000` while an observer checks
    /// that the generation held never goes down; returns the generation left.
    ///
    /// The installers get the generations dealt out of `order` round-robin, each in
    /// ascending order, so that nearly every install is newer than what its thread
    /// last saw: the installers stay in step and their compare-then-store windows
    /// overlap all the time (with a plain shuffle only ~log n installs succeed and the
    /// race almost never shows). The shuffle decides which thread gets which.
    fn race(order: &[u64]) -> Option<u64> {
        const THREADS: usize = 2;
        let slicelet = Slicelet::new(0);
        let start = Barrier::new(THREADS + 1);
        let done = AtomicBool::new(false);
        std::thread::scope(|s| {
            let observer = s.spawn(|| {
                start.wait();
                let mut last = 0;
                while !done.load(Ordering::Acquire) {
                    let now = slicelet.generation().unwrap_or(0);
                    assert!(now >= last, "the generation went down from {last} to {now}");
                    last = now;
                }
            });
            let installers: Vec<_> = (0..THREADS)
                .map(|t| {
                    let mut mine: Vec<u64> = order.iter().copied().skip(t).step_by(THREADS).collect();
                    mine.sort_unstable();
                    let (slicelet, start) = (&slicelet, &start);
                    s.spawn(move || {
                        let assignments: Vec<Assignment> =
                            mine.iter().map(|&g| Assignment::single(g, vec![0]).unwrap()).collect();
                        start.wait();
                        for a in assignments {
                            slicelet.set_assignment(a);
                        }
                    })
                })
                .collect();
            for installer in installers {
                installer.join().unwrap();
            }
            done.store(true, Ordering::Release);
            observer.join().unwrap();
        });
        slicelet.generation()
    }

    #[test]
    fn the_newest_generation_wins_when_installs_race() {
        for round in 0..1000 {
            assert_eq!(race(&shuffled(1000, round)), Some(1000), "round {round}: an older generation won");
        }
    }

    #[test]
    fn an_install_that_loses_the_race_leaves_the_newer_generation() {
        let slot = ArcSwapOption::empty();
        let single = |g| Assignment::single(g, vec![0]).unwrap();
        // Generation 5 compares against nothing, then 7 lands before 5 is swapped in.
        let mut racer = Some(single(7));
        let installed = install_if_newer(&slot, single(5), || {
            if let Some(newer) = racer.take() {
                assert!(install_if_newer(&slot, newer, || {}));
            }
        });
        assert!(!installed, "5 is older than the 7 that got in first");
        assert_eq!(slot.load().as_ref().map(|a| a.generation()), Some(7));
        // And a newer one racing an older one: both land, the newer last.
        let mut racer = Some(single(8));
        assert!(install_if_newer(&slot, single(9), || {
            if let Some(older) = racer.take() {
                assert!(install_if_newer(&slot, older, || {}));
            }
        }));
        assert_eq!(slot.load().as_ref().map(|a| a.generation()), Some(9));
    }

    #[test]
    fn every_request_is_counted_in_exactly_one_generation_across_swaps() {
        const PER_THREAD: u64 = 200_000;
        let slicelet = Slicelet::new(0);
        slicelet.set_assignment(Assignment::single(1, vec![0]).unwrap());
        let mut generations = vec![slicelet.state.assignment.load_full().unwrap()];
        let finished = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            for t in 0..2u64 {
                let (slicelet, finished) = (&slicelet, &finished);
                s.spawn(move || {
                    for i in 0..PER_THREAD {
                        slicelet.record(SliceKey(i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ t));
                    }
                    finished.fetch_add(1, Ordering::SeqCst);
                });
            }
            // Swap generations under the recording threads until they are done.
            let mut g = 1;
            while finished.load(Ordering::SeqCst) < 2 {
                g += 1;
                assert!(slicelet.set_assignment(Assignment::single(g, vec![0]).unwrap()));
                generations.push(slicelet.state.assignment.load_full().unwrap());
            }
        });
        let counted: u64 = generations.iter().map(|g| g.counted()).sum();
        let swaps = generations.len() - 1;
        assert_eq!(counted, 2 * PER_THREAD, "lost or double-counted requests across {swaps} swaps");
        assert_eq!(slicelet.keyed_requests(), 2 * PER_THREAD);
        let counting = generations.iter().filter(|g| g.counted() > 0).count();
        assert!(counting >= 2, "the requests spanned {counting} generations: no swap happened under them");
    }

    #[test]
    fn an_older_generation_is_refused() {
        let slicelet = Slicelet::new(0);
        assert!(slicelet.set_assignment(Assignment::single(2, vec![0]).unwrap()));
        assert!(!slicelet.set_assignment(Assignment::single(2, vec![1]).unwrap()));
        assert!(!slicelet.set_assignment(Assignment::single(1, vec![1]).unwrap()));
        assert_eq!((slicelet.generation(), slicelet.holds(SliceKey(0))), (Some(2), Some(true)));
    }
}
