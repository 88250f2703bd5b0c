//! [`SteadyChannel`]: a tonic channel that keeps connections to this frontend's subset
//! of a backend job, balances over them, and routes keyed requests by assignment.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::{Stream, StreamExt};
use http::{HeaderName, HeaderValue};
use steady_balance::{
    Balance, BalanceConfig, BalanceError, BalanceStats, ConfigError, JobView, KeyExtractor, Task,
};
use steady_slice::{Assignment, SliceKey};
use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;
use tonic::body::Body;
use tonic::transport::{Channel, Endpoint};
use tower::{BoxError, Service};

use steady_proto::{DEFAULT_KEY_HEADER, GENERATION_HEADER, MOVED_HEADER};

use crate::classify::GrpcClassifier;
use crate::endpoint::TaskEndpoint;
use crate::health::{with_health, HealthBoard, WatchGuard};
use crate::key_tally::KeyTally;
use crate::replay::{never_sent, replayable, Replay};
use crate::task_names::TaskNames;
use crate::template::{connect, EndpointTemplate};

/// The connection to one member of the subset: a tonic `Channel`, and the member's
/// health watcher when active health checks are on
/// ([`SteadyChannelBuilder::health_checks`]). Cloning it clones the channel.
#[derive(Clone, Debug)]
pub struct MemberChannel {
    channel: Channel,
    _health: Option<Arc<WatchGuard>>,
}

impl Service<http::Request<Body>> for MemberChannel {
    type Response = http::Response<Body>;
    type Error = tonic::transport::Error;
    type Future = tonic::transport::channel::ResponseFuture;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.channel.poll_ready(cx)
    }

    #[inline]
    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        self.channel.call(req)
    }
}

/// Reads a request's slice key: a [`SliceKey`] set in code as a request extension
/// (`request.extensions_mut().insert(key)`) wins; otherwise the metadata entry named
/// by the channel (default `x-slice-key`), hashed with [`SliceKey::of`].
#[derive(Clone, Debug)]
pub struct MetadataKey {
    header: HeaderName,
}

impl KeyExtractor<http::Request<Body>> for MetadataKey {
    #[inline]
    fn slice_key(&self, req: &http::Request<Body>) -> Option<SliceKey> {
        if let Some(key) = req.extensions().get::<SliceKey>() {
            return Some(*key);
        }
        req.headers().get(&self.header).map(|v| SliceKey::of(v.as_bytes()))
    }
}

/// A tonic channel over a frontend's subset of a backend job.
///
/// Generated clients take it directly (`EchoClient::new(channel)`). Clone it freely:
/// clones share connections and routing. It fails fast: when no backend is ready
/// within the configured wait, a call fails with `Unavailable` instead of hanging
/// (tonic's own balanced channel waits forever with no endpoints).
///
/// ```no_run
/// use steady_balance::BalanceConfig;
/// use steady_tonic::SteadyChannel;
/// use tonic::transport::Endpoint;
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let backends: Vec<Endpoint> = (0..100)
///     .map(|i| Endpoint::from_shared(format!("http://backend-{i}:50051")))
///     .collect::<Result<_, _>>()?;
/// // Frontend task 7 keeps 20 connections (its decimal Rocksteadier subset, the default).
/// let channel = SteadyChannel::builder(BalanceConfig::new(7, 20)).from_endpoints(backends)?;
/// // let client = MyServiceClient::new(channel);
/// # let _ = channel;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct SteadyChannel {
    balance: Balance<MemberChannel, MetadataKey, GrpcClassifier>,
    /// The balancer's key extractor: the channel reads each request's key once.
    keys: MetadataKey,
    /// A handle kept by each keyed request in flight, to route it again if its backend
    /// refuses it: one reference count, where a clone of the channel costs several.
    origin: Arc<Origin>,
}

/// What a refused keyed request needs to be routed again: a channel to clone. It also
/// holds what every clone of the channel shares for an A119 server: the keyed requests'
/// tally, and the tasks by name.
struct Origin {
    balance: Balance<MemberChannel, MetadataKey, GrpcClassifier>,
    keys: MetadataKey,
    /// Set once the channel reports its load ([`SteadyChannel::follow_autosharding`]).
    tally: OnceLock<KeyTally>,
    names: TaskNames,
}

impl Origin {
    fn channel(self: Arc<Self>) -> SteadyChannel {
        SteadyChannel { balance: self.balance.clone(), keys: self.keys.clone(), origin: self }
    }
}

/// How long a keyed request refused because its key moved (status `FAILED_PRECONDITION`
/// with [`steady_proto::MOVED_HEADER`]) waits for the channel to follow the generation
/// the backend named, before it is routed again; past it, the refusal is the answer.
pub const MOVED_WAIT: Duration = Duration::from_secs(1);

/// How long a keyed request waits before it is routed again when its backend refused it
/// naming a generation the request was already routed by: in an exclusive job the key's
/// new owner refuses it until it has taken the key over (a few etcd round trips after
/// the assignment is published; see `docs/exclusive.md`). Eventual-mode backends never
/// refuse such a request.
pub const TAKEOVER_WAIT: Duration = Duration::from_millis(20);

/// Marks a request already routed again after a refusal: it is not routed a third time.
#[derive(Debug, Clone, Copy)]
struct Rerouted;

impl fmt::Debug for SteadyChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SteadyChannel").field("subset", &self.balance.stats().subset).finish()
    }
}

/// Configures a [`SteadyChannel`].
#[derive(Debug, Clone)]
pub struct SteadyChannelBuilder {
    config: BalanceConfig,
    key_header: HeaderName,
    classifier: GrpcClassifier,
    /// The service name of active health checks; `None`: off.
    health_service: Option<String>,
    template: EndpointTemplate,
}

impl SteadyChannel {
    /// A builder with the balancer's configuration (frontend index, k, ...).
    pub fn builder(config: BalanceConfig) -> SteadyChannelBuilder {
        SteadyChannelBuilder {
            config,
            key_header: HeaderName::from_static(DEFAULT_KEY_HEADER),
            classifier: GrpcClassifier::default(),
            health_service: None,
            template: EndpointTemplate::default(),
        }
    }

    /// Counters and membership (see [`BalanceStats`]).
    pub fn stats(&self) -> BalanceStats {
        self.balance.stats()
    }

    /// Registers the channel's OpenTelemetry instruments in `meter`, labelled
    /// `grpc.target = target` (feature `metrics`; see `Balance::observe_metrics`): read
    /// when the application's reader collects, nothing added per request.
    #[cfg(feature = "metrics")]
    pub fn observe_metrics(&self, meter: &opentelemetry::metrics::Meter, target: &str) {
        self.balance.observe_metrics(meter, target);
    }

    /// Changes `k` at run time.
    ///
    /// # Errors
    ///
    /// As [`Balance::set_subset_size`]: `k` out of range, which leaves it unchanged.
    pub fn set_subset_size(&self, k: usize) -> Result<(), ConfigError> {
        self.balance.set_subset_size(k)
    }

    /// Tells a zone-aware channel how many frontends each zone has now (see
    /// [`Balance::set_frontend_zones`]).
    pub fn set_frontend_zones(&self, frontends: steady_balance::ZoneSizes) {
        self.balance().set_frontend_zones(frontends);
    }

    /// Follows a source of assignments for keyed routing (e.g. [`crate::watch_assignments`]);
    /// see [`Balance::follow_assignments`].
    pub fn follow_assignments<A, E>(&self, source: A)
    where
        A: Stream<Item = Result<Assignment, E>> + Send + 'static,
        E: Into<BoxError>,
    {
        self.balance.follow_assignments(source);
    }

    /// The underlying balancer.
    pub fn balance(&self) -> &Balance<MemberChannel, MetadataKey, GrpcClassifier> {
        &self.balance
    }
}

impl SteadyChannelBuilder {
    /// Reads slice keys from this metadata entry instead of `x-slice-key`.
    pub fn key_header(mut self, header: HeaderName) -> Self {
        self.key_header = header;
        self
    }

    /// Turns on active health checks (off by default): each member's
    /// `grpc.health.v1.Health/Watch` stream for `service` (`""`: the server as a whole),
    /// on the member's own connection. A member reported anything but `SERVING` is taken
    /// out of rotation as a draining task is (its requests in flight finish, the next
    /// backend in the order stands in) until it reports `SERVING` again. A backend
    /// without the health service is taken as serving. The checks cost one stream per
    /// member and nothing per request.
    pub fn health_checks(mut self, service: impl Into<String>) -> Self {
        self.health_service = Some(service.into());
        self
    }

    /// Classifies calls with `classifier` (which gRPC codes are server faults, for
    /// outlier ejection) instead of [`GrpcClassifier::default`].
    pub fn classifier(mut self, classifier: GrpcClassifier) -> Self {
        self.classifier = classifier;
        self
    }

    /// Connects to every backend with `template`'s settings (TLS, authority, HTTP/2,
    /// timeouts): see [`EndpointTemplate`] for the scheme an address gets, which
    /// settings win, and how a failed handshake is handled.
    pub fn endpoint_template(mut self, template: EndpointTemplate) -> Self {
        self.template = template;
        self
    }

    /// A channel over a fixed job: task `i` at `endpoints[i]`.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] for the first configuration value out of its range (see
    /// `BalanceConfig::validate`).
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub fn from_endpoints(self, endpoints: Vec<Endpoint>) -> Result<SteadyChannel, ConfigError> {
        let (_, views) = watch::channel(JobView::serving(endpoints.into_iter().map(TaskEndpoint)));
        self.from_job(views)
    }

    /// A channel following the job views published on `views` (resizes, drains).
    ///
    /// # Errors
    ///
    /// As [`SteadyChannelBuilder::from_endpoints`].
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub fn from_job(
        self,
        views: watch::Receiver<JobView<TaskEndpoint>>,
    ) -> Result<SteadyChannel, ConfigError> {
        let first = views.borrow().clone();
        self.follow_views(first, WatchStream::new(views))
    }

    /// A channel following job views of `host:port` addresses (or URIs), as a discovery
    /// source publishes them (`steady-discovery`: a static list, DNS, an etcd registry).
    /// An address without a scheme is reached over `http://`, or `https://` when the
    /// [`endpoint_template`](Self::endpoint_template) has TLS. An address that is not a
    /// valid URI is skipped (logged): the balancer sees a hole at its index and the next
    /// backend in the order stands in.
    ///
    /// # Errors
    ///
    /// As [`SteadyChannelBuilder::from_endpoints`].
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub fn from_addresses(
        self,
        views: watch::Receiver<JobView<String>>,
    ) -> Result<SteadyChannel, ConfigError> {
        let template = self.template.clone();
        let first = endpoints_of(views.borrow().clone(), &template);
        self.follow_views(first, WatchStream::new(views).map(move |view| endpoints_of(view, &template)))
    }

    /// A channel following `views`, of which `first` is the current one (known before the
    /// balancer reads it, so that the channel names its tasks from the start).
    fn follow_views(
        self,
        first: JobView<TaskEndpoint>,
        views: impl Stream<Item = JobView<TaskEndpoint>> + Send + 'static,
    ) -> Result<SteadyChannel, ConfigError> {
        let names = TaskNames::default();
        names.update(&first);
        let named = names.clone();
        let views = views.inspect(move |view| named.update(view));
        let board = self.health_service.map(HealthBoard::new);
        // An endpoint without a connect timeout of its own gets the balancer's, so that a
        // reconnection inside tonic's channel gives up as a first connection does.
        let timeout = self.config.connect_timeout;
        let watchers = board.clone();
        let template = self.template;
        let connect = tower::service_fn(move |task: TaskEndpoint| {
            // The template is applied here, per connection attempt, not per view: a view of
            // a thousand tasks builds no TLS configuration until a member connects.
            let endpoint = template.apply(task.0).map(|endpoint| match endpoint.get_connect_timeout() {
                Some(_) => endpoint,
                None => endpoint.connect_timeout(timeout),
            });
            let watchers = watchers.clone();
            async move {
                let endpoint = endpoint?;
                let uri = endpoint.uri().clone();
                let channel = connect(endpoint).await?;
                let health = watchers.map(|board| Arc::new(board.watch(uri, channel.clone())));
                Ok::<_, BoxError>(MemberChannel { channel, _health: health })
            }
        });
        let balance = match board {
            Some(board) => Balance::new(self.config, connect, with_health(views, board))?,
            None => Balance::new(self.config, connect, views)?,
        };
        let keys = MetadataKey { header: self.key_header };
        let balance = balance.with_key_extractor(keys.clone()).with_classifier(self.classifier);
        let origin =
            Arc::new(Origin { balance: balance.clone(), keys: keys.clone(), tally: OnceLock::new(), names });
        Ok(SteadyChannel { balance, keys, origin })
    }
}

/// A view of addresses as a view of endpoints (invalid addresses left out).
fn endpoints_of(view: JobView<String>, template: &EndpointTemplate) -> JobView<TaskEndpoint> {
    let tasks = view
        .tasks
        .iter()
        .filter_map(|(&index, task)| {
            match Endpoint::from_shared(template.uri_of(&task.address)) {
                Ok(endpoint) => Some((
                    index,
                    Task { address: TaskEndpoint(endpoint), state: task.state, locality: task.locality.clone() },
                )),
                Err(error) => {
                    tracing::warn!(index, address = %task.address, %error, "steady channel: invalid backend address skipped");
                    None
                }
            }
        })
        .collect();
    JobView { size: view.size, tasks: std::sync::Arc::new(tasks) }
}

/// Turns the balancer's own errors into the gRPC status a client should see.
fn to_status(error: BoxError) -> BoxError {
    match error.downcast::<BalanceError>() {
        Ok(e) => Box::new(tonic::Status::unavailable(e.to_string())),
        Err(other) => other,
    }
}

/// The response future of a [`SteadyChannel`]: the balancer's, with its own errors
/// turned into `Unavailable` statuses. A call that failed because its backend's
/// connection could not be made (so nothing was sent) moves to another member when its
/// body could be kept (see [`MAX_REPLAY_BYTES`](crate::MAX_REPLAY_BYTES)), as a request
/// refused at readiness does: at most twice, within the same wait budget
/// (`steady_balance::ResponseFuture::resend`). The balancer has ejected the failed
/// member by then, so the next pick avoids it.
///
/// A keyed request its backend refused because the key moved (`FAILED_PRECONDITION`
/// naming a newer generation in [`steady_proto::MOVED_HEADER`]: a Slicelet with
/// `OnMisroute::Reject`) is routed again, once, as soon as the channel follows that
/// generation (at most [`MOVED_WAIT`]); the refusal was sent before any work was done,
/// so the request is not run twice.
pub struct ResponseFuture {
    inner: steady_balance::ResponseFuture<MemberChannel, http::Request<Body>, GrpcClassifier>,
    /// What it takes to send the request again, to another member if this one proves
    /// it never got it, or after a refusal.
    replay: Option<Replay>,
    /// For a keyed request that may be routed again: where to clone a channel from.
    reroute: Option<Arc<Origin>>,
    /// The request routed again after a refusal.
    rerouted: Option<BoxFuture<'static, Result<http::Response<Body>, BoxError>>>,
}

/// The generation a refusal names, if `response` is one (see [`MOVED_HEADER`]).
fn moved_to(response: &http::Response<Body>) -> Option<u64> {
    let headers = response.headers();
    let refused = headers.get("grpc-status").is_some_and(|s| s.as_bytes() == b"9");
    if !refused {
        return None;
    }
    headers.get(MOVED_HEADER)?.to_str().ok()?.parse().ok()
}

impl fmt::Debug for ResponseFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").field("replayable", &self.replay.is_some()).finish_non_exhaustive()
    }
}

impl Future for ResponseFuture {
    type Output = Result<http::Response<Body>, BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Some(rerouted) = &mut self.rerouted {
            return rerouted.as_mut().poll(cx);
        }
        loop {
            // `steady_balance::ResponseFuture<Channel, _>` is `Unpin` (the channel's future
            // is), so it is polled in place.
            let error = match ready!(Pin::new(&mut self.inner).poll(cx)) {
                Ok(response) => {
                    // Refused because the key moved: route it again if it can be.
                    if let Some(generation) = moved_to(&response) {
                        if let (Some(origin), Some(replay)) = (self.reroute.take(), self.replay.take()) {
                            let req = replay.into_request();
                            let mut rerouted = Box::pin(origin.channel().reroute(req, generation, response));
                            let poll = rerouted.as_mut().poll(cx);
                            self.rerouted = Some(rerouted);
                            return poll;
                        }
                    }
                    return Poll::Ready(Ok(response));
                }
                Err(error) => error,
            };
            // The replay stays for a further move: its body is buffered.
            let Some(req) = self.replay.as_ref().filter(|_| never_sent(&*error)).map(Replay::request) else {
                return Poll::Ready(Err(to_status(error)));
            };
            if Pin::new(&mut self.inner).resend(req).is_err() {
                return Poll::Ready(Err(to_status(error)));
            }
            tracing::debug!(%error, "request never sent: moved to another member");
        }
    }
}

impl Service<http::Request<Body>> for SteadyChannel {
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Service::<http::Request<Body>>::poll_ready(&mut self.balance, cx)
    }

    fn call(&mut self, mut req: http::Request<Body>) -> Self::Future {
        let mut reroute = None;
        // The key is read once, here: the routing below gets it, not the request (whose
        // extensions move to its replay).
        let key = self.keys.slice_key(&req);
        if let Some(key) = key {
            self.stamp_generation(&mut req);
            // A request routed again was counted the first time.
            if req.extensions().get::<Rerouted>().is_none() {
                if let Some(tally) = self.origin.tally.get() {
                    tally.record(key);
                }
                reroute = Some(self.origin.clone());
            }
        }
        let replay = replayable(&mut req);
        ResponseFuture { inner: self.balance.call_with_key(req, key), replay, reroute, rerouted: None }
    }
}

impl SteadyChannel {
    /// The tally of keyed requests an A119 server is told of, made (and counting) from
    /// the first call on.
    pub(crate) fn key_tally(&self) -> &KeyTally {
        self.origin.tally.get_or_init(KeyTally::default)
    }

    /// The tasks of the channel's latest job view by name.
    pub(crate) fn task_names(&self) -> &TaskNames {
        &self.origin.names
    }

    /// Tells the backend which generation a keyed request was routed by, so that a
    /// Slicelet can tell a client behind from a misroute.
    fn stamp_generation(&self, req: &mut http::Request<Body>) {
        if let Some(generation) = self.balance.assignment_generation() {
            req.headers_mut().insert(GENERATION_HEADER, HeaderValue::from(generation));
        }
    }

    /// Sends a hedged attempt of a request to a member whose task is not in `avoid`
    /// (see [`Balance::call_avoiding`]): keyed as [`Service::call`] keys it, but never
    /// moved or routed again (another member might be one of `avoid`). `None` when no
    /// such member is ready. The slow path of hedging: `call` is untouched.
    pub(crate) fn call_avoiding(
        &mut self,
        mut req: http::Request<Body>,
        avoid: &[usize],
    ) -> Option<ResponseFuture> {
        if self.keys.slice_key(&req).is_some() {
            self.stamp_generation(&mut req);
        }
        let inner = self.balance.call_avoiding(req, avoid).ok()?;
        Some(ResponseFuture { inner, replay: None, reroute: None, rerouted: None })
    }
}

impl ResponseFuture {
    /// The backend task the request was sent to (see
    /// `steady_balance::ResponseFuture::task`); `None` while it waits for a member, and
    /// once routed again after a refusal.
    pub(crate) fn task(&self) -> Option<usize> {
        match self.rerouted {
            Some(_) => None,
            None => self.inner.task(),
        }
    }
}

impl SteadyChannel {
    /// Routes `req` again once the channel follows `generation` (at most [`MOVED_WAIT`]);
    /// `refusal` is the answer if it does not.
    async fn reroute(
        mut self,
        mut req: http::Request<Body>,
        generation: u64,
        refusal: http::Response<Body>,
    ) -> Result<http::Response<Body>, BoxError> {
        let routed_by: Option<u64> =
            req.headers().get(GENERATION_HEADER).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok());
        if routed_by.is_some_and(|g| g >= generation) {
            // Routed by that generation already: the owner it names is taking over.
            tokio::time::sleep(TAKEOVER_WAIT).await;
        } else if !self.balance.wait_for_generation(generation, MOVED_WAIT).await {
            return Ok(refusal);
        }
        tracing::debug!(generation, "keyed request refused by a former owner: routed again");
        req.extensions_mut().insert(Rerouted);
        std::future::poll_fn(|cx| Service::<http::Request<Body>>::poll_ready(&mut self, cx)).await?;
        self.call(req).await
    }
}
