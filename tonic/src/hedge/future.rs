//! The response future of a [`super::Hedge`]: the channel's own for a request sent
//! once, or a race of attempts for a hedged one.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::time::{Instant, Sleep};
use tonic::body::Body;
use tonic::Code;
use tower::BoxError;

use super::budget::Tokens;
use super::policy::HedgeConfig;
use super::stats::Counters;
use crate::channel::{ResponseFuture as ChannelFuture, SteadyChannel};
use crate::replay::Replay;

/// The response of a [`super::Hedge`]'s request: the channel's response future
/// itself for a request sent once; for a hedged one, the first answer of its attempts
/// that is not a non-fatal status (see [`super::HedgingPolicy`]).
///
/// Dropping it cancels every attempt still out (each attempt's member sees its
/// in-flight count drop, its server sees the stream reset).
pub struct ResponseFuture {
    kind: Kind,
}

// The request sent once keeps the channel's future inline, as the channel returns it:
// boxing it would cost every unhedged request an allocation; the race is the one boxed.
#[allow(clippy::large_enum_variant)]
enum Kind {
    Once(ChannelFuture),
    Hedged(Box<Hedged>),
}

impl ResponseFuture {
    pub(crate) fn once(future: ChannelFuture) -> Self {
        Self { kind: Kind::Once(future) }
    }

    pub(crate) fn hedged(hedged: Hedged) -> Self {
        Self { kind: Kind::Hedged(Box::new(hedged)) }
    }
}

impl fmt::Debug for ResponseFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Once(future) => f.debug_tuple("ResponseFuture::Once").field(future).finish(),
            Kind::Hedged(hedged) => f
                .debug_struct("ResponseFuture::Hedged")
                .field("sent", &hedged.sent)
                .field("out", &hedged.out.len())
                .field("tried", &hedged.tried)
                .finish_non_exhaustive(),
        }
    }
}

impl Future for ResponseFuture {
    type Output = Result<http::Response<Body>, BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.kind {
            // The channel's future is `Unpin`: polled in place.
            Kind::Once(future) => Pin::new(future).poll(cx),
            Kind::Hedged(hedged) => hedged.poll(cx),
        }
    }
}

/// What a hedge's clones and their requests' races share: the configuration, the
/// budget and the counters.
pub(crate) struct Shared {
    pub(crate) config: HedgeConfig,
    pub(crate) tokens: Tokens,
    pub(crate) counters: Counters,
}

/// One attempt out: its number (0 is the first) and its future.
struct Attempt {
    number: u32,
    future: ChannelFuture,
}

/// The race of a hedged request's attempts.
pub(crate) struct Hedged {
    /// The attempts still out.
    out: Vec<Attempt>,
    /// The tasks attempts went to (read from each attempt while it is out).
    tried: Vec<usize>,
    /// Attempts sent, the first included.
    sent: u32,
    /// What the next attempt is made of (the head and the buffered body); `None` once no
    /// attempt will follow (the most sent, the budget refused, no other member).
    spare: Option<Replay>,
    /// When the next attempt goes if none has answered.
    next_at: Pin<Box<Sleep>>,
    /// The last non-fatal outcome: the answer if no attempt does better.
    last: Option<Result<http::Response<Body>, BoxError>>,
    channel: SteadyChannel,
    shared: Arc<Shared>,
    /// The index of the method's policy in the configuration.
    policy: usize,
}

impl Hedged {
    /// The race of a request whose first attempt is `first`; `spare` makes the others.
    pub(crate) fn new(
        first: ChannelFuture,
        spare: Replay,
        policy: usize,
        channel: SteadyChannel,
        shared: Arc<Shared>,
    ) -> Self {
        let delay = shared.config.methods[policy].1.delay();
        let mut tried = Vec::with_capacity(super::policy::MAX_ATTEMPTS as usize);
        tried.extend(first.task());
        Self {
            out: vec![Attempt { number: 0, future: first }],
            tried,
            sent: 1,
            spare: Some(spare),
            next_at: Box::pin(tokio::time::sleep(delay)),
            last: None,
            channel,
            shared,
            policy,
        }
    }

    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<http::Response<Body>, BoxError>> {
        loop {
            // Tasks first: an attempt's member is known while it is out (it may move to
            // another member before it is sent, if the first could not take it).
            for attempt in &self.out {
                if let Some(task) = attempt.future.task().filter(|t| !self.tried.contains(t)) {
                    self.tried.push(task);
                }
            }
            let mut now = false;
            let mut i = 0;
            while i < self.out.len() {
                let Poll::Ready(result) = Pin::new(&mut self.out[i].future).poll(cx) else {
                    i += 1;
                    continue;
                };
                let attempt = self.out.swap_remove(i);
                let policy = &self.shared.config.methods[self.policy].1;
                if code_of(&result).is_some_and(|code| policy.is_non_fatal(code)) {
                    // gRFC A6: a non-fatal status sends the next attempt at once.
                    self.last = Some(result);
                    now = true;
                    continue;
                }
                if attempt.number > 0 {
                    Counters::add(&self.shared.counters.hedges_won);
                }
                // The answer: the other attempts are cancelled now (dropped), not when
                // the caller drops this future.
                self.out.clear();
                self.spare = None;
                return Poll::Ready(result);
            }
            if self.spare.is_some() && (now || self.next_at.as_mut().poll(cx).is_ready()) {
                self.send_next();
                // Poll the new attempt (or find there is none) from the top.
                continue;
            }
            if self.out.is_empty() {
                // Every attempt ended in a non-fatal code, and none follows: the last is
                // the answer.
                return Poll::Ready(self.last.take().expect("an attempt ended"));
            }
            return Poll::Pending;
        }
    }

    /// Sends the next attempt to a member none of the earlier ones went to, if the
    /// policy, the budget and the members allow; else sends none from now on.
    fn send_next(&mut self) {
        let policy = &self.shared.config.methods[self.policy].1;
        let counters = &self.shared.counters;
        let Some(spare) = self.spare.as_ref() else { return };
        if self.sent >= policy.max_attempts() {
            self.spare = None;
            return;
        }
        if !self.shared.tokens.withdraw() {
            Counters::add(&counters.refused_by_budget);
            self.spare = None;
            return;
        }
        // The spare's body is buffered: a request of it costs its header map.
        let req = spare.request();
        let Some(future) = self.channel.call_avoiding(req, &self.tried) else {
            // Nothing was sent: the withdrawal is not given back (tower's budget has no
            // refund), so a request with no other member spends at most one.
            Counters::add(&counters.no_other_member);
            self.spare = None;
            return;
        };
        Counters::add(&counters.extra_attempts);
        self.tried.extend(future.task());
        self.out.push(Attempt { number: self.sent, future });
        self.sent += 1;
        let delay = policy.delay();
        self.next_at.as_mut().reset(Instant::now() + delay);
        tracing::trace!(attempt = self.sent, tried = ?self.tried, "hedged attempt sent");
    }
}

/// The gRPC code an attempt's outcome ends in, when it is already known: an error's
/// (a failure with no status counts as `UNAVAILABLE`, as gRPC's clients map transport
/// failures), or a trailers-only response's status. `None` for a response whose head
/// carries no status: a real answer, which the request commits to (gRFC A6).
fn code_of(result: &Result<http::Response<Body>, BoxError>) -> Option<Code> {
    match result {
        Ok(response) => {
            let status = response.headers().get("grpc-status")?;
            Some(
                status
                    .to_str()
                    .ok()
                    .and_then(|s| s.parse::<i32>().ok())
                    .map_or(Code::Unknown, Code::from_i32),
            )
        }
        Err(error) => {
            Some(error.downcast_ref::<tonic::Status>().map_or(Code::Unavailable, tonic::Status::code))
        }
    }
}
