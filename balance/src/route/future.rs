//! The response future of [`crate::Balance`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;
use steady_slice::SliceKey;
use tokio::time::Sleep;
use tower::Service;

use super::endpoint::{Endpoint, InFlight};
use super::wait::{Wait, WaitBudget};
use crate::classify::{Classify, Outcome, Report, TransportErrors};
use crate::error::BoxError;

pin_project! {
    /// The response of a balanced request: waits for a ready backend if there was none,
    /// drives the chosen backend's readiness, then its call.
    ///
    /// All its waits (for a ready member, for the chosen member's readiness, across
    /// moves to other members) count against one budget (see `WaitBudget`), and an error
    /// after waiting says how long the request really waited.
    ///
    /// When the call ends, its outcome is classified by `C` (see [`Classify`]) and
    /// recorded on the member, for outlier ejection.
    ///
    /// Dropping it cancels the request; the backend's in-flight count drops with it.
    pub struct ResponseFuture<S, Req, C = TransportErrors>
    where
        S: Service<Req>,
    {
        #[pin]
        state: State<S, Req>,
        classify: C,
        // A keyed request only ever moves to another replica of its slice (until it
        // falls back to the subset).
        key: Option<SliceKey>,
        // Armed the first time the request waits (never on the fast path).
        budget: Option<WaitBudget>,
        // How often the request moved to another member.
        moves: u8,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, Req>
    where
        S: Service<Req>,
    {
        Waiting { wait: Wait<S>, req: Option<Req> },
        Readying {
            service: S,
            guard: Option<InFlight<S>>,
            req: Option<Req>,
            // Wakes the request at its budget's deadline if the backend is not ready.
            deadline: Option<Pin<Box<Sleep>>>,
        },
        Calling { #[pin] call: S::Future, guard: Option<InFlight<S>> },
        // The call's outcome was returned; `failed` is the member whose call failed, for
        // a resend (see `ResponseFuture::resend`).
        Done { failed: Option<Arc<Endpoint<S>>> },
    }
}

impl<S, Req, C> ResponseFuture<S, Req, C>
where
    S: Service<Req> + Clone,
{
    /// A request with a chosen endpoint.
    #[inline]
    pub(crate) fn ready(guard: InFlight<S>, req: Req, classify: C) -> Self {
        let service = guard.endpoint().service.clone();
        let state = State::Readying { service, guard: Some(guard), req: Some(req), deadline: None };
        Self { state, classify, key: None, budget: None, moves: 0 }
    }

    /// A request waiting for an endpoint, within `budget`.
    pub(crate) fn waiting(wait: Wait<S>, req: Req, budget: WaitBudget, classify: C) -> Self {
        let state = State::Waiting { wait, req: Some(req) };
        Self { state, classify, key: None, budget: Some(budget), moves: 0 }
    }

    /// Marks the request as keyed: if its backend cannot take it, it moves only to
    /// another replica of the same slice (or, with `NoReplicaPolicy::FallBackToSubset`,
    /// to the subset when no other replica is ready).
    pub(crate) fn keyed(mut self, key: SliceKey) -> Self {
        self.key = Some(key);
        self
    }

    /// Never moves the request to another member: if its member cannot take it, the
    /// future fails (a hedged attempt, which must stay off the members its siblings
    /// went to; see [`crate::Balance::call_avoiding`]).
    pub(crate) fn pinned(mut self) -> Self {
        self.moves = MAX_MOVES;
        self
    }

    /// The backend task the request is headed for or was handed to: `None` while it
    /// waits for a ready member, and once it ended. A request moved to another member
    /// (nothing was sent on the first) names the member it moved to. Reads the state,
    /// nothing shared: hedging asks it, the request path never does.
    pub fn task(&self) -> Option<usize> {
        match &self.state {
            State::Readying { guard, .. } | State::Calling { guard, .. } => {
                guard.as_ref().map(|g| g.endpoint().task)
            }
            State::Waiting { .. } | State::Done { .. } => None,
        }
    }

    /// Sends `req` to another member after this future's call failed with an error
    /// that proves the request never reached its backend (a connection that could not be
    /// made, say): `req` must be a copy of the request that call was given. The failed
    /// member was taken out of rotation when its call failed; the request moves as one
    /// refused at readiness does (to another replica of its slice if keyed, at most twice
    /// in all, within the same wait budget). Poll the future again for the new outcome.
    ///
    /// # Errors
    ///
    /// `req` back, and the future stays finished, when the call did not fail, the
    /// request has moved too often, or no other member is ready.
    pub fn resend(self: Pin<&mut Self>, req: Req) -> Result<(), Req> {
        let this = self.project();
        let mut state = this.state;
        let failed = match state.as_mut().project() {
            StateProj::Done { failed } => failed.take(),
            _ => None,
        };
        let Some(failed) = failed else { return Err(req) };
        *this.moves += 1;
        match another_endpoint(&failed, *this.moves, this.key) {
            Some(endpoint) => {
                state.set(State::readying(endpoint, Some(req), this.key.is_some()));
                Ok(())
            }
            None => Err(req),
        }
    }
}

impl<S, Req> State<S, Req>
where
    S: Service<Req> + Clone,
{
    /// The request, counted in flight on `endpoint`, waiting for its readiness.
    fn readying(endpoint: Arc<Endpoint<S>>, req: Option<Req>, keyed: bool) -> Self {
        let guard = InFlight::start(endpoint);
        let guard = if keyed { guard.keyed() } else { guard };
        let service = guard.endpoint().service.clone();
        State::Readying { service, guard: Some(guard), req, deadline: None }
    }
}

/// Classifies a response and records its outcome on the member that answered: at once
/// when its head says it, else through a [`Report`] its end will use.
#[inline]
fn classified<S, Res, E, C>(response: Res, guard: &InFlight<S>, classify: &C) -> Res
where
    S: Send + Sync + 'static,
    C: Classify<Res, E>,
{
    match classify.classify(&response) {
        Some(outcome) => {
            if outcome == Outcome::Success {
                guard.answered();
            }
            guard.endpoint().record(outcome);
            response
        }
        None => {
            guard.answered();
            classify.defer(response, Report::new(guard.endpoint().clone()))
        }
    }
}

/// The most times one request moves to another member because the chosen one could
/// not take it (nothing was sent).
const MAX_MOVES: u8 = 2;

/// Another ready member than `failed` (for a keyed request, another ready replica of
/// its slice, or the subset when the policy falls back: then `key` is cleared), unless
/// the request has moved too often (`moves` counts this move).
fn another_endpoint<S>(
    failed: &Arc<Endpoint<S>>,
    moves: u8,
    key: &mut Option<SliceKey>,
) -> Option<Arc<Endpoint<S>>> {
    if moves > MAX_MOVES {
        return None;
    }
    let picked = failed.rotation()?.another(failed, *key)?;
    if !picked.keyed {
        *key = None;
    }
    Some(picked.endpoint)
}

impl<S, Req, C> Future for ResponseFuture<S, Req, C>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    S: Send + Sync + 'static,
    C: Classify<S::Response, S::Error>,
{
    type Output = Result<S::Response, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let (key, budget, moves, classify) = (this.key, this.budget, this.moves, &*this.classify);
        let mut state = this.state;
        loop {
            match state.as_mut().project() {
                StateProj::Waiting { wait, req } => {
                    let picked = match ready!(wait.as_mut().poll(cx)) {
                        Ok(picked) => picked,
                        Err(error) => {
                            state.set(State::Done { failed: None });
                            return Poll::Ready(Err(error.into()));
                        }
                    };
                    if !picked.keyed {
                        // Fell back to the subset: it may now move like an unkeyed request.
                        *key = None;
                    }
                    let req = req.take();
                    state.set(State::readying(picked.endpoint, req, key.is_some()));
                }
                StateProj::Readying { service, guard, req, deadline } => {
                    // The member the request leaves, and the error to return if no other
                    // member can take it. Either way nothing was sent, so moving is safe.
                    let (left, give_up): (InFlight<S>, BoxError) = match service.poll_ready(cx) {
                        Poll::Ready(Ok(())) => {
                            let guard = guard.take().map(InFlight::sent);
                            let call = service.call(req.take().expect("request taken once"));
                            state.set(State::Calling { call, guard });
                            continue;
                        }
                        Poll::Ready(Err(e)) => {
                            // The backend cannot take requests (its connection is gone).
                            let refused = guard.take().expect("guard held until the call");
                            refused.endpoint().eject();
                            (refused, e.into())
                        }
                        Poll::Pending => {
                            // Not ready: wait, within the request's one budget.
                            let budget = *budget.get_or_insert_with(|| {
                                let endpoint = guard.as_ref().expect("guard held until the call").endpoint();
                                WaitBudget::for_endpoint(endpoint, key.is_some())
                            });
                            let sleep = deadline
                                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(budget.deadline())));
                            ready!(sleep.as_mut().poll(cx));
                            let stuck = guard.take().expect("guard held until the call");
                            (stuck, budget.exhausted().into())
                        }
                    };
                    *moves += 1;
                    match another_endpoint(left.endpoint(), *moves, key) {
                        Some(endpoint) => {
                            let req = req.take();
                            state.set(State::readying(endpoint, req, key.is_some()));
                        }
                        None => {
                            state.set(State::Done { failed: None });
                            return Poll::Ready(Err(give_up));
                        }
                    }
                }
                StateProj::Calling { call, guard } => {
                    let result = ready!(call.poll(cx));
                    let mut failed = None;
                    let result = match (result, guard.as_ref()) {
                        (Ok(response), Some(g)) => Ok(classified(response, g, classify)),
                        (Err(error), Some(g)) => {
                            let outcome = classify.classify_error(&error);
                            g.endpoint().record(outcome);
                            if outcome == Outcome::Transport {
                                failed = Some(g.endpoint().clone());
                            }
                            Err(error)
                        }
                        (result, None) => result,
                    };
                    state.set(State::Done { failed });
                    return Poll::Ready(result.map_err(Into::into));
                }
                StateProj::Done { .. } => panic!("ResponseFuture polled after completion"),
            }
        }
    }
}
