//! The request side: a cheap-to-clone tower `Service` that reads the routing table.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use steady_slice::{Assignment, SliceKey};
use steady_subset::prng::SplitMix64;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::WatchStream;
use tower::Service;

use crate::classify::{Classify, TransportErrors};
use crate::config::{validate_subset_size, BalanceConfig};
use crate::connector::{Address, Connector};
use crate::control::{Command, Control};
use crate::error::BoxError;
use crate::key::{KeyExtractor, NoKey};
use crate::route::endpoint::InFlight;
use crate::route::future::ResponseFuture;
use crate::route::key_counts::KeyCounts;
use crate::route::pick::{fresh_rng, p2c_where};
use crate::route::table::Shared;
use crate::route::wait::{no_replica, wait_for_endpoint, wait_for_replica, Wait, WaitBudget};
use crate::stats::BalanceStats;
use steady_core::ConfigError;
use steady_core::JobView;
use steady_core::ZoneSizes;

/// Balances requests over a frontend's subset of a backend job.
///
/// A `Balance` is a handle: clone it freely (each clone is one `Arc` and a small
/// random-number state). Every clone reads the same routing table, which a background
/// control task keeps up to date; requests share no lock or queue. When the last
/// clone is dropped the control task stops and closes every connection.
///
/// # Routing
///
/// Each request goes to the less loaded of two random ready members (power of two
/// choices; load is requests in flight, or Peak EWMA latency, see
/// [`crate::Load`]). Nearly equal loads are a tie, which goes to a random one of the two
/// (the tie band: `docs/balancer.md#the-tie-band` has the rule and why). `poll_ready` is
/// always ready: readiness is per backend, and the chosen backend's own `poll_ready` is
/// driven inside the response future.
///
/// # Errors
///
/// * [`BalanceError::NoReadyBackends`](crate::BalanceError::NoReadyBackends) (boxed)
///   when no member is ready and none becomes ready within the request's wait budget
///   ([`BalanceConfig::no_backend_wait`] for all its waits together). A request never
///   hangs.
/// * [`BalanceError::NoReplica`](crate::BalanceError::NoReplica) (boxed) for a keyed
///   request whose replicas are all unusable, when the policy is
///   [`NoReplicaPolicy::Fail`](crate::NoReplicaPolicy::Fail).
/// * The backend's own error, boxed, when its service fails the call. That backend is
///   then taken out of rotation and reconnected with backoff; the next backend in the
///   frontend's order stands in for it meanwhile. A request that the chosen backend
///   could not take (its `poll_ready` failed, or stayed pending past the wait) was not
///   sent, and moves to another member instead (at most twice); so may one whose call
///   failed in a way that proves it unsent, through [`ResponseFuture::resend`].
///
/// # Notes for tower users
///
/// `poll_ready` is always ready: a `Balance` applies no backpressure of its own, and
/// "no backend" shows up in the response future (after the configured wait), not in
/// `poll_ready`. Put a `ConcurrencyLimit` or `LoadShed` in front if you want those.
///
/// Each request calls a clone of the chosen backend's service, after that clone's own
/// `poll_ready`; per-instance state in the backend service (a rate limit, say) is
/// therefore per request. Every call's outcome is classified by `C` (see
/// [`Classify`]): with the default [`TransportErrors`], any error the backend's service
/// returns counts as a transport failure and takes the connection out of rotation, and
/// every response is a success; a classifier that reads the responses (steady-tonic's
/// reads gRPC statuses) lets outlier ejection see server faults
/// ([`crate::OutlierDetection`]).
pub struct Balance<S, K = NoKey, C = TransportErrors> {
    pub(crate) shared: Arc<Shared<S>>,
    commands: mpsc::UnboundedSender<Command>,
    keys: K,
    classify: C,
    rng: SplitMix64,
}

impl<S, K: Clone, C: Clone> Clone for Balance<S, K, C> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
            commands: self.commands.clone(),
            keys: self.keys.clone(),
            classify: self.classify.clone(),
            rng: fresh_rng(),
        }
    }
}

impl<S, K, C> fmt::Debug for Balance<S, K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Balance").field("version", &self.shared.table.load().version).finish()
    }
}

impl<S> Balance<S>
where
    S: Send + Sync + 'static,
{
    /// Starts a balancer: spawns its control task on the current tokio runtime.
    ///
    /// * `connector` makes a connection (the service `S`) to a task's address; a
    ///   `tower::service_fn(|addr| async { ... })` will do. An attempt that errs, takes
    ///   longer than the connect timeout (readiness included) or panics (with
    ///   `panic = "unwind"`, the default) counts as a failed connection: its backend
    ///   backs off and a stand-in serves. Attempts wait for the connector's readiness
    ///   in a queue, so a connector that limits concurrent connects
    ///   (`ConcurrencyLimit`) works, and one that is never ready holds up nothing else.
    /// * `job` yields views of the backend job; each replaces the previous one. When the
    ///   stream ends, the last view stays in force.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] for the first value of `config` out of its range (see
    /// [`BalanceConfig::validate`]); nothing is started.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime (as `tokio::spawn` does).
    pub fn new<T, C, J>(config: BalanceConfig, connector: C, job: J) -> Result<Self, ConfigError>
    where
        T: Address,
        C: Connector<T, S>,
        J: Stream<Item = JobView<T>> + Send + 'static,
    {
        config.validate()?;
        let shared = Arc::new(Shared::new(config.waits()));
        let (commands, command_rx) = mpsc::unbounded_channel();
        let control = Control::new(config, connector, Box::pin(job), command_rx, shared.clone());
        tokio::spawn(control.supervise());
        Ok(Self { shared, commands, keys: NoKey, classify: TransportErrors, rng: fresh_rng() })
    }

    /// A balancer over a fixed list of addresses: task `i` at `addresses[i]`, all serving.
    ///
    /// # Errors
    ///
    /// As [`Balance::new`].
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub fn from_addresses<T, C>(
        config: BalanceConfig,
        connector: C,
        addresses: Vec<T>,
    ) -> Result<Self, ConfigError>
    where
        T: Address,
        C: Connector<T, S>,
    {
        Self::new(config, connector, futures_util::stream::iter([JobView::serving(addresses)]))
    }
}

impl<S, K, C> Balance<S, K, C> {
    /// Routes keyed requests: `keys` reads each request's slice key (a closure
    /// `Fn(&Req) -> Option<SliceKey>` will do). Requests without a key, and every request
    /// before the first assignment arrives, are balanced over the subset.
    pub fn with_key_extractor<K2>(self, keys: K2) -> Balance<S, K2, C> {
        let Self { shared, commands, classify, rng, .. } = self;
        Balance { shared, commands, keys, classify, rng }
    }

    /// Classifies calls with `classify` (see [`Classify`]) instead of the default
    /// [`TransportErrors`].
    pub fn with_classifier<C2>(self, classify: C2) -> Balance<S, K, C2> {
        let Self { shared, commands, keys, rng, .. } = self;
        Balance { shared, commands, keys, classify, rng }
    }

    /// Follows a source of assignments (replacing any previous source). A newer
    /// generation replaces the assignment in force; an older or equal one is ignored
    /// and counted; an error (a [`steady_slice::AssignmentError`] from validation, a
    /// [`steady_slice::DecodeError`] from the wire, or the source's own) is logged,
    /// counted and changes nothing. When the source ends, the last good assignment
    /// stays in force. A source that panics is kept and polled again after a backoff
    /// (100 ms doubling with each panic in a row, up to 10 s, with jitter), counted in
    /// [`BalanceStats::assignment_source_restarts`]; the assignment in force stays
    /// meanwhile.
    pub fn follow_assignments<A, E>(&self, source: A)
    where
        A: Stream<Item = Result<Assignment, E>> + Send + 'static,
        E: Into<BoxError>,
    {
        let source = source.map(|item| item.map_err(Into::into));
        let _ = self.commands.send(Command::Assignments(Box::pin(source)));
    }

    /// Counts this balancer's keyed requests from now on, in `2^bins_log2` bins of the key
    /// space (see [`KeyCounts`]): what an in-process assigner (Rudolph's mode, crate
    /// `steady-local`) makes its assignments from. Every request with a key is counted,
    /// before the first assignment too, at the cost of one relaxed atomic increment.
    /// Asked again, it returns the counts already kept (whatever `bins_log2`).
    ///
    /// # Errors
    ///
    /// [`ConfigError`] unless `1 <= bins_log2 <= 20`.
    pub fn count_keys(&self, bins_log2: u32) -> Result<KeyCounts, ConfigError> {
        if let Some(counts) = self.shared.key_counts.get() {
            return Ok(counts.clone());
        }
        let counts = KeyCounts::new(bins_log2)?;
        Ok(self.shared.key_counts.get_or_init(|| counts).clone())
    }

    /// Follows assignments published on a watch channel (see [`Balance::follow_assignments`]).
    pub fn follow_assignment_watch(&self, assignments: watch::Receiver<Assignment>) {
        self.follow_assignments(WatchStream::new(assignments).map(Ok::<_, BoxError>));
    }

    /// The backend task a request with `key` would be sent to now (`None` when no
    /// backend is ready, or the key's replicas are not connected). Costs one table read,
    /// one slice lookup and one power-of-two choice: the keyed request's pick.
    #[inline]
    pub fn route(&mut self, key: Option<SliceKey>) -> Option<usize> {
        let table = self.shared.table.load();
        if let (Some(key), Some(slices)) = (key, table.slices.as_ref()) {
            return slices.pick(slices.index(key), &mut self.rng).map(|e| e.task);
        }
        table.pick(&mut self.rng).map(|e| e.task)
    }

    /// Changes `k`. The control task opens and closes only what the subset change demands
    /// (for algorithms with a preference order, growing `k` only opens).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] when `subset_size` is not in `1..=MAX_SUBSET_SIZE`; `k` is
    /// then unchanged.
    pub fn set_subset_size(&self, subset_size: usize) -> Result<(), ConfigError> {
        validate_subset_size(subset_size)?;
        // The control task outlives every handle, so the send only fails at shutdown.
        let _ = self.commands.send(Command::SetSubsetSize(subset_size));
        Ok(())
    }

    /// Tells a zone-aware balancer (see [`crate::ZoneRouting`]) how many frontends each
    /// zone has now: each zone's share of the demand, which decides how much of this
    /// frontend's traffic stays in its zone. A frontend following its own job's view
    /// (the registry's) passes `view.zone_sizes()` on every change. Without zone routing
    /// it has no effect.
    pub fn set_frontend_zones(&self, frontends: ZoneSizes) {
        let _ = self.commands.send(Command::SetFrontendZones(frontends));
    }

    /// Counters and current membership. Reads shared atomics; does not wait for the
    /// control task. Requests on draining connections are counted once they close.
    pub fn stats(&self) -> BalanceStats {
        BalanceStats::read(&self.shared)
    }

    /// The generation of the assignment keyed requests are routed by now (`None` before
    /// the first): one table read, cheap enough for every request.
    #[inline]
    pub fn assignment_generation(&self) -> Option<u64> {
        self.shared.table.load().slices.as_ref().map(|s| s.generation)
    }

    /// Waits until keyed requests are routed by generation `generation` or a newer one,
    /// or `timeout` passes; returns whether it happened. A backend that refused a request
    /// because the assignment moved on names the generation to wait for.
    pub fn wait_for_generation(
        &self,
        generation: u64,
        timeout: Duration,
    ) -> impl std::future::Future<Output = bool> + Send + 'static
    where
        S: Send + Sync + 'static,
    {
        let shared = self.shared.clone();
        async move {
            let mut versions = shared.versions.subscribe();
            // Checked now and at each table published (the sender lives in `shared`).
            let reached = versions.wait_for(|_| {
                shared.table.load().slices.as_ref().is_some_and(|s| s.generation >= generation)
            });
            let reached = matches!(tokio::time::timeout(timeout, reached).await, Ok(Ok(_)));
            reached
        }
    }

    /// Waits until the routing table's version is at least `version` (tests, tooling).
    /// Waits forever if the balancer never publishes that version: wrap it in a timeout.
    pub async fn wait_for_version(&self, version: u64) {
        let mut versions = self.shared.versions.subscribe();
        let _ = versions.wait_for(|v| *v >= version).await;
    }

    /// Waits until the routing table has at least `members` ready members that unkeyed
    /// requests go to (a zone-aware balancer's spill zones' included), or `timeout`
    /// passes; returns whether it happened.
    pub async fn wait_for_members(&self, members: usize, timeout: Duration) -> bool {
        let mut versions = self.shared.versions.subscribe();
        let shared = self.shared.clone();
        let ready = async move {
            let _ = versions.wait_for(|_| shared.table.load().unkeyed().count() >= members).await;
        };
        tokio::time::timeout(timeout, ready).await.is_ok()
    }
}

impl<S, K, C> Balance<S, K, C> {
    /// Sends `req` to a ready member whose task is not in `avoid`, now: a hedged
    /// attempt, which must not go where the request's earlier attempts went. A keyed
    /// request (once an assignment is in force) goes to another ready replica of its
    /// slice, never to the subset; an unkeyed one to another member of the subset, or of
    /// a zone requests spill to when the subset has none. The attempt never waits for a
    /// member and never moves to another one (a member that cannot take it fails it).
    ///
    /// The slow path of hedging, apart from [`Service::call`]: it allocates the list of
    /// candidates, records no key count and asks for no affinity connection.
    ///
    /// # Errors
    ///
    /// `req` back when no such member is ready (nothing was sent).
    pub fn call_avoiding<Req>(&mut self, req: Req, avoid: &[usize]) -> Result<ResponseFuture<S, Req, C>, Req>
    where
        S: Service<Req> + Clone + Send + Sync + 'static,
        S::Error: Into<BoxError>,
        K: KeyExtractor<Req>,
        C: Classify<S::Response, S::Error>,
    {
        let table = self.shared.table.load();
        let elsewhere = |e: &crate::route::endpoint::Endpoint<S>| !avoid.contains(&e.task);
        if let (Some(key), Some(slices)) = (self.keys.slice_key(&req), table.slices.as_ref()) {
            let replicas = slices.ready(slices.index(key));
            let Some(endpoint) = p2c_where(replicas, elsewhere, &mut self.rng) else { return Err(req) };
            let guard = InFlight::start(endpoint).keyed();
            return Ok(ResponseFuture::ready(guard, req, self.classify.clone()).keyed(key).pinned());
        }
        // The subset's other members; only when it has none, the zones requests spill to.
        let endpoint = if table.members.iter().any(|e| elsewhere(e)) {
            p2c_where(&table.members, elsewhere, &mut self.rng)
        } else {
            p2c_where(table.unkeyed(), elsewhere, &mut self.rng)
        };
        match endpoint {
            Some(endpoint) => {
                Ok(ResponseFuture::ready(InFlight::start(endpoint), req, self.classify.clone()).pinned())
            }
            None => Err(req),
        }
    }
}

impl<S, K, C, Req> Service<Req> for Balance<S, K, C>
where
    S: Service<Req> + Clone + Send + Sync + 'static,
    S::Error: Into<BoxError>,
    K: KeyExtractor<Req>,
    C: Classify<S::Response, S::Error>,
    Req: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S, Req, C>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    #[inline]
    fn call(&mut self, req: Req) -> Self::Future {
        let key = self.keys.slice_key(&req);
        self.call_with_key(req, key)
    }
}

impl<S, K, C> Balance<S, K, C> {
    /// Sends `req` as [`Service::call`] does, routed by `key` (keyed when `Some`) instead
    /// of what the key extractor would read: for a wrapper that has read the key already
    /// (steady-tonic's channel reads it once, for its own use and the routing's). Call
    /// it as `call`, after `poll_ready` (which is always ready).
    #[inline]
    pub fn call_with_key<Req>(&mut self, req: Req, key: Option<SliceKey>) -> ResponseFuture<S, Req, C>
    where
        S: Service<Req> + Clone + Send + Sync + 'static,
        S::Error: Into<BoxError>,
        C: Classify<S::Response, S::Error>,
        Req: Send + 'static,
    {
        let table = self.shared.table.load();
        if let (Some(key), Some(counts)) = (key, self.shared.key_counts.get()) {
            counts.record(key);
        }
        if let (Some(key), Some(slices)) = (key, table.slices.as_ref()) {
            let slice = slices.index(key);
            if slices.wants_more_replicas(slice) {
                // Once per slice and table: connect the chosen replicas not yet connected.
                let _ = self.commands.send(Command::Affinity(slices.chosen(slice).to_vec()));
            }
            if let Some(endpoint) = slices.pick(slice, &mut self.rng) {
                let guard = InFlight::start(endpoint.clone()).keyed();
                return ResponseFuture::ready(guard, req, self.classify.clone()).keyed(key);
            }
            let budget = WaitBudget::start(&self.shared.waits, true);
            let shared = self.shared.clone();
            let wait: Wait<S> = if slices.servable(slice) {
                wait_for_replica(shared, key, budget)
            } else {
                // No chosen replica serves, or all are backing off: nothing to wait for.
                Box::pin(no_replica(shared, key, budget))
            };
            return ResponseFuture::waiting(wait, req, budget, self.classify.clone()).keyed(key);
        }
        match table.pick(&mut self.rng) {
            Some(endpoint) => {
                ResponseFuture::ready(InFlight::start(endpoint.clone()), req, self.classify.clone())
            }
            None => {
                let budget = WaitBudget::start(&self.shared.waits, false);
                let wait = wait_for_endpoint(self.shared.clone(), budget);
                ResponseFuture::waiting(wait, req, budget, self.classify.clone())
            }
        }
    }
}
