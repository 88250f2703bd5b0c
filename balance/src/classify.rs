//! Which calls count against their backend: every response and error is classified as a
//! success, a server fault, a timeout or a transport failure.
//!
//! The balancer acts on the class, not on `Ok` or `Err`:
//! * [`Outcome::Transport`]: the connection is broken. It leaves rotation at once and is
//!   reconnected with backoff (a stand-in serves meanwhile).
//! * [`Outcome::Fault`] and [`Outcome::Timeout`]: the backend answered badly, or too
//!   late, over a connection that works. The connection stays; the call counts toward
//!   outlier ejection (see [`crate::OutlierDetection`]).
//! * [`Outcome::Success`]: the backend did its job, which includes application answers
//!   such as gRPC's `NOT_FOUND` or `INVALID_ARGUMENT`.
//!
//! A [`Classify`] decides. The default, [`TransportErrors`], keeps the behaviour of a
//! plain tower service: a response is a success, an error a transport failure. A gRPC
//! classifier (steady-tonic's) reads `grpc-status` from the headers of a trailers-only
//! response, and otherwise wraps the body to read it from the trailers when the body
//! ends, reporting through a [`Report`].

use std::fmt;
use std::sync::Arc;

/// What one call says about its backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The backend answered (an application error included).
    Success,
    /// The backend answered with a server fault (gRPC `UNAVAILABLE`, `INTERNAL`, ...).
    Fault,
    /// The call ran out of time before the backend answered.
    Timeout,
    /// The connection failed (refused, reset, closed): nothing more can be sent on it.
    Transport,
}

impl Outcome {
    /// Whether the outcome counts as a failure of the backend.
    pub fn is_failure(self) -> bool {
        self != Outcome::Success
    }
}

/// Classifies a backend's responses (`Res`) and errors (`E`).
///
/// Called once per call, on the request path: keep it cheap. The classifier is cloned
/// into every response future, so make it small (`Copy` if possible).
pub trait Classify<Res, E>: Clone + Send + Sync + 'static {
    /// The outcome of `response` when its head tells it; `None` when it is known only at
    /// the end of the response (gRPC's trailers), in which case [`Classify::defer`] is
    /// called with the response.
    fn classify(&self, response: &Res) -> Option<Outcome>;

    /// Returns `response` arranged so that `report` learns its outcome when its end is
    /// seen (for instance with its body wrapped). Called only after `classify` returned
    /// `None`. The default reports a success at once.
    fn defer(&self, response: Res, report: Report) -> Res {
        report.record(Outcome::Success);
        response
    }

    /// The outcome of an error the backend's service returned. The default: a
    /// transport failure.
    fn classify_error(&self, error: &E) -> Outcome {
        let _ = error;
        Outcome::Transport
    }
}

/// The default classifier: every response is a success, every error a transport
/// failure (which takes the connection out of rotation). Right for a service whose
/// errors mean a broken connection and whose responses carry application errors.
#[derive(Debug, Clone, Copy, Default)]
pub struct TransportErrors;

impl<Res, E> Classify<Res, E> for TransportErrors {
    #[inline]
    fn classify(&self, _: &Res) -> Option<Outcome> {
        Some(Outcome::Success)
    }
}

/// Where a deferred outcome goes: the connection the call was made on.
pub(crate) trait OutcomeSink: Send + Sync {
    fn record(&self, outcome: Outcome);
}

/// A handle that reports the outcome of one call whose class was deferred (see
/// [`Classify::defer`]). Record at most once; dropping it without recording reports
/// nothing (a call given up on by its caller says nothing about its backend).
pub struct Report {
    sink: Arc<dyn OutcomeSink>,
}

impl Report {
    pub(crate) fn new(sink: Arc<dyn OutcomeSink>) -> Self {
        Self { sink }
    }

    /// Records the call's outcome on its connection.
    pub fn record(self, outcome: Outcome) {
        self.sink.record(outcome);
    }
}

impl fmt::Debug for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Report").finish_non_exhaustive()
    }
}
