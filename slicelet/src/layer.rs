//! [`SliceletLayer`] and [`SliceletService`]: the server side's hook that records every
//! keyed request on a [`Slicelet`].

use std::task::{Context, Poll};

use http::HeaderName;
use steady_slice::SliceKey;
use tower::{Layer, Service};

use super::Slicelet;

/// Records the slice key of every request on a [`Slicelet`] (see [`Slicelet::layer`]).
#[derive(Debug, Clone)]
pub struct SliceletLayer {
    slicelet: Slicelet,
    header: HeaderName,
}

impl SliceletLayer {
    pub(super) fn new(slicelet: Slicelet, header: HeaderName) -> Self {
        Self { slicelet, header }
    }

    /// Reads slice keys from this metadata entry instead of `x-slice-key`: set it to what
    /// the clients' `SteadyChannelBuilder::key_header` names.
    pub fn key_header(mut self, header: HeaderName) -> Self {
        self.header = header;
        self
    }
}

impl<S> Layer<S> for SliceletLayer {
    type Service = SliceletService<S>;

    fn layer(&self, inner: S) -> SliceletService<S> {
        SliceletService { inner, slicelet: self.slicelet.clone(), header: self.header.clone() }
    }
}

/// A server-side service that records keyed requests on its [`Slicelet`] (misroute
/// check, per-slice load, hot-key sketch: [`Slicelet::record`]), then passes them on
/// unchanged.
#[derive(Debug, Clone)]
pub struct SliceletService<S> {
    inner: S,
    slicelet: Slicelet,
    header: HeaderName,
}

impl<S, B> Service<http::Request<B>> for SliceletService<S>
where
    S: Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> S::Future {
        if let Some(value) = req.headers().get(&self.header) {
            self.slicelet.record(SliceKey::of(value.as_bytes()));
        }
        self.inner.call(req)
    }
}
