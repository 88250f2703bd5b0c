//! What a backend does with a keyed request for a key it does not hold: the misroute
//! policy ([`OnMisroute`]) and the old owner's grace period, decided per request by
//! [`Slicelet::verdict`](crate::Slicelet).
//!
//! A request is misrouted when the assignment in force does not give its key to this task.
//! It is still *served* here when:
//!
//! * the policy is [`OnMisroute::Serve`] (counting it is all that happens);
//! * the client routed it by this task's generation or a newer one (metadata
//!   [`GENERATION_HEADER`](steady_proto::GENERATION_HEADER)): the client either knows
//!   better than this task, or fell back here on purpose because no replica was ready;
//! * this task released the key less than the grace period ago: it was the owner a moment
//!   ago, its state is warm, and clients still on the older generation keep landing here
//!   while the new one spreads;
//! * the policy is [`OnMisroute::Forward`] and the request was already forwarded once
//!   (metadata [`FORWARDED_HEADER`](steady_proto::FORWARDED_HEADER)): one hop at most, so
//!   no loop.
//!
//! Otherwise [`OnMisroute::Reject`] answers `FAILED_PRECONDITION` with this task's
//! generation in [`MOVED_HEADER`](steady_proto::MOVED_HEADER) (a client resends once its
//! assignment is that new: `steady_tonic::SteadyChannel` does it by itself), and
//! [`OnMisroute::Forward`] sends the request on, once, through a client of the same job
//! that routes by key (a `SteadyChannel` following the same assignments).
//!
//! The forwarded mark counts only where the policy forwards. A task that rejects refuses a
//! forwarded request for a key it does not hold like any other: an application chooses
//! `Reject` so that no task answers for a key it does not hold, and a forwarder's mark (or
//! a client that sets the header itself) must not undo that. In a fleet rolling from
//! `Forward` to `Reject`, the refusal travels back through the forwarder to the client,
//! which routes the request again by the generation the refusal names.
//!
//! In an exclusive job (`Slicelet::exclusive`) only the lease protocol decides: a key the
//! task does not own is refused (or forwarded once, never twice), and neither the
//! generation, the grace period nor the forwarded mark makes it serve one.

use std::fmt;
use std::time::Duration;

use tonic::body::Body;
use tower::util::BoxCloneSyncService;
use tower::BoxError;

/// The service a backend forwards misrouted requests through: a client of its own job
/// that routes by key (typically a `steady_tonic::SteadyChannel` following the same
/// assignments), boxed.
pub type ForwardService = BoxCloneSyncService<http::Request<Body>, http::Response<Body>, BoxError>;

/// What a backend does with a keyed request whose key it does not hold (and that none of
/// the exceptions in the module documentation lets it serve).
#[derive(Clone, Default)]
#[non_exhaustive]
pub enum OnMisroute {
    /// Serve it anyway (the default): the request is counted as misrouted, nothing else.
    #[default]
    Serve,
    /// Answer `FAILED_PRECONDITION` naming this task's generation in
    /// [`steady_proto::MOVED_HEADER`], so the client routes it again once it has that
    /// generation.
    Reject,
    /// Send it, once, through this service to the key's owner, and answer with what the
    /// owner answers. A forwarded request carries [`steady_proto::FORWARDED_HEADER`] and
    /// is never forwarded again. A failure to forward is answered `UNAVAILABLE`.
    Forward(ForwardService),
}

impl OnMisroute {
    /// Forward through `service` (see [`OnMisroute::Forward`]).
    pub fn forward<S>(service: S) -> Self
    where
        S: tower::Service<http::Request<Body>, Response = http::Response<Body>>
            + Clone
            + Send
            + Sync
            + 'static,
        S::Error: Into<BoxError>,
        S::Future: Send + 'static,
    {
        use tower::ServiceExt;
        Self::Forward(ForwardService::new(service.map_err(Into::into)))
    }
}

impl fmt::Debug for OnMisroute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Serve => "Serve",
            Self::Reject => "Reject",
            Self::Forward(_) => "Forward",
        })
    }
}

/// What the layer does with one keyed request.
#[derive(Clone, Copy)]
pub(crate) enum Verdict<'a> {
    /// Pass it to the service.
    Serve,
    /// Refuse it: the key moved on in `generation`.
    Reject { generation: u64 },
    /// Send it to the key's owner through this service.
    Forward(&'a ForwardService),
}

/// The facts about one request the verdict depends on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Misroute {
    /// The generation the client routed by, if it said.
    pub(crate) client_generation: Option<u64>,
    /// Whether a backend forwarded it already.
    pub(crate) forwarded: bool,
}

/// The counters of what misrouted requests became.
#[derive(Debug, Default)]
pub(crate) struct MisrouteCounters {
    pub(crate) rejected: std::sync::atomic::AtomicU64,
    pub(crate) forwarded: std::sync::atomic::AtomicU64,
    pub(crate) in_grace: std::sync::atomic::AtomicU64,
}

/// How a misrouted request's fate is decided, configured on the layer.
#[derive(Debug, Clone, Default)]
pub(crate) struct MisroutePolicy {
    pub(crate) on_misroute: OnMisroute,
    pub(crate) grace: Duration,
}

impl MisroutePolicy {
    /// Whether requests need their metadata read at all (anything but plain serving).
    pub(crate) fn acts(&self) -> bool {
        !matches!(self.on_misroute, OnMisroute::Serve)
    }
}
