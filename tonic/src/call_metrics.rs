//! [`CallMetrics`]: gRPC's per-call duration histogram (gRFC A66's
//! `grpc.client.call.duration`), by method, target and status (feature `call-metrics`).
//!
//! The channel's own instruments (`SteadyChannel::observe_metrics`) read counters the
//! balancer keeps anyway and add nothing per request. A latency histogram by method and
//! status cannot be had that way: it costs a clock read at each end of the call and one
//! histogram record (the meter provider's attribute lookup) per call. So it is a layer of
//! its own, behind a feature, that the application puts where it wants calls measured,
//! usually right above the channel:
//!
//! ```no_run
//! use steady_balance::BalanceConfig;
//! use steady_tonic::{CallMetricsLayer, SteadyChannel};
//! use tower::ServiceBuilder;
//!
//! # fn demo(meter: opentelemetry::metrics::Meter) -> Result<(), Box<dyn std::error::Error>> {
//! # let backends: Vec<tonic::transport::Endpoint> = Vec::new();
//! let channel = SteadyChannel::builder(BalanceConfig::new(7, 20)).from_endpoints(backends)?;
//! channel.observe_metrics(&meter, "dns:///users");
//! let channel = ServiceBuilder::new().layer(CallMetricsLayer::new(&meter, "dns:///users")).service(channel);
//! // let client = UsersClient::new(channel);
//! # let _ = channel;
//! # Ok(())
//! # }
//! ```
//!
//! # What is recorded
//!
//! One value per call, in seconds, from the moment the call was first polled for
//! readiness (so the wait for a backend counts, as A66 counts the pick) until its status is
//! known, with the histogram's buckets set to A66's latency buckets
//! ([`LATENCY_BUCKETS`]; a view of the application's meter provider may replace them):
//!
//! * `grpc.status` is the code the application sees: from a trailers-only response's
//!   headers when the response arrives; otherwise from the trailers when the body has been
//!   read to its end (a body that ends without a status is `INTERNAL`, as gRPC reads it); a
//!   response with an HTTP status other than 200 has the code gRPC maps it to; a call that
//!   failed before a response has the code tonic gives its error (`UNAVAILABLE` when
//!   steady had no backend; `CANCELLED` for tonic's own deadline). A call the application
//!   drops before its status (its future, or its response's body) is `CANCELLED`.
//! * `grpc.method` is the request path without its leading slash
//!   (`package.Service/Method`). Methods come from the application's own generated clients,
//!   so they are few; still, at most [`MAX_METHODS`] distinct names are kept, and every
//!   method after them (or outside [`CallMetricsLayer::only_methods`]) is recorded as
//!   `other`, as A66 records methods it does not know.
//! * `grpc.target` is the string the layer was made with, the same the channel's
//!   instruments carry.
//!
//! A request that steady moved to another member because it never left (see
//! `MAX_REPLAY_BYTES`) is one call: steady's moves are gRPC's transparent retries, inside
//! the call this layer measures.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{ready, Context, Poll};
use std::time::Instant;

use bytes::Buf;
use http_body::{Body as HttpBody, Frame};
use opentelemetry::metrics::{Histogram, Meter};
use opentelemetry::{KeyValue, StringValue, Value};
use pin_project_lite::pin_project;
use tonic::{Code, Status};
use tower::{BoxError, Layer, Service};

use crate::classify::{code_in, code_of_http};

/// gRFC A66's latency buckets, in seconds: the histogram's bucket bounds.
pub const LATENCY_BUCKETS: [f64; 41] = [
    0.0, 0.00001, 0.00005, 0.0001, 0.0003, 0.0006, 0.0008, 0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.008,
    0.01, 0.013, 0.016, 0.02, 0.025, 0.03, 0.04, 0.05, 0.065, 0.08, 0.1, 0.13, 0.16, 0.2, 0.25, 0.3, 0.4,
    0.5, 0.65, 0.8, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0,
];

/// The most distinct `grpc.method` values one layer records; later methods are `other`.
pub const MAX_METHODS: usize = 1000;

/// The name of the instrument, as gRPC names it.
pub const CALL_DURATION: &str = "grpc.client.call.duration";

/// The `grpc.status` label of each code, as gRPC spells it.
const CODE_NAMES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

/// The `grpc.status` value of `code`.
pub fn status_label(code: Code) -> &'static str {
    CODE_NAMES.get(code as usize).copied().unwrap_or("UNKNOWN")
}

/// Makes [`CallMetrics`] services that record into one histogram (clones share it, and
/// share the methods seen).
#[derive(Clone)]
pub struct CallMetricsLayer {
    shared: Arc<Shared>,
}

impl fmt::Debug for CallMetricsLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallMetricsLayer").field("target", &self.shared.target.value).finish_non_exhaustive()
    }
}

struct Shared {
    duration: Histogram<f64>,
    target: KeyValue,
    methods: Methods,
}

impl CallMetricsLayer {
    /// Registers `grpc.client.call.duration` in `meter` (unit `s`, A66's buckets) for the
    /// calls of the channel known as `target`.
    pub fn new(meter: &Meter, target: &str) -> Self {
        let duration = meter
            .f64_histogram(CALL_DURATION)
            .with_unit("s")
            .with_description(
                "Time from the start of a call (its wait for a backend included) until its status is known.",
            )
            .with_boundaries(LATENCY_BUCKETS.to_vec())
            .build();
        let target = KeyValue::new("grpc.target", Value::String(StringValue::from(Arc::<str>::from(target))));
        Self { shared: Arc::new(Shared { duration, target, methods: Methods::new(None) }) }
    }

    /// Records only these methods by name (`package.Service/Method`, with or without the
    /// leading slash); every other method is `other`.
    pub fn only_methods<I, M>(self, methods: I) -> Self
    where
        I: IntoIterator<Item = M>,
        M: AsRef<str>,
    {
        let allowed = methods.into_iter().map(|m| m.as_ref().trim_start_matches('/').to_owned()).collect();
        let shared = Shared {
            duration: self.shared.duration.clone(),
            target: self.shared.target.clone(),
            methods: Methods::new(Some(allowed)),
        };
        Self { shared: Arc::new(shared) }
    }
}

impl<S> Layer<S> for CallMetricsLayer {
    type Service = CallMetrics<S>;

    fn layer(&self, inner: S) -> CallMetrics<S> {
        CallMetrics { inner, shared: self.shared.clone(), ready_since: None }
    }
}

/// Records each call's duration by method, target and status (see the [module
/// docs](self)); made by [`CallMetricsLayer`].
///
/// Errors of the inner service reach the caller as the [`Status`] tonic would make of
/// them (boxed), so the code recorded is the code the application sees.
pub struct CallMetrics<S> {
    inner: S,
    shared: Arc<Shared>,
    /// When the call now being prepared was first polled for readiness.
    ready_since: Option<Instant>,
}

impl<S: Clone> Clone for CallMetrics<S> {
    fn clone(&self) -> Self {
        // A clone prepares calls of its own.
        Self { inner: self.inner.clone(), shared: self.shared.clone(), ready_since: None }
    }
}

impl<S: fmt::Debug> fmt::Debug for CallMetrics<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallMetrics").field("inner", &self.inner).finish_non_exhaustive()
    }
}

impl<S, ReqBody, ResBody> Service<http::Request<ReqBody>> for CallMetrics<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Error: Into<BoxError>,
{
    type Response = http::Response<CallMetricsBody<ResBody>>;
    type Error = BoxError;
    type Future = CallMetricsFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.ready_since.get_or_insert_with(Instant::now);
        let ready = ready!(self.inner.poll_ready(cx));
        if ready.is_err() {
            // No call follows a failed readiness: the next one starts afresh.
            self.ready_since = None;
        }
        Poll::Ready(ready.map_err(Into::into))
    }

    fn call(&mut self, req: http::Request<ReqBody>) -> Self::Future {
        let call = Call {
            shared: self.shared.clone(),
            method: self.shared.methods.label(req.uri().path()),
            start: self.ready_since.take().unwrap_or_else(Instant::now),
        };
        CallMetricsFuture { inner: self.inner.call(req), call: Some(call) }
    }
}

/// One call being measured; recorded once, when its status is known, or as `CANCELLED`
/// when it is dropped before.
struct Call {
    shared: Arc<Shared>,
    method: KeyValue,
    start: Instant,
}

impl Call {
    fn record(self, code: Code) {
        let seconds = self.start.elapsed().as_secs_f64();
        let Shared { duration, target, .. } = &*self.shared;
        let status = KeyValue::new("grpc.status", status_label(code));
        // In the keys' order, as exporters write them.
        duration.record(seconds, &[self.method, status, target.clone()]);
    }
}

/// Records `call` with `code`, if it has not been recorded yet.
fn finish(call: &mut Option<Call>, code: Code) {
    if let Some(call) = call.take() {
        call.record(code);
    }
}

pin_project! {
    /// The response future of [`CallMetrics`].
    pub struct CallMetricsFuture<F> {
        #[pin]
        inner: F,
        call: Option<Call>,
    }

    impl<F> PinnedDrop for CallMetricsFuture<F> {
        fn drop(this: Pin<&mut Self>) {
            // Dropped before the response: the application gave up on the call.
            finish(this.project().call, Code::Cancelled);
        }
    }
}

impl<F> fmt::Debug for CallMetricsFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallMetricsFuture").finish_non_exhaustive()
    }
}

impl<F, ResBody, E> Future for CallMetricsFuture<F>
where
    F: Future<Output = Result<http::Response<ResBody>, E>>,
    E: Into<BoxError>,
{
    type Output = Result<http::Response<CallMetricsBody<ResBody>>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match ready!(this.inner.poll(cx)) {
            Ok(response) => {
                let status = response.status();
                let known = if status != http::StatusCode::OK {
                    Some(code_of_http(status))
                } else {
                    code_in(response.headers())
                };
                let mut call = this.call.take();
                if let Some(code) = known {
                    // A trailers-only response (or not gRPC's at all): the status is known.
                    finish(&mut call, code);
                }
                Poll::Ready(Ok(response.map(|inner| CallMetricsBody { inner, call })))
            }
            Err(error) => {
                let status = Status::from_error(error.into());
                finish(this.call, status.code());
                Poll::Ready(Err(Box::new(status)))
            }
        }
    }
}

pin_project! {
    /// A response body that records its call when the trailers pass (see the [module
    /// docs](self)). Its errors are the [`Status`] tonic would make of the inner body's.
    pub struct CallMetricsBody<B> {
        #[pin]
        inner: B,
        call: Option<Call>,
    }

    impl<B> PinnedDrop for CallMetricsBody<B> {
        fn drop(this: Pin<&mut Self>) {
            // Dropped before its status: the application stopped reading.
            finish(this.project().call, Code::Cancelled);
        }
    }
}

impl<B> fmt::Debug for CallMetricsBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallMetricsBody").field("pending", &self.call.is_some()).finish_non_exhaustive()
    }
}

impl<B> HttpBody for CallMetricsBody<B>
where
    B: HttpBody,
    B::Data: Buf,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, Status>>> {
        let this = self.project();
        match ready!(this.inner.poll_frame(cx)) {
            Some(Ok(frame)) => {
                if let Some(trailers) = frame.trailers_ref() {
                    finish(this.call, code_in(trailers).unwrap_or(Code::Internal));
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Some(Err(error)) => {
                let status = Status::from_error(error.into());
                finish(this.call, status.code());
                Poll::Ready(Some(Err(status)))
            }
            None => {
                // The end without trailers (unless they were in the headers).
                finish(this.call, Code::Internal);
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The `grpc.method` labels seen so far (at most [`MAX_METHODS`]), made once each so
/// that a call clones a reference count, not a string.
struct Methods {
    /// `Some`: only these are recorded by name.
    allowed: Option<HashSet<String>>,
    seen: RwLock<HashMap<Box<str>, KeyValue>>,
    other: KeyValue,
}

impl Methods {
    fn new(allowed: Option<HashSet<String>>) -> Self {
        Self { allowed, seen: RwLock::new(HashMap::new()), other: KeyValue::new("grpc.method", "other") }
    }

    /// The label of the call to `path` (`/package.Service/Method`).
    fn label(&self, path: &str) -> KeyValue {
        let method = path.strip_prefix('/').unwrap_or(path);
        if let Some(label) = self.seen.read().unwrap_or_else(|e| e.into_inner()).get(method) {
            return label.clone();
        }
        if self.allowed.as_ref().is_some_and(|allowed| !allowed.contains(method)) {
            return self.other.clone();
        }
        let mut seen = self.seen.write().unwrap_or_else(|e| e.into_inner());
        if seen.len() >= MAX_METHODS && !seen.contains_key(method) {
            return self.other.clone();
        }
        seen.entry(method.into())
            .or_insert_with(|| {
                KeyValue::new("grpc.method", Value::String(StringValue::from(Arc::<str>::from(method))))
            })
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(label: KeyValue) -> String {
        assert_eq!(label.key.as_str(), "grpc.method");
        label.value.as_str().into_owned()
    }

    #[test]
    fn a_method_is_its_path_without_the_slash_and_kept_once() {
        let methods = Methods::new(None);
        assert_eq!(name(methods.label("/steady.echo.Echo/Echo")), "steady.echo.Echo/Echo");
        assert_eq!(name(methods.label("/steady.echo.Echo/Echo")), "steady.echo.Echo/Echo");
        assert_eq!(methods.seen.read().unwrap().len(), 1);
    }

    #[test]
    fn methods_beyond_the_bound_are_other_and_the_first_ones_stay() {
        let methods = Methods::new(None);
        for i in 0..MAX_METHODS + 50 {
            let label = name(methods.label(&format!("/pkg.S/M{i}")));
            if i < MAX_METHODS {
                assert_eq!(label, format!("pkg.S/M{i}"));
            } else {
                assert_eq!(label, "other");
            }
        }
        assert_eq!(methods.seen.read().unwrap().len(), MAX_METHODS);
        assert_eq!(name(methods.label("/pkg.S/M0")), "pkg.S/M0");
    }

    #[test]
    fn only_the_allowed_methods_are_named() {
        let allowed = ["pkg.S/Get".to_owned()].into_iter().collect();
        let methods = Methods::new(Some(allowed));
        assert_eq!(name(methods.label("/pkg.S/Get")), "pkg.S/Get");
        assert_eq!(name(methods.label("/pkg.S/Put")), "other");
        assert_eq!(methods.seen.read().unwrap().len(), 1);
    }

    #[test]
    fn status_labels_are_grpc_s_spelling() {
        assert_eq!(status_label(Code::Ok), "OK");
        assert_eq!(status_label(Code::DeadlineExceeded), "DEADLINE_EXCEEDED");
        assert_eq!(status_label(Code::Unauthenticated), "UNAUTHENTICATED");
        for (i, name) in CODE_NAMES.iter().enumerate() {
            let code = Code::from_i32(i as i32);
            assert_eq!(code as usize, i);
            // tonic's own description names the same code.
            assert_eq!(format!("{code:?}").to_uppercase().replace('_', ""), name.replace('_', ""));
        }
    }

    #[test]
    fn the_buckets_are_a66_s_and_increase() {
        assert_eq!(LATENCY_BUCKETS.first(), Some(&0.0));
        assert_eq!(LATENCY_BUCKETS.last(), Some(&100.0));
        assert!(LATENCY_BUCKETS.windows(2).all(|w| w[0] < w[1]));
    }
}
