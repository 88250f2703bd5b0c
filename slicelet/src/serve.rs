//! A backend re-serving the assignment it holds: the `AssignmentDistributor.Watch` RPC
//! on the backend's own server, so that frontends that also list backends
//! (`steady_proto::watch_assignments_any`) keep up, and new ones start, while the
//! distributor is unreachable (Dicer's clerks bootstrap from slicelets the same way).

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use futures_util::Stream;
use steady_proto::assignment::assignment_distributor_server::{
    AssignmentDistributor, AssignmentDistributorServer,
};
use steady_proto::assignment::{AssignmentUpdate, WatchRequest};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::Slicelet;

/// How many Watch streams one backend serves at once unless
/// [`AssignmentService::max_watchers`] says otherwise; past it a watch fails with
/// `RESOURCE_EXHAUSTED` (and the frontend's other endpoints serve it).
pub const MAX_SLICELET_WATCHERS: usize = 1024;

/// The Watch service of one Slicelet for its job: streams every generation the Slicelet
/// installs, newer than the watcher knows. Made by [`Slicelet::assignment_service`];
/// serve it with `Server::builder().add_service(service.into_server())`.
#[derive(Debug, Clone)]
pub struct AssignmentService {
    slicelet: Slicelet,
    job: String,
    watchers: Arc<AtomicUsize>,
    max_watchers: usize,
    /// Set by [`AssignmentService::close_watchers`]: every open stream ends.
    closed: watch::Sender<bool>,
}

impl AssignmentService {
    pub(crate) fn new(slicelet: Slicelet, job: String) -> Self {
        Self {
            slicelet,
            job,
            watchers: Arc::default(),
            max_watchers: MAX_SLICELET_WATCHERS,
            closed: watch::Sender::new(false),
        }
    }

    /// Ends every open Watch stream (and refuses new ones): call it before a graceful
    /// shutdown of the backend's server, which otherwise waits for its watchers, who
    /// never leave on their own. Watchers reconnect to their other endpoints.
    pub fn close_watchers(&self) {
        self.closed.send_replace(true);
    }

    /// At most `max` Watch streams at once (at least 1).
    pub fn max_watchers(mut self, max: usize) -> Self {
        self.max_watchers = max.max(1);
        self
    }

    /// Watch streams open now.
    pub fn watchers(&self) -> usize {
        self.watchers.load(Ordering::Relaxed)
    }

    /// The tonic service.
    pub fn into_server(self) -> AssignmentDistributorServer<Self> {
        AssignmentDistributorServer::new(self)
    }
}

/// Counts one open stream; uncounts it when the stream is dropped.
struct Watching(Arc<AtomicUsize>);

impl Drop for Watching {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The stream a watcher of a backend receives.
pub type SliceletWatchStream = Pin<Box<dyn Stream<Item = Result<AssignmentUpdate, Status>> + Send>>;

#[tonic::async_trait]
impl AssignmentDistributor for AssignmentService {
    type WatchStream = SliceletWatchStream;

    /// Streams the Slicelet's assignments newer than `known_generation`.
    ///
    /// # Errors
    ///
    /// `NOT_FOUND` for a job this backend does not belong to (retried by the client: its
    /// other endpoints serve it); `RESOURCE_EXHAUSTED` past the most watchers.
    async fn watch(&self, request: Request<WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        let WatchRequest { job, known_generation } = request.into_inner();
        if job != self.job {
            return Err(Status::not_found(format!(
                "this backend serves the assignments of one job, not {job:?}"
            )));
        }
        if *self.closed.borrow() {
            return Err(Status::unavailable("this backend is shutting down"));
        }
        let open = self.watchers.fetch_add(1, Ordering::Relaxed);
        let watching = Watching(self.watchers.clone());
        if open >= self.max_watchers {
            return Err(Status::resource_exhausted(format!(
                "{open} watch streams are open on this backend (limit {})",
                self.max_watchers
            )));
        }
        let mut installs = self.slicelet.state.ownership.subscribe();
        installs.mark_changed();
        let slicelet = self.slicelet.clone();
        let closed = self.closed.subscribe();
        let state = (installs, closed, slicelet, known_generation, watching);
        let stream = futures_util::stream::unfold(
            state,
            |(mut installs, mut closed, slicelet, known, watching)| async move {
                loop {
                    if *closed.borrow_and_update() {
                        return None;
                    }
                    tokio::select! {
                        changed = installs.changed() => changed.ok()?,
                        _ = closed.changed() => continue,
                    }
                    installs.borrow_and_update();
                    let current = slicelet.state.assignment.load_full();
                    if let Some(held) = current.filter(|h| h.assignment.generation() > known) {
                        let update = AssignmentUpdate::from(&held.assignment);
                        let generation = held.assignment.generation();
                        return Some((Ok(update), (installs, closed, slicelet, generation, watching)));
                    }
                }
            },
        );
        Ok(Response::new(Box::pin(stream)))
    }
}
