//! [`GrpcClassifier`]: which gRPC calls count against their backend, for steady's
//! outlier ejection (see `steady_balance::OutlierDetection`).
//!
//! A gRPC status arrives in one of two places. A *trailers-only* response (what servers
//! send for most errors) carries `grpc-status` in its headers: the call is classified
//! when the headers arrive, at the cost of one header lookup. Otherwise the status is
//! in the trailers, after the body: the response body is then wrapped (one allocation,
//! as tonic boxes every body anyway) and the outcome is recorded when the trailers
//! pass through it. A body the caller drops before its end records nothing.

use std::error::Error;
use std::fmt;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body as HttpBody, Frame};
use steady_balance::{Classify, Outcome, Report};
use tonic::body::Body;
use tonic::{Code, Status};

/// The codes that count as server faults by default: `UNAVAILABLE`, `INTERNAL`,
/// `UNKNOWN`, `DATA_LOSS`.
pub const DEFAULT_FAULTS: [Code; 4] = [Code::Unavailable, Code::Internal, Code::Unknown, Code::DataLoss];

/// Classifies a tonic channel's calls by their gRPC status.
///
/// * A status in the fault set (by default [`DEFAULT_FAULTS`]) is a server fault: it
///   counts toward the member's ejection, and its connection stays open.
/// * `DEADLINE_EXCEEDED` and `CANCELLED` from a server are timeouts: the server gave up
///   on the call's deadline (a tonic server answers `CANCELLED` when the deadline it
///   read from `grpc-timeout` passes). A caller that cancels a call gets no status from
///   the server, so nothing is recorded for it.
/// * A call that tonic ended at its deadline (`Request::set_timeout`, or the endpoint's
///   `timeout`: tonic's `TimeoutExpired`) is a timeout too. Timeouts count like faults;
///   when every backend times out alike (a deadline too short for all), none stands
///   out and none is ejected.
/// * Every other status is a success for the balancer: `NOT_FOUND`,
///   `INVALID_ARGUMENT`, `FAILED_PRECONDITION`, `PERMISSION_DENIED`, ... are answers
///   about the request, not about the backend, and never eject.
/// * Any other error of the channel is a transport failure: the connection is retired
///   and reconnected with backoff.
/// * A response with an HTTP status other than 200 (a proxy's answer) is classified by
///   the code gRPC maps it to (503 is `UNAVAILABLE`, 404 `UNIMPLEMENTED`, ...).
///
/// ```
/// use steady_tonic::GrpcClassifier;
/// use tonic::Code;
///
/// // Count RESOURCE_EXHAUSTED as a fault too (a backend shedding load).
/// let classifier = GrpcClassifier::default().with_fault(Code::ResourceExhausted);
/// assert!(classifier.is_fault(Code::Unavailable));
/// assert!(!classifier.is_fault(Code::NotFound));
/// ```
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct GrpcClassifier {
    /// Bit `c` set: code `c` is a fault.
    faults: u32,
}

impl Default for GrpcClassifier {
    fn default() -> Self {
        Self::with_faults(DEFAULT_FAULTS)
    }
}

impl fmt::Debug for GrpcClassifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let faults: Vec<Code> = (0..=16).map(Code::from_i32).filter(|c| self.is_fault(*c)).collect();
        f.debug_struct("GrpcClassifier").field("faults", &faults).finish()
    }
}

impl GrpcClassifier {
    /// A classifier for which exactly `faults` are server faults (`OK` never is).
    pub fn with_faults(faults: impl IntoIterator<Item = Code>) -> Self {
        faults.into_iter().fold(Self { faults: 0 }, Self::with_fault)
    }

    /// Adds `code` to the faults (`OK` is ignored).
    pub fn with_fault(mut self, code: Code) -> Self {
        if code != Code::Ok {
            self.faults |= 1 << (code as u32 & 31);
        }
        self
    }

    /// Whether `code` counts as a server fault.
    pub fn is_fault(&self, code: Code) -> bool {
        self.faults & (1 << (code as u32 & 31)) != 0
    }

    fn outcome(&self, code: Code) -> Outcome {
        if self.is_fault(code) {
            Outcome::Fault
        } else if matches!(code, Code::DeadlineExceeded | Code::Cancelled) {
            Outcome::Timeout
        } else {
            Outcome::Success
        }
    }

    /// The outcome a trailers block (or a trailers-only response's headers) carries;
    /// `None` without `grpc-status`.
    fn outcome_in(&self, headers: &HeaderMap) -> Option<Outcome> {
        code_in(headers).map(|code| self.outcome(code))
    }
}

/// The code of the `grpc-status` in a trailers block (or a trailers-only response's
/// headers); `None` without one. An unparsable status is `UNKNOWN`, as gRPC reads it.
pub(crate) fn code_in(headers: &HeaderMap) -> Option<Code> {
    let value = headers.get("grpc-status")?;
    Some(
        std::str::from_utf8(value.as_bytes())
            .ok()
            .and_then(|s| s.parse::<i32>().ok())
            .map_or(Code::Unknown, Code::from_i32),
    )
}

impl<E: Error + 'static> Classify<http::Response<Body>, E> for GrpcClassifier {
    #[inline]
    fn classify(&self, response: &http::Response<Body>) -> Option<Outcome> {
        let status = response.status();
        if status != http::StatusCode::OK {
            return Some(self.outcome(code_of_http(status)));
        }
        self.outcome_in(response.headers())
    }

    fn defer(&self, response: http::Response<Body>, report: Report) -> http::Response<Body> {
        let classifier = *self;
        response.map(|inner| Body::new(Classified { inner, report: Some(report), classifier }))
    }

    fn classify_error(&self, error: &E) -> Outcome {
        let mut next: Option<&(dyn Error + 'static)> = Some(error);
        while let Some(e) = next {
            if e.is::<tonic::TimeoutExpired>() {
                return Outcome::Timeout;
            }
            next = e.source();
        }
        Outcome::Transport
    }
}

/// The gRPC code for a response's non-200 HTTP status (gRPC's HTTP-to-code mapping).
pub(crate) fn code_of_http(status: http::StatusCode) -> Code {
    match status.as_u16() {
        400 => Code::Internal,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::Unimplemented,
        429 | 502 | 503 | 504 => Code::Unavailable,
        _ => Code::Unknown,
    }
}

/// A response body that records its call's outcome when its trailers pass (or it ends
/// without them: gRPC reads that as `INTERNAL`; or fails: a fault).
struct Classified {
    inner: Body,
    report: Option<Report>,
    classifier: GrpcClassifier,
}

impl Classified {
    fn record(&mut self, outcome: Outcome) {
        if let Some(report) = self.report.take() {
            report.record(outcome);
        }
    }
}

impl HttpBody for Classified {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let frame = ready!(Pin::new(&mut self.inner).poll_frame(cx));
        match &frame {
            Some(Ok(frame)) => {
                if let Some(trailers) = frame.trailers_ref() {
                    let outcome = self
                        .classifier
                        .outcome_in(trailers)
                        .unwrap_or(self.classifier.outcome(Code::Internal));
                    self.record(outcome);
                }
            }
            Some(Err(_)) => self.record(Outcome::Fault),
            None => {
                let outcome = self.classifier.outcome(Code::Internal);
                self.record(outcome);
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
