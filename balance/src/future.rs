//! The response future of [`crate::Balance`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;
use tower::Service;

use crate::endpoint::{Endpoint, InFlight};
use crate::error::{BalanceError, BoxError};

/// The slow path's wait for a ready endpoint.
pub(crate) type Wait<S> = Pin<Box<dyn Future<Output = Result<Arc<Endpoint<S>>, BalanceError>> + Send>>;

pin_project! {
    /// The response of a balanced request: waits for a ready backend if there was none,
    /// drives the chosen backend's readiness, then its call.
    ///
    /// Dropping it cancels the request; the backend's in-flight count drops with it.
    pub struct ResponseFuture<S, Req>
    where
        S: Service<Req>,
    {
        #[pin]
        state: State<S, Req>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, Req>
    where
        S: Service<Req>,
    {
        Waiting { wait: Wait<S>, req: Option<Req> },
        Readying { service: S, guard: Option<InFlight<S>>, req: Option<Req> },
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
        Self { state: State::Readying { service, guard: Some(guard), req: Some(req) } }
    }

    /// A request waiting for an endpoint.
    pub(crate) fn waiting(wait: Wait<S>, req: Req) -> Self {
        Self { state: State::Waiting { wait, req: Some(req) } }
    }
}

impl<S, Req> Future for ResponseFuture<S, Req>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
{
    type Output = Result<S::Response, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProj::Waiting { wait, req } => {
                    let endpoint = ready!(wait.as_mut().poll(cx)).map_err(BoxError::from)?;
                    let guard = InFlight::start(endpoint);
                    let service = guard.endpoint().service.clone();
                    let req = req.take();
                    state.set(State::Readying { service, guard: Some(guard), req });
                }
                StateProj::Readying { service, guard, req } => {
                    if let Err(e) = ready!(service.poll_ready(cx)) {
                        if let Some(g) = guard.as_ref() {
                            g.failed();
                        }
                        state.set(State::Done);
                        return Poll::Ready(Err(e.into()));
                    }
                    let call = service.call(req.take().expect("request taken once"));
                    let guard = guard.take();
                    state.set(State::Calling { call, guard });
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
