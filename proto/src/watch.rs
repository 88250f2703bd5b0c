//! The client side of assignment distribution over gRPC: a stream that watches a
//! distributor and reconnects, ending only when the distributor refuses the watch for
//! good. (The server, the `Distributor`, is in `steady-slicer`.)

use std::fmt;

use futures_util::{Stream, StreamExt};
use steady_core::{Backoff, ConfigError};
use steady_slice::{Assignment, AssignmentError};
use steady_subset::prng::SplitMix64;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Endpoint;
use tonic::{Code, GrpcMethod, Response, Status, Streaming};

use crate::assignment::WatchRequest;
use crate::encoded::{SERVICE, WATCH};
use crate::update::WatchCodec;

/// What a Watch stream yields: each message read straight into a validated assignment
/// ([`crate::decode_update`]), or the problem with it.
type Updates = Streaming<Result<Assignment, AssignmentError>>;

/// An error item of [`watch_assignments`]'s stream.
#[derive(Debug)]
#[non_exhaustive]
pub enum WatchError {
    /// A received assignment failed validation. The stream goes on: a balancer counts
    /// and rejects it and keeps the last good one.
    Invalid(AssignmentError),
    /// The distributor refused the watch with a status that will not change by asking
    /// again (see [`watch_assignments`] for which). This is the stream's last item.
    Refused(Status),
}

impl fmt::Display for WatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Invalid(error) => write!(f, "invalid assignment received: {error}"),
            Self::Refused(status) => write!(
                f,
                "the distributor refused the watch for good ({:?}): {}",
                status.code(),
                status.message()
            ),
        }
    }
}

impl std::error::Error for WatchError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Invalid(error) => Some(error),
            Self::Refused(status) => Some(status),
        }
    }
}

impl From<AssignmentError> for WatchError {
    fn from(error: AssignmentError) -> Self {
        Self::Invalid(error)
    }
}

/// Whether a status refusing a watch will be the answer to every retry of the same
/// request: the request itself is wrong (`InvalidArgument`: a job name the server does
/// not accept), or the server has no such RPC (`Unimplemented`: the endpoint is not a
/// distributor). Every other code may pass (`Unavailable`, `ResourceExhausted`: too many
/// watchers for now, `PermissionDenied` and `Unauthenticated`: the server's policy may
/// be changed while the client runs, ...), and is retried.
fn refused_for_good(code: Code) -> bool {
    matches!(code, Code::InvalidArgument | Code::Unimplemented)
}

/// Where a watch connects: an [`Endpoint`] and, with the `tls` feature, TLS settings
/// that may be replaced while it runs (`tls::ClientTlsSource`), read afresh at
/// each connection. An `Endpoint` converts into one (its own TLS settings, if any, fixed
/// for the watch's life).
///
/// A watch keeps its stream for as long as the distributor keeps it: a replaced client
/// identity is presented from the next connection (after the stream or the connection
/// broke), and a stream open before the rotation stays open.
///
/// ```
/// # #[cfg(feature = "tls")]
/// # fn example(tls: steady_proto::tls::ClientTlsSource) -> Result<(), Box<dyn std::error::Error>> {
/// use steady_proto::WatchEndpoint;
/// use tonic::transport::Endpoint;
///
/// let target = WatchEndpoint::new(Endpoint::from_static("https://slicer.example:7070")).tls(tls);
/// let assignments = steady_proto::watch_assignments(target, "users", Default::default())?;
/// # drop(assignments);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct WatchEndpoint {
    endpoint: Endpoint,
    #[cfg(feature = "tls")]
    tls: Option<crate::tls::ClientTlsSource>,
}

impl WatchEndpoint {
    /// A watch of `endpoint`, with the TLS settings it carries (if any).
    pub fn new(endpoint: Endpoint) -> Self {
        Self {
            endpoint,
            #[cfg(feature = "tls")]
            tls: None,
        }
    }

    /// Connects with the settings `tls` holds at each connection (they replace the
    /// endpoint's own).
    #[cfg(feature = "tls")]
    #[must_use]
    pub fn tls(mut self, tls: crate::tls::ClientTlsSource) -> Self {
        self.tls = Some(tls);
        self
    }

    /// The endpoint for the next connection, with the TLS settings in force now.
    pub(crate) fn current(&self) -> Result<Endpoint, tonic::transport::Error> {
        #[cfg(feature = "tls")]
        if let Some(tls) = &self.tls {
            return tls.apply(self.endpoint.clone());
        }
        Ok(self.endpoint.clone())
    }
}

impl From<Endpoint> for WatchEndpoint {
    fn from(endpoint: Endpoint) -> Self {
        Self::new(endpoint)
    }
}

/// The assignments of `job` from the distributor at `endpoint` (a `steady_slicer::Distributor`,
/// or any server of `AssignmentDistributor.Watch`), as a
/// stream for `steady_tonic::SteadyChannel::follow_assignments` (or any
/// `steady_balance::Balance`).
///
/// It connects, watches, and when the connection or the stream fails, reconnects after
/// `backoff` (with jitter), asking only for generations newer than the last it
/// received. Invalid assignments come through as [`WatchError::Invalid`], so that the
/// balancer counts and rejects them and keeps the last good one.
///
/// It ends only when the distributor refuses the watch with a status that retrying
/// cannot change: `InvalidArgument` (e.g. a job name the `Distributor` does not
/// accept: empty, or over `steady_core::MAX_JOB_NAME_LEN` bytes) or `Unimplemented`
/// (the endpoint serves no `AssignmentDistributor.Watch`). That status comes as a last
/// [`WatchError::Refused`] item, then the stream ends (a balancer following it logs
/// and counts the error, and keeps the last good assignment). Any other status, and
/// every transport failure, is retried with backoff, forever.
///
/// # Errors
///
/// A [`ConfigError`] naming the `backoff` field out of its range (see
/// [`Backoff::validate`]); nothing is started.
pub fn watch_assignments(
    endpoint: impl Into<WatchEndpoint>,
    job: impl Into<String>,
    backoff: Backoff,
) -> Result<impl Stream<Item = Result<Assignment, WatchError>> + Send + 'static, ConfigError> {
    backoff.validate()?;
    let job = job.into();
    let seed = steady_subset::hash::mix64(job.len() as u64 ^ std::process::id() as u64);
    let state = State {
        endpoint: endpoint.into(),
        job,
        known: 0,
        stream: None,
        failures: 0,
        rng: SplitMix64::new(seed),
        backoff,
        done: false,
    };
    Ok(futures_util::stream::unfold(state, |mut s| async move {
        if s.done {
            return None;
        }
        loop {
            if s.failures > 0 && s.stream.is_none() {
                tokio::time::sleep(s.backoff.delay(s.failures, &mut s.rng)).await;
            }
            let stream = match s.stream.as_mut() {
                Some(stream) => stream,
                None => {
                    let request = WatchRequest { job: s.job.clone(), known_generation: s.known };
                    match open(&s.endpoint, request).await {
                        Ok(stream) => {
                            tracing::debug!(job = %s.job, known = s.known, "watching assignments");
                            s.stream.insert(stream)
                        }
                        Err(Failure::Status(status)) if refused_for_good(status.code()) => {
                            return Some(s.refused(status));
                        }
                        Err(error) => {
                            s.failures = s.failures.saturating_add(1);
                            tracing::warn!(job = %s.job, %error, failures = s.failures, "cannot watch assignments");
                            continue;
                        }
                    }
                }
            };
            match stream.message().await {
                Ok(Some(update)) => {
                    s.failures = 0;
                    let result = update.map_err(WatchError::Invalid);
                    if let Ok(a) = &result {
                        s.known = s.known.max(a.generation());
                    }
                    return Some((result, s));
                }
                Err(status) if refused_for_good(status.code()) => return Some(s.refused(status)),
                Ok(None) | Err(_) => {
                    tracing::warn!(job = %s.job, "assignment stream ended: reconnecting");
                    s.stream = None;
                    s.failures = s.failures.saturating_add(1);
                }
            }
        }
    }))
}

/// The assignments of `job` from whichever of `endpoints` has the newest: the
/// distributor and any number of backends whose Slicelets serve the assignment they hold
/// (`steady_slicelet::Slicelet::assignment_service`), so a frontend keeps up, and a new
/// one starts, while the distributor is unreachable.
///
/// Each endpoint is watched as [`watch_assignments`] watches one (reconnecting with
/// `backoff`, on its own); the stream yields an assignment only when its generation is
/// newer than every one yielded before, so the same generation arriving from several
/// endpoints comes through once. Invalid assignments come through as
/// [`WatchError::Invalid`]; an endpoint that refuses the watch for good yields its
/// [`WatchError::Refused`] and is watched no more, and the stream ends when every
/// endpoint has.
///
/// # Errors
///
/// A [`ConfigError`] for no endpoint at all, or as [`watch_assignments`] for `backoff`;
/// nothing is started.
pub fn watch_assignments_any<E: Into<WatchEndpoint>>(
    endpoints: impl IntoIterator<Item = E>,
    job: impl Into<String>,
    backoff: Backoff,
) -> Result<impl Stream<Item = Result<Assignment, WatchError>> + Send + 'static, ConfigError> {
    let job = job.into();
    let watches = endpoints
        .into_iter()
        .map(|endpoint| watch_assignments(endpoint, job.clone(), backoff).map(Box::pin))
        .collect::<Result<Vec<_>, _>>()?;
    if watches.is_empty() {
        return Err(ConfigError::new("endpoints", 0, "at least one endpoint"));
    }
    let mut newest = 0u64;
    Ok(futures_util::stream::select_all(watches).filter_map(move |item| {
        let keep = match &item {
            Ok(a) if a.generation() <= newest => false,
            Ok(a) => {
                newest = a.generation();
                true
            }
            Err(_) => true,
        };
        std::future::ready(keep.then_some(item))
    }))
}

/// The watch between two items of the stream.
struct State {
    endpoint: WatchEndpoint,
    job: String,
    known: u64,
    stream: Option<Updates>,
    failures: u32,
    rng: SplitMix64,
    backoff: Backoff,
    /// Set once the watch was refused for good: the stream has ended.
    done: bool,
}

impl State {
    /// The last item, for a watch refused for good.
    fn refused(mut self, status: Status) -> (Result<Assignment, WatchError>, Self) {
        tracing::error!(
            job = %self.job,
            code = ?status.code(),
            message = status.message(),
            "the distributor refused the watch for good: watching no more"
        );
        self.stream = None;
        self.done = true;
        (Err(WatchError::Refused(status)), self)
    }
}

/// Connects to `endpoint` and calls Watch, as the generated client does, but with a codec
/// that reads each message straight into an assignment (the generated one reads it into
/// prost's messages first, several times its size: see [`crate::decode_update`]).
async fn open(endpoint: &WatchEndpoint, request: WatchRequest) -> Result<Updates, Failure> {
    let endpoint = endpoint.current().map_err(Failure::Transport)?;
    let channel = endpoint.connect().await.map_err(Failure::Transport)?;
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| Failure::Status(Status::unknown(format!("Service was not ready: {e}"))))?;
    let mut request = tonic::Request::new(request);
    request.extensions_mut().insert(GrpcMethod::new(SERVICE, "Watch"));
    grpc.server_streaming(request, PathAndQuery::from_static(WATCH), WatchCodec)
        .await
        .map(Response::into_inner)
        .map_err(Failure::Status)
}

/// Why a stream (a Watch, an A119 stream) could not be opened.
pub(crate) enum Failure {
    Transport(tonic::transport::Error),
    Status(Status),
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Transport(error) => write!(f, "{error}"),
            Self::Status(status) => write!(f, "{status}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A `Backoff` out of range is refused when the watch is asked for, naming its field:
    /// before, the stream was built, and the first reconnection of one as extreme as
    /// `Duration::MAX` panicked inside it (in `Backoff::delay`), which a balancer
    /// following it took for the source's end.
    #[tokio::test]
    async fn a_backoff_out_of_range_is_refused_before_watching() {
        let nowhere = Endpoint::from_static("http://127.0.0.1:1");
        let good = Backoff::default();
        for (backoff, field) in [
            (Backoff { base: Duration::ZERO, ..good }, "backoff.base"),
            (Backoff { base: Duration::MAX, max: Duration::MAX, jitter: 0.0 }, "backoff.base"),
            (Backoff { max: Duration::from_millis(1), ..good }, "backoff.max"),
            (Backoff { jitter: f64::NAN, ..good }, "backoff.jitter"),
            (Backoff { jitter: -0.5, ..good }, "backoff.jitter"),
        ] {
            let Err(error) = watch_assignments(nowhere.clone(), "job", backoff) else {
                panic!("{backoff:?} accepted");
            };
            assert_eq!(error.field(), field, "{backoff:?}: {error}");
        }
        assert!(watch_assignments(nowhere, "job", good).is_ok());
    }

    #[test]
    fn only_refusals_that_retrying_cannot_change_end_the_watch() {
        for code in [Code::InvalidArgument, Code::Unimplemented] {
            assert!(refused_for_good(code), "{code:?}");
        }
        for code in [
            Code::Unavailable,
            Code::ResourceExhausted,
            Code::Internal,
            Code::Unknown,
            Code::DeadlineExceeded,
            Code::Cancelled,
            Code::Aborted,
            Code::PermissionDenied,
            Code::Unauthenticated,
            Code::NotFound,
            Code::FailedPrecondition,
        ] {
            assert!(!refused_for_good(code), "{code:?}");
        }
    }
}
