//! [`SliceletLayer`] and [`SliceletService`]: the server side's hook that records every
//! keyed request on a [`Slicelet`] and applies the misroute policy.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{HeaderName, HeaderValue};
use http_body_util::Either;
use steady_proto::autosharding::{key_from_header, KEY_HEADER};
use steady_proto::{FORWARDED_HEADER, GENERATION_HEADER, MOVED_HEADER};
use steady_slice::SliceKey;
use tonic::body::Body;
use tower::{BoxError, Layer, Service, ServiceExt};

use super::misroute::{Misroute, MisroutePolicy, OnMisroute, Verdict};
use super::Slicelet;

/// Records the slice key of every request on a [`Slicelet`] and decides what becomes of
/// misrouted ones (see [`Slicelet::layer`]; by default they are served).
///
/// The key is read from the key header (`x-slice-key`, hashed), or, when a request has
/// none, from the binary header `x-slice-key-bin` that clients of gRPC's autosharding
/// protocol send (the 8-byte slice key itself: `steady_proto::autosharding::keys`). A
/// request with neither, or with an unreadable binary key, is served and not recorded.
///
/// ```
/// use std::time::Duration;
/// use steady_slicelet::{OnMisroute, Slicelet};
///
/// let slicelet = Slicelet::new(3);
/// // Refuse requests for keys that moved away (the client routes them again), except for
/// // two seconds after each move, while clients catch up with the new generation.
/// let layer = slicelet.layer().on_misroute(OnMisroute::Reject).grace(Duration::from_secs(2));
/// // tonic::transport::Server::builder().layer(layer).add_service(...)
/// # let _ = layer;
/// ```
#[derive(Debug, Clone)]
pub struct SliceletLayer {
    slicelet: Slicelet,
    header: HeaderName,
    policy: MisroutePolicy,
}

impl SliceletLayer {
    pub(super) fn new(slicelet: Slicelet, header: HeaderName) -> Self {
        Self { slicelet, header, policy: MisroutePolicy::default() }
    }

    /// Reads slice keys from this metadata entry instead of `x-slice-key`: set it to what
    /// the clients' `SteadyChannelBuilder::key_header` names.
    pub fn key_header(mut self, header: HeaderName) -> Self {
        self.header = header;
        self
    }

    /// What to do with a request for a key this task does not hold (default
    /// [`OnMisroute::Serve`]); see the exceptions in [`OnMisroute`]'s module.
    pub fn on_misroute(mut self, on_misroute: OnMisroute) -> Self {
        self.policy.on_misroute = on_misroute;
        self
    }

    /// For `grace` after this task releases a key range, requests for it are still
    /// served whatever [`on_misroute`](Self::on_misroute) says: the old owner keeps
    /// answering while the new generation reaches every client (default zero).
    pub fn grace(mut self, grace: Duration) -> Self {
        self.policy.grace = grace;
        self
    }
}

impl<S> Layer<S> for SliceletLayer {
    type Service = SliceletService<S>;

    fn layer(&self, inner: S) -> SliceletService<S> {
        SliceletService {
            inner,
            slicelet: self.slicelet.clone(),
            header: self.header.clone(),
            policy: self.policy.clone(),
        }
    }
}

/// A server-side service that records keyed requests on its [`Slicelet`] (misroute
/// check, per-slice load, hot-key sketch: [`Slicelet::record`]), then serves, refuses or
/// forwards the misrouted ones as its [`OnMisroute`] says. Responses it makes itself
/// (a refusal, a forwarded answer) are the right side of its `Either` body.
#[derive(Debug, Clone)]
pub struct SliceletService<S> {
    inner: S,
    slicelet: Slicelet,
    header: HeaderName,
    policy: MisroutePolicy,
}

impl<S, B, R> Service<http::Request<B>> for SliceletService<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = http::Response<Either<R, Body>>;
    type Error = S::Error;
    type Future = SliceletFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        let key = match req.headers().get(&self.header) {
            Some(value) => SliceKey::of(value.as_bytes()),
            // A client of gRPC's autosharding protocol sends the slice key itself.
            None => match req.headers().get(KEY_HEADER).and_then(|v| key_from_header(v.as_bytes())) {
                Some(key) => key,
                None => return SliceletFuture::inner(self.inner.call(req)),
            },
        };
        let headers = req.headers();
        let verdict = self.slicelet.verdict(key, &self.policy, || Misroute {
            client_generation: headers
                .get(GENERATION_HEADER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok()),
            forwarded: headers.contains_key(FORWARDED_HEADER),
        });
        match verdict {
            Verdict::Serve => SliceletFuture::inner(self.inner.call(req)),
            Verdict::Reject { generation } => {
                let mut status = tonic::Status::failed_precondition(format!(
                    "steady: task {} does not hold this key in generation {generation}; route it again",
                    self.slicelet.task()
                ));
                status.metadata_mut().insert(MOVED_HEADER, generation.into());
                SliceletFuture::answer(status.into_http())
            }
            Verdict::Forward(forward) => {
                req.headers_mut().insert(FORWARDED_HEADER, HeaderValue::from_static("1"));
                let forward = forward.clone().oneshot(req.map(Body::new));
                SliceletFuture::forward(Box::pin(async move {
                    forward.await.unwrap_or_else(|error| {
                        tonic::Status::unavailable(format!(
                            "steady: forwarding to the key's owner failed: {error}"
                        ))
                        .into_http()
                    })
                }))
            }
        }
    }
}

pin_project_lite::pin_project! {
    /// The response future of a [`SliceletService`]: the inner service's, or an answer
    /// the layer made (a refusal, a forwarded response).
    pub struct SliceletFuture<F> {
        #[pin]
        state: State<F>,
    }
}

pin_project_lite::pin_project! {
    #[project = StateProj]
    enum State<F> {
        Inner { #[pin] future: F },
        Answer { response: Option<http::Response<Body>> },
        Forward { future: BoxFuture<'static, http::Response<Body>> },
    }
}

impl<F> SliceletFuture<F> {
    fn inner(future: F) -> Self {
        Self { state: State::Inner { future } }
    }

    fn answer(response: http::Response<Body>) -> Self {
        Self { state: State::Answer { response: Some(response) } }
    }

    fn forward(future: BoxFuture<'static, http::Response<Body>>) -> Self {
        Self { state: State::Forward { future } }
    }
}

impl<F> std::fmt::Debug for SliceletFuture<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SliceletFuture").finish_non_exhaustive()
    }
}

impl<F, R, E> Future for SliceletFuture<F>
where
    F: Future<Output = Result<http::Response<R>, E>>,
{
    type Output = Result<http::Response<Either<R, Body>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Inner { future } => future.poll(cx).map_ok(|r| r.map(Either::Left)),
            StateProj::Answer { response } => {
                let response = response.take().expect("SliceletFuture polled after completion");
                Poll::Ready(Ok(response.map(Either::Right)))
            }
            StateProj::Forward { future } => {
                let response = ready!(future.as_mut().poll(cx));
                Poll::Ready(Ok(response.map(Either::Right)))
            }
        }
    }
}
