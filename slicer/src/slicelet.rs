//! [`Slicelet`]: the backend task's side of keyed routing (Slicer's Slicelet idea): which
//! slices this backend task holds, and how many requests arrived for keys it does
//! not hold (misroutes).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use arc_swap::ArcSwapOption;
use futures_util::{Stream, StreamExt};
use http::HeaderName;
use steady_slice::{Assignment, SliceKey};
use steady_tonic::DEFAULT_KEY_HEADER;
use tower::{Layer, Service};

#[derive(Debug, Default)]
struct State {
    assignment: ArcSwapOption<Assignment>,
    keyed: AtomicU64,
    misrouted: AtomicU64,
}

/// What one backend task knows of the assignment, and its misroute counter.
///
/// Clone it freely; clones share state. Feed it assignments with
/// [`Slicelet::follow`] (e.g. from `steady_tonic::watch_assignments`) or
/// [`Slicelet::set_assignment`]; put [`Slicelet::layer`] on the tonic server to count
/// every keyed request it receives.
#[derive(Debug, Clone)]
pub struct Slicelet {
    task: u32,
    state: Arc<State>,
}

impl Slicelet {
    /// The slicelet of backend task `task`.
    pub fn new(task: u32) -> Self {
        Self { task, state: Arc::default() }
    }

    /// Installs `assignment` if it is newer than the one held; returns whether it was.
    pub fn set_assignment(&self, assignment: Assignment) -> bool {
        let current = self.state.assignment.load();
        if current.as_ref().is_some_and(|c| c.generation() >= assignment.generation()) {
            return false;
        }
        self.state.assignment.store(Some(Arc::new(assignment)));
        true
    }

    /// Follows an assignment source on a task of its own (invalid items are logged and
    /// skipped; e.g. `steady_tonic::watch_assignments`).
    pub fn follow<A, E>(&self, source: A) -> tokio::task::JoinHandle<()>
    where
        A: Stream<Item = Result<Assignment, E>> + Send + 'static,
        E: std::fmt::Display,
    {
        let me = self.clone();
        tokio::spawn(async move {
            futures_util::pin_mut!(source);
            while let Some(item) = source.next().await {
                match item {
                    Ok(a) => {
                        me.set_assignment(a);
                    }
                    Err(error) => {
                        tracing::warn!(%error, task = me.task, "slicelet: invalid assignment ignored")
                    }
                }
            }
        })
    }

    /// The generation held (`None` before the first assignment).
    pub fn generation(&self) -> Option<u64> {
        self.state.assignment.load().as_ref().map(|a| a.generation())
    }

    /// Whether this task holds `key` (`None` before the first assignment).
    pub fn holds(&self, key: SliceKey) -> Option<bool> {
        let a = self.state.assignment.load();
        a.as_ref().map(|a| a.slice_for(key).replicas.contains(&self.task))
    }

    /// The start keys of the slices this task holds.
    pub fn held_slices(&self) -> Vec<SliceKey> {
        let a = self.state.assignment.load();
        a.as_ref()
            .map(|a| a.slices().iter().filter(|s| s.replicas.contains(&self.task)).map(|s| s.start).collect())
            .unwrap_or_default()
    }

    /// Records a request with `key`: counts it, and counts a misroute if an assignment
    /// is held and does not give the key to this task. Returns whether it was misrouted.
    pub fn record(&self, key: SliceKey) -> bool {
        self.state.keyed.fetch_add(1, Ordering::Relaxed);
        let misrouted = self.holds(key) == Some(false);
        if misrouted {
            self.state.misrouted.fetch_add(1, Ordering::Relaxed);
        }
        misrouted
    }

    /// Keyed requests recorded.
    pub fn keyed_requests(&self) -> u64 {
        self.state.keyed.load(Ordering::Relaxed)
    }

    /// Keyed requests whose key this task did not hold.
    pub fn misrouted(&self) -> u64 {
        self.state.misrouted.load(Ordering::Relaxed)
    }

    /// A tower layer for the server that records every request's slice key (metadata
    /// `x-slice-key` unless [`SliceletLayer::key_header`] names another, hashed as the
    /// client hashes it).
    pub fn layer(&self) -> SliceletLayer {
        SliceletLayer { slicelet: self.clone(), header: HeaderName::from_static(DEFAULT_KEY_HEADER) }
    }
}

/// Records the slice key of every request on a [`Slicelet`] (see [`Slicelet::layer`]).
#[derive(Debug, Clone)]
pub struct SliceletLayer {
    slicelet: Slicelet,
    header: HeaderName,
}

impl SliceletLayer {
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

/// A server-side service that records keyed requests on its [`Slicelet`], then
/// passes them on unchanged.
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
