//! The client of an A119 server: [`follow_autosharding`], a stream of steady
//! assignments read from one `WatchShardingAssignment` stream after another, each
//! assignment acknowledged, and the client's load per key range reported on the same
//! stream.
//!
//! * [`convert`]: a received assignment as steady's [`Assignment`] ([`to_assignment`]),
//!   endpoint names mapped to task indices ([`EndpointNames`]).
//! * [`report`]: the server's reporting rules, kept inside the client's bounds, and the
//!   load drained from a [`KeyLoadSource`] into one report per interval.

pub mod convert;
pub mod report;

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::SystemTime;

use futures_util::Stream;
use steady_core::{Backoff, ConfigError};
use steady_slice::Assignment;
use steady_subset::prng::SplitMix64;
use tokio::sync::mpsc;
use tonic::{Code, Status, Streaming};

use super::ranges::DEFAULT_METRIC;
use super::reassembly::{bounded, Reassembly, Received, DEFAULT_MAX_ASSIGNMENT_BYTES};
use super::v1::autosharding_service_client::AutoshardingServiceClient;
use super::v1::{
    AssignmentAck, InitialClientConfig, LoadReport, WatchShardingAssignmentRequest,
    WatchShardingAssignmentResponse,
};
use crate::watch::Failure;
use crate::WatchEndpoint;

pub use convert::{decimal_index, to_assignment, EndpointNames, Unroutable};
pub use report::{
    KeyLoadSource, DEFAULT_REPORT_INTERVAL, DEFAULT_REPORT_QUANTUM, MAX_REPORT_INTERVAL, MAX_REPORT_RANGES,
    MAX_REPORT_SPAN, MIN_REPORT_INTERVAL,
};

use report::{Reporter, ReportingRules};

/// How many requests (acks, reports) wait to be sent on one stream before the client
/// waits for the server to read them.
const REQUEST_BUFFER: usize = 8;

/// How often an assignment rejected for endpoint names the client does not know yet is
/// converted again (the client's view of its endpoints may lag the server's).
const UNKNOWN_NAMES_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// How many times such an assignment is converted again before the client gives it up
/// (until the server sends it again on a new stream).
const UNKNOWN_NAMES_TRIES: u32 = 300;

/// How [`follow_autosharding`] follows a server.
///
/// ```
/// use std::sync::Arc;
/// use steady_proto::autosharding::client::AutoshardingConfig;
///
/// let config = AutoshardingConfig {
///     // Endpoints named "backend-<index>".
///     endpoint_names: Some(Arc::new(|name: &str| name.strip_prefix("backend-")?.parse().ok())),
///     ..AutoshardingConfig::default()
/// };
/// # let _ = config;
/// ```
#[derive(Clone)]
pub struct AutoshardingConfig {
    /// The wait before connecting again after a failure (the same as the Watch client's:
    /// growing with failures in a row, with jitter); back to the shortest after an
    /// assignment is accepted.
    pub backoff: Backoff,
    /// The metric load is reported as: `requests` by default, what steady balances.
    pub metric: String,
    /// The most bytes one assignment's chunks may hold in the client, decoded (128 MiB by
    /// default, [`DEFAULT_MAX_ASSIGNMENT_BYTES`]): past it, the assignment is rejected.
    pub max_assignment_bytes: usize,
    /// How endpoint names map to task indices; `None`: names that are decimal indices
    /// ([`decimal_index`]).
    pub endpoint_names: Option<EndpointNames>,
    /// Where the reported load comes from; `None`: the client reports nothing.
    pub load_source: Option<Arc<dyn KeyLoadSource>>,
}

impl Default for AutoshardingConfig {
    fn default() -> Self {
        Self {
            backoff: Backoff::default(),
            metric: DEFAULT_METRIC.to_owned(),
            max_assignment_bytes: DEFAULT_MAX_ASSIGNMENT_BYTES,
            endpoint_names: None,
            load_source: None,
        }
    }
}

impl fmt::Debug for AutoshardingConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AutoshardingConfig")
            .field("backoff", &self.backoff)
            .field("metric", &self.metric)
            .field("max_assignment_bytes", &self.max_assignment_bytes)
            .field("endpoint_names", &self.endpoint_names.as_ref().map(|_| ".."))
            .field("load_source", &self.load_source.as_ref().map(|_| ".."))
            .finish()
    }
}

impl AutoshardingConfig {
    /// Checks every field; the first out of its range is the error.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field: `backoff.*` as [`Backoff::validate`],
    /// `metric` when empty, `max_assignment_bytes` when zero.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.backoff.validate()?;
        if self.metric.is_empty() {
            return Err(ConfigError::new("metric", &self.metric, "a metric's name"));
        }
        if self.max_assignment_bytes == 0 {
            return Err(ConfigError::new("max_assignment_bytes", 0, "at least 1"));
        }
        Ok(())
    }
}

/// An error item of [`follow_autosharding`]'s stream.
#[derive(Debug)]
#[non_exhaustive]
pub enum AutoshardingError {
    /// The client rejected an assignment (its ack said `accepted: false`, with `reason`
    /// as the message): a stale generation, an assignment over the byte bound, no usable
    /// slice, or keys it cannot route ([`Unroutable`]). The stream goes on, and a
    /// balancer counts it and keeps the assignment in force.
    Rejected {
        /// The rejected generation.
        generation: i64,
        /// Why, as the ack said it.
        reason: String,
    },
    /// The server refused the stream with a status that asking again will not change
    /// (see [`follow_autosharding`] for which). This is the stream's last item.
    Refused(Status),
}

impl fmt::Display for AutoshardingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Rejected { generation, reason } => {
                write!(f, "autosharding assignment {generation} rejected: {reason}")
            }
            Self::Refused(status) => write!(
                f,
                "the autosharding server refused the stream for good ({:?}): {}",
                status.code(),
                status.message()
            ),
        }
    }
}

impl std::error::Error for AutoshardingError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Rejected { .. } => None,
            Self::Refused(status) => Some(status),
        }
    }
}

/// Whether a status ending a stream will be the answer to every new one: the target is
/// unknown (`NotFound`), the client may not watch it (`PermissionDenied`), the server
/// has no such RPC (`Unimplemented`), or, before the stream `delivered` any response,
/// the client's first message is wrong (`InvalidArgument`). An `InvalidArgument` after
/// the stream delivered something refuses a later message (a load report the server
/// found invalid, say from a skewed clock, one time too many) and is retried like every
/// other code and every transport failure.
fn refused_for_good(code: Code, delivered: bool) -> bool {
    match code {
        Code::NotFound | Code::PermissionDenied | Code::Unimplemented => true,
        Code::InvalidArgument => !delivered,
        _ => false,
    }
}

/// The assignments of `target` from the A119 server at `endpoint`
/// (`AutoshardingService/WatchShardingAssignment`), as steady assignments for
/// `steady_tonic::SteadyChannel::follow_assignments` (or any `steady_balance::Balance`).
///
/// The client picks a random UUID once and names itself with it on every stream
/// ([`InitialClientConfig`], with the newest generation it accepted, so that the server
/// sends only newer ones). It reassembles each assignment from its chunks
/// ([`Reassembly`]: bounded by [`AutoshardingConfig::max_assignment_bytes`]), converts
/// it ([`to_assignment`]), and acknowledges every one, accepted or not, with the final
/// decision: an assignment the protocol's rules accept may still be rejected by
/// steady's stricter one, **every key routed to at least one task** (A119 lets a client
/// fail the requests of keys without an endpoint; steady does not route by such an
/// assignment). A rejected assignment comes through as [`AutoshardingError::Rejected`]
/// and the one in force stays. Its generation still counts as answered on this stream:
/// the server is not asked for it again, and a newer one is taken.
///
/// An assignment rejected only because some keys have no endpoint but names the client
/// does not know ([`Unroutable::UnknownEndpoints`]: its view of the endpoints lags the
/// server's, as right after a scale-up) is kept and converted again every second (at
/// most 300 times) until a newer one arrives. Once it converts, it comes through as an
/// assignment like any other, with no second ack (the server saw it rejected; the
/// client's load reports tell it where keys go). And while the newest assignment the
/// client took was never converted, a new stream names the newest one that was as its
/// `latest_generation`, so that the server sends its current assignment again.
///
/// With a [`AutoshardingConfig::load_source`], once a stream has the server's
/// [`LoadReportingConfig`](crate::autosharding::v1::LoadReportingConfig), the client drains the source
/// every `load_reporting_interval` (kept within [`MIN_REPORT_INTERVAL`] and
/// [`MAX_REPORT_INTERVAL`]) and reports the load under the server's quantum and
/// resolution ([`aggregate`](crate::autosharding::ranges::aggregate)), as the metric
/// [`AutoshardingConfig::metric`]. The source is drained only when a report is sent:
/// load seen while no stream is open goes in the next report, whatever the stream, as the
/// protocol asks; a report sent just before its stream broke may be lost with it; and a
/// span longer than the server takes (its start threshold, at most [`MAX_REPORT_SPAN`])
/// is dropped.
///
/// When the connection or the stream fails, the client connects again after the
/// [`AutoshardingConfig::backoff`] (with jitter); an assignment cut off mid-way is
/// forgotten, and the next stream sends it whole. The stream ends only when the server
/// ends one with a status that retrying cannot change: `NotFound` (an unknown target),
/// `PermissionDenied`, `Unimplemented` (the endpoint is no A119 server), or
/// `InvalidArgument` before the stream delivered any response (the server refused the
/// client's first message; later, it refuses only some message on the way, and the
/// client connects again). That status comes as a last [`AutoshardingError::Refused`]
/// item.
///
/// The stream is driven by its consumer: acks and reports are sent while it is polled
/// (a balancer polls its source all the time).
///
/// # Errors
///
/// A [`ConfigError`] for the first field of `config` out of its range
/// ([`AutoshardingConfig::validate`]); nothing is started.
pub fn follow_autosharding(
    endpoint: impl Into<WatchEndpoint>,
    target: impl Into<String>,
    config: AutoshardingConfig,
) -> Result<impl Stream<Item = Result<Assignment, AutoshardingError>> + Send + 'static, ConfigError> {
    config.validate()?;
    let follow = Follow::new(endpoint.into(), target.into(), config);
    Ok(futures_util::stream::unfold(follow, |mut follow| async move {
        let item = follow.next_item().await?;
        Some((item, follow))
    }))
}

/// The client between two items of the stream.
struct Follow {
    endpoint: WatchEndpoint,
    target: String,
    client_uuid: String,
    reassembly: Reassembly,
    names: EndpointNames,
    reporter: Option<Reporter>,
    backoff: Backoff,
    rng: SplitMix64,
    /// Failures since the last accepted assignment.
    failures: u32,
    stream: Option<Connected>,
    /// Set once the server refused for good: the stream has ended.
    done: bool,
    /// The newest generation converted to a steady assignment (0: none).
    converted: i64,
    /// The newest assignment, rejected for endpoint names the client does not know yet.
    pending: Option<Pending>,
}

/// An assignment rejected for unknown endpoint names, converted again now and then.
struct Pending {
    received: Received,
    /// When it is converted again.
    next_try: tokio::time::Instant,
    /// How many more times.
    tries_left: u32,
}

/// One open `WatchShardingAssignment` stream.
struct Connected {
    requests: mpsc::Sender<WatchShardingAssignmentRequest>,
    responses: Streaming<WatchShardingAssignmentResponse>,
    /// The server's reporting rules on this stream (`None`: none received yet, so no
    /// report is sent).
    rules: Option<ReportingRules>,
    /// Whether the stream delivered a response.
    delivered: bool,
}

/// What woke the client.
enum Event {
    Response(Result<Option<WatchShardingAssignmentResponse>, Status>),
    ReportDue,
    RetryDue,
}

impl Follow {
    fn new(endpoint: WatchEndpoint, target: String, config: AutoshardingConfig) -> Self {
        let (uuid, seed) = random_uuid();
        Self {
            endpoint,
            target,
            client_uuid: uuid,
            reassembly: Reassembly::new(config.max_assignment_bytes),
            names: config.endpoint_names.unwrap_or_else(|| Arc::new(decimal_index)),
            reporter: config.load_source.map(|source| Reporter::new(source, config.metric)),
            backoff: config.backoff,
            rng: SplitMix64::new(seed),
            failures: 0,
            stream: None,
            done: false,
            converted: 0,
            pending: None,
        }
    }

    async fn next_item(&mut self) -> Option<Result<Assignment, AutoshardingError>> {
        if self.done {
            return None;
        }
        loop {
            let Some(stream) = self.stream.as_mut() else {
                if self.failures > 0 {
                    tokio::time::sleep(self.backoff.delay(self.failures, &mut self.rng)).await;
                }
                match self.open().await {
                    Ok(stream) => {
                        tracing::debug!(target_name = %self.target, latest = self.reassembly.latest_generation(), "following autosharding assignments");
                        self.stream = Some(stream);
                    }
                    Err(Failure::Status(status)) if refused_for_good(status.code(), false) => {
                        return Some(self.refused(status));
                    }
                    Err(error) => {
                        self.failures = self.failures.saturating_add(1);
                        tracing::warn!(target_name = %self.target, %error, failures = self.failures, "cannot open the autosharding stream");
                    }
                }
                continue;
            };
            let due = match (&self.reporter, &stream.rules) {
                (Some(reporter), Some(rules)) => Some(reporter.due(rules)),
                _ => None,
            };
            // Biased: a response is read before a report is sent, so that an assignment
            // is never held back by a report (which may wait a moment: it covers the
            // time up to when it is sent).
            let retry = self.pending.as_ref().map(|p| p.next_try);
            let event = tokio::select! {
                biased;
                response = stream.responses.message() => Event::Response(response),
                () = sleep_until(due) => Event::ReportDue,
                () = sleep_until(retry) => Event::RetryDue,
            };
            let response = match event {
                Event::ReportDue => {
                    self.send_report().await;
                    continue;
                }
                Event::RetryDue => {
                    if let Some(assignment) = self.retry_pending() {
                        return Some(Ok(assignment));
                    }
                    continue;
                }
                Event::Response(Ok(Some(response))) => {
                    stream.delivered = true;
                    response
                }
                Event::Response(Err(status)) if refused_for_good(status.code(), stream.delivered) => {
                    return Some(self.refused(status));
                }
                Event::Response(end) => {
                    let why = end.err().map_or_else(|| "the server ended it".to_owned(), |s| s.to_string());
                    self.broken(&why);
                    continue;
                }
            };
            if let Some(item) = self.take(response).await {
                return Some(item);
            }
        }
    }

    /// Takes one response from the server; an item when it closed an assignment.
    async fn take(
        &mut self,
        response: WatchShardingAssignmentResponse,
    ) -> Option<Result<Assignment, AutoshardingError>> {
        let stream = self.stream.as_mut()?;
        if let Some(config) = response.config {
            let rules = ReportingRules::of(&config);
            tracing::debug!(?rules, "autosharding load reporting rules");
            stream.rules = Some(rules);
        }
        if let Some(chunk) = response.chunk {
            self.reassembly.chunk(chunk);
        }
        let metadata = response.metadata?;
        if self.pending.as_ref().is_some_and(|p| p.received.generation < metadata.generation) {
            // A newer assignment replaces the one waiting for its names.
            self.pending = None;
        }
        let outcome = self.reassembly.finish(metadata);
        let (mut ack, received) = (outcome.ack, outcome.assignment);
        let converted = received.map(|r| {
            let result = to_assignment(&r, &*self.names);
            if let Err(Unroutable::UnknownEndpoints { .. }) = result {
                self.pending = Some(Pending {
                    received: r,
                    next_try: tokio::time::Instant::now() + UNKNOWN_NAMES_RETRY,
                    tries_left: UNKNOWN_NAMES_TRIES,
                });
            }
            result
        });
        let item = match converted {
            Some(Ok(assignment)) => {
                self.converted = ack.generation;
                Ok(assignment)
            }
            Some(Err(unroutable)) => {
                ack.accepted = false;
                ack.error_message = bounded(unroutable.to_string());
                Err(AutoshardingError::Rejected {
                    generation: ack.generation,
                    reason: ack.error_message.clone(),
                })
            }
            None => Err(AutoshardingError::Rejected {
                generation: ack.generation,
                reason: ack.error_message.clone(),
            }),
        };
        if item.is_ok() {
            self.failures = 0;
        }
        self.send(ack_request(ack)).await;
        Some(item)
    }

    /// Converts the assignment waiting for its endpoint names again: the assignment
    /// when it converts now (no second ack: the first said it was rejected); `None`
    /// when it does not, and the next try is in a second, or never after the last.
    fn retry_pending(&mut self) -> Option<Assignment> {
        let pending = self.pending.as_mut()?;
        match to_assignment(&pending.received, &*self.names) {
            Ok(assignment) => {
                tracing::info!(
                    generation = pending.received.generation,
                    "autosharding assignment routable now: followed"
                );
                self.converted = pending.received.generation;
                self.pending = None;
                self.failures = 0;
                Some(assignment)
            }
            Err(unroutable) => {
                pending.tries_left = pending.tries_left.saturating_sub(1);
                if pending.tries_left == 0 {
                    tracing::warn!(generation = pending.received.generation, %unroutable, "autosharding assignment still unroutable: given up");
                    self.pending = None;
                } else {
                    pending.next_try += UNKNOWN_NAMES_RETRY;
                }
                None
            }
        }
    }

    /// Sends the load since the last report, if the stream can take it: the source is
    /// drained only then, so that load waits for a stream rather than being lost.
    async fn send_report(&mut self) {
        let (Some(stream), Some(reporter)) = (self.stream.as_mut(), self.reporter.as_mut()) else { return };
        let Some(rules) = stream.rules else { return };
        let Ok(permit) = stream.requests.reserve().await else {
            self.broken("it no longer takes requests");
            return;
        };
        if let Some(report) = reporter.report(&rules) {
            permit.send(report_request(report));
        }
    }

    /// Sends `request` on the open stream; a stream that no longer takes requests is
    /// broken.
    async fn send(&mut self, request: WatchShardingAssignmentRequest) {
        let Some(stream) = self.stream.as_mut() else { return };
        if stream.requests.send(request).await.is_err() {
            self.broken("it no longer takes requests");
        }
    }

    /// Drops the stream: the next is opened after a backoff, and an assignment it cut
    /// off is forgotten.
    fn broken(&mut self, why: &str) {
        self.stream = None;
        self.reassembly.restart();
        self.failures = self.failures.saturating_add(1);
        tracing::warn!(target_name = %self.target, why, failures = self.failures, "autosharding stream ended: opening another");
    }

    /// The last item, for a stream refused for good.
    fn refused(&mut self, status: Status) -> Result<Assignment, AutoshardingError> {
        tracing::error!(
            target_name = %self.target,
            code = ?status.code(),
            message = status.message(),
            "the autosharding server refused the stream for good: following no more"
        );
        self.stream = None;
        self.done = true;
        Err(AutoshardingError::Refused(status))
    }

    /// Connects and opens a stream, its first request the client's configuration: its
    /// `latest_generation` the newest one converted, so that an assignment taken but
    /// never converted is sent again.
    async fn open(&mut self) -> Result<Connected, Failure> {
        self.reassembly.rewind_to(self.converted);
        let endpoint = self.endpoint.current().map_err(Failure::Transport)?;
        let channel = endpoint.connect().await.map_err(Failure::Transport)?;
        let (requests, mut outgoing) = mpsc::channel(REQUEST_BUFFER);
        let initial = InitialClientConfig {
            target: self.target.clone(),
            client_uuid: self.client_uuid.clone(),
            latest_generation: self.reassembly.latest_generation(),
        };
        requests
            .try_send(WatchShardingAssignmentRequest {
                initial_client_config: Some(initial),
                ..Default::default()
            })
            .expect("an empty buffer has room for the first request");
        let outgoing = futures_util::stream::poll_fn(move |cx| outgoing.poll_recv(cx));
        let responses = AutoshardingServiceClient::new(channel)
            .watch_sharding_assignment(outgoing)
            .await
            .map_err(Failure::Status)?
            .into_inner();
        Ok(Connected { requests, responses, rules: None, delivered: false })
    }
}

fn ack_request(ack: AssignmentAck) -> WatchShardingAssignmentRequest {
    WatchShardingAssignmentRequest { assignment_ack: Some(ack), ..Default::default() }
}

fn report_request(report: LoadReport) -> WatchShardingAssignmentRequest {
    WatchShardingAssignmentRequest { load_report: Some(report), ..Default::default() }
}

/// Sleeps until `at`; forever when there is no `at`.
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A random version-4 UUID in its text form, and a seed for the backoff's jitter. The
/// randomness is the standard library's hasher keys (drawn from the system once per
/// thread) mixed with the time and the process id.
fn random_uuid() -> (String, u64) {
    let nanos = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let word = |i: u64| {
        let mut hasher = RandomState::new().build_hasher();
        hasher.write_u64(i);
        hasher.write_u128(nanos);
        hasher.write_u32(std::process::id());
        hasher.finish()
    };
    let (high, low) = (word(0), word(1));
    // Version 4 (random) and the RFC 9562 variant.
    let high = (high & !0xF000) | 0x4000;
    let low = (low & !(0b11 << 62)) | (0b10 << 62);
    let uuid = format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        high >> 32,
        (high >> 16) & 0xFFFF,
        high & 0xFFFF,
        low >> 48,
        low & 0xFFFF_FFFF_FFFF
    );
    (uuid, high ^ low.rotate_left(17))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_client_uuid_is_a_random_version_4_uuid() {
        let (a, _) = random_uuid();
        let (b, _) = random_uuid();
        assert_ne!(a, b);
        let groups: Vec<usize> = a.split('-').map(str::len).collect();
        assert_eq!(groups, [8, 4, 4, 4, 12], "{a}");
        assert!(a.chars().all(|c| c == '-' || c.is_ascii_hexdigit()), "{a}");
        assert_eq!(&a[14..15], "4", "version 4: {a}");
        assert!("89ab".contains(&a[19..20]), "the variant: {a}");
    }

    #[test]
    fn only_refusals_that_retrying_cannot_change_end_the_stream() {
        for code in [Code::NotFound, Code::PermissionDenied, Code::Unimplemented] {
            assert!(refused_for_good(code, false) && refused_for_good(code, true), "{code:?}");
        }
        assert!(refused_for_good(Code::InvalidArgument, false), "the first message refused");
        assert!(!refused_for_good(Code::InvalidArgument, true), "a later message refused");
        for code in [
            Code::Unavailable,
            Code::ResourceExhausted,
            Code::Internal,
            Code::Unknown,
            Code::DeadlineExceeded,
            Code::Cancelled,
            Code::Aborted,
            Code::Unauthenticated,
            Code::FailedPrecondition,
            Code::Ok,
        ] {
            assert!(!refused_for_good(code, false) && !refused_for_good(code, true), "{code:?}");
        }
    }

    #[tokio::test]
    async fn a_configuration_out_of_range_is_refused_before_following() {
        let nowhere = tonic::transport::Endpoint::from_static("http://127.0.0.1:1");
        let good = AutoshardingConfig::default();
        for (config, field) in [
            (
                AutoshardingConfig {
                    backoff: Backoff { base: Duration::ZERO, ..good.backoff },
                    ..good.clone()
                },
                "backoff.base",
            ),
            (AutoshardingConfig { metric: String::new(), ..good.clone() }, "metric"),
            (AutoshardingConfig { max_assignment_bytes: 0, ..good.clone() }, "max_assignment_bytes"),
        ] {
            let Err(error) = follow_autosharding(nowhere.clone(), "job", config) else {
                panic!("{field} accepted")
            };
            assert_eq!(error.field(), field, "{error}");
        }
        assert!(follow_autosharding(nowhere, "job", good).is_ok());
    }
}
