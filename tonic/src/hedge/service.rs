//! [`Hedge`]: a [`SteadyChannel`] that hedges the methods its [`HedgeConfig`] names.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::body::Body;
use tower::{BoxError, Service};

use super::future::{Hedged, ResponseFuture, Shared};
use super::policy::{HedgeConfig, HedgingPolicy};
use super::stats::{stats_of, Counters, HedgeStats};
use crate::channel::SteadyChannel;
use crate::replay::replayable;

/// A [`SteadyChannel`] whose requests to the methods its [`HedgeConfig`] names are
/// hedged (see [`crate::hedge`]); other requests go through the channel untouched.
///
/// Clones share the budget and the counters. Generated clients take it as they take
/// the channel (`EchoClient::new(hedge)`).
///
/// # Errors
///
/// Those of the attempt whose answer is the request's (the channel's: `Unavailable`
/// when no member is ready, the backend's status...). When every attempt ended in a
/// non-fatal code, the last of them is the answer.
#[derive(Clone)]
pub struct Hedge {
    channel: SteadyChannel,
    shared: Arc<Shared>,
}

impl Hedge {
    /// Hedges `channel`'s requests as `config` says, with a budget of its own.
    pub fn new(channel: SteadyChannel, config: HedgeConfig) -> Self {
        let tokens = config.budget.start();
        Self { channel, shared: Arc::new(Shared { config, tokens, counters: Counters::default() }) }
    }

    /// The counters so far.
    pub fn stats(&self) -> HedgeStats {
        stats_of(&self.shared.counters)
    }

    /// The channel requests go through.
    pub fn channel(&self) -> &SteadyChannel {
        &self.channel
    }

    /// The policy of the method at `path`, if it is hedged.
    pub fn policy(&self, path: &str) -> Option<&HedgingPolicy> {
        self.shared.config.policy(path)
    }

    /// Registers the hedge's counters as OpenTelemetry instruments in `meter`
    /// (feature `metrics`), labelled `grpc.target = target`: observable counters read
    /// when the application's reader collects, nothing added per request; once every
    /// clone is dropped they report nothing. `steady.hedge.requests`,
    /// `steady.hedge.extra_attempts`, `steady.hedge.refused_by_budget`,
    /// `steady.hedge.no_other_member`, `steady.hedge.won` (see `docs/hedging.md`).
    #[cfg(feature = "metrics")]
    pub fn observe_metrics(&self, meter: &opentelemetry::metrics::Meter, target: &str) {
        use opentelemetry::KeyValue;
        use steady_core::metrics::Observed;
        let shared = Arc::downgrade(&self.shared);
        let source = move || shared.upgrade().map(|shared| stats_of(&shared.counters));
        Observed::new(meter, vec![KeyValue::new("grpc.target", target.to_owned())], source)
            .counter(
                "steady.hedge.requests",
                "{request}",
                "Requests of hedged methods that could be hedged",
                |s| s.hedged_requests,
            )
            .counter("steady.hedge.extra_attempts", "{attempt}", "Attempts sent after the first", |s| {
                s.extra_attempts
            })
            .counter(
                "steady.hedge.refused_by_budget",
                "{attempt}",
                "Extra attempts the retry budget refused",
                |s| s.refused_by_budget,
            )
            .counter(
                "steady.hedge.no_other_member",
                "{attempt}",
                "Extra attempts not sent: no ready member left that earlier attempts had not gone to",
                |s| s.no_other_member,
            )
            .counter(
                "steady.hedge.won",
                "{request}",
                "Requests answered by an attempt after the first",
                |s| s.hedges_won,
            );
    }
}

impl fmt::Debug for Hedge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let methods: Vec<&str> = self.shared.config.methods.iter().map(|(p, _)| &**p).collect();
        f.debug_struct("Hedge").field("methods", &methods).field("stats", &self.stats()).finish()
    }
}

impl Service<http::Request<Body>> for Hedge {
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Service::<http::Request<Body>>::poll_ready(&mut self.channel, cx)
    }

    fn call(&mut self, mut req: http::Request<Body>) -> Self::Future {
        let Some(policy) = self.shared.config.index(req.uri().path()) else {
            return ResponseFuture::once(self.channel.call(req));
        };
        let Some(spare) = replayable(&mut req) else {
            Counters::add(&self.shared.counters.unbuffered);
            return ResponseFuture::once(self.channel.call(req));
        };
        Counters::add(&self.shared.counters.hedged);
        self.shared.tokens.deposit();
        // Every attempt is made from the replay, the first too: the request's extensions
        // (a slice key set by code, say) moved there.
        let first = self.channel.call(spare.request());
        ResponseFuture::hedged(Hedged::new(first, spare, policy, self.channel.clone(), self.shared.clone()))
    }
}
