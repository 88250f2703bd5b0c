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
use crate::error::BoxError;

pin_project! {
    /// The response of a balanced request: waits for a ready backend if there was none,
    /// drives the chosen backend's readiness, then its call.
    ///
    /// All its waits (for a ready member, for the chosen member's readiness, across
    /// moves to other members) count against one budget (see `WaitBudget`), and an error
    /// after waiting says how long the request really waited.
    ///
    /// Dropping it cancels the request; the backend's in-flight count drops with it.
    pub struct ResponseFuture<S, Req>
    where
        S: Service<Req>,
    {
        #[pin]
        state: State<S, Req>,
        // A keyed request only ever moves to another replica of its slice (until it
        // falls back to the subset).
        key: Option<SliceKey>,
        // Armed the first time the request waits (never on the fast path).
        budget: Option<WaitBudget>,
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
            redispatches: u8,
            // Wakes the request at its budget's deadline if the backend is not ready.
            deadline: Option<Pin<Box<Sleep>>>,
        },
        Calling { #[pin] call: S::Future, guard: Option<InFlight<S>> },
        Done,
    }
}

impl<S, Req> ResponseFuture<S, Req>
where
    S: Service<Req> + Clone,
{
    /// A request with a chosen endpoint.
    #[inline]
    pub(crate) fn ready(guard: InFlight<S>, req: Req) -> Self {
        let service = guard.endpoint().service.clone();
        let state =
            State::Readying { service, guard: Some(guard), req: Some(req), redispatches: 0, deadline: None };
        Self { state, key: None, budget: None }
    }

    /// A request waiting for an endpoint, within `budget`.
    pub(crate) fn waiting(wait: Wait<S>, req: Req, budget: WaitBudget) -> Self {
        Self { state: State::Waiting { wait, req: Some(req) }, key: None, budget: Some(budget) }
    }

    /// Marks the request as keyed: if its backend cannot take it, it moves only to
    /// another replica of the same slice.
    pub(crate) fn keyed(mut self, key: SliceKey) -> Self {
        self.key = Some(key);
        self
    }
}

impl<S, Req> State<S, Req>
where
    S: Service<Req> + Clone,
{
    /// The request, counted in flight on `endpoint`, waiting for its readiness.
    fn readying(endpoint: Arc<Endpoint<S>>, req: Option<Req>, redispatches: u8) -> Self {
        let guard = InFlight::start(endpoint);
        let service = guard.endpoint().service.clone();
        State::Readying { service, guard: Some(guard), req, redispatches, deadline: None }
    }
}

/// The most times one request moves to another member because the chosen one could
/// not take it (its `poll_ready` failed, so nothing was sent).
const MAX_REDISPATCHES: u8 = 2;

/// Another ready member than `failed` (for a keyed request, another ready replica of
/// its slice), unless the request has moved too often.
fn another_endpoint<S>(
    failed: &Arc<Endpoint<S>>,
    redispatches: u8,
    key: Option<SliceKey>,
) -> Option<Arc<Endpoint<S>>> {
    if redispatches > MAX_REDISPATCHES {
        return None;
    }
    failed.rotation.upgrade()?.another(failed, key)
}

impl<S, Req> Future for ResponseFuture<S, Req>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
{
    type Output = Result<S::Response, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let (key, budget) = (this.key, this.budget);
        let mut state = this.state;
        loop {
            match state.as_mut().project() {
                StateProj::Waiting { wait, req } => {
                    let picked = ready!(wait.as_mut().poll(cx)).map_err(BoxError::from)?;
                    if !picked.keyed {
                        // Fell back to the subset: it may now move like an unkeyed request.
                        *key = None;
                    }
                    let req = req.take();
                    state.set(State::readying(picked.endpoint, req, 0));
                }
                StateProj::Readying { service, guard, req, redispatches, deadline } => {
                    // The member the request leaves, and the error to return if no other
                    // member can take it. Either way nothing was sent, so moving is safe.
                    let (left, give_up): (InFlight<S>, BoxError) = match service.poll_ready(cx) {
                        Poll::Ready(Ok(())) => {
                            let call = service.call(req.take().expect("request taken once"));
                            let guard = guard.take();
                            state.set(State::Calling { call, guard });
                            continue;
                        }
                        Poll::Ready(Err(e)) => {
                            // The backend cannot take requests (its connection is gone).
                            let failed = guard.take().expect("guard held until the call");
                            failed.failed();
                            (failed, e.into())
                        }
                        Poll::Pending => {
                            // Not ready: wait, within the request's one budget.
                            let budget = match budget {
                                Some(budget) => *budget,
                                None => {
                                    let rotation =
                                        guard.as_ref().and_then(|g| g.endpoint().rotation.upgrade());
                                    // No balancer any more: no budget to wait in.
                                    let waits = rotation.map(|r| r.waits());
                                    *budget.insert(waits.map_or_else(WaitBudget::none, |w| {
                                        WaitBudget::start(&w, key.is_some())
                                    }))
                                }
                            };
                            let sleep = deadline
                                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(budget.deadline())));
                            ready!(sleep.as_mut().poll(cx));
                            let stuck = guard.take().expect("guard held until the call");
                            (stuck, budget.exhausted().into())
                        }
                    };
                    let redispatches = *redispatches + 1;
                    match another_endpoint(left.endpoint(), redispatches, *key) {
                        Some(endpoint) => {
                            let req = req.take();
                            state.set(State::readying(endpoint, req, redispatches));
                        }
                        None => {
                            state.set(State::Done);
                            return Poll::Ready(Err(give_up));
                        }
                    }
                }
                StateProj::Calling { call, guard } => {
                    let result = ready!(call.poll(cx));
                    if let Some(g) = guard.as_ref() {
                        match &result {
                            Ok(_) => g.succeeded(),
                            Err(_) => g.failed(),
                        }
                    }
                    state.set(State::Done);
                    return Poll::Ready(result.map_err(Into::into));
                }
                StateProj::Done => panic!("ResponseFuture polled after completion"),
            }
        }
    }
}
