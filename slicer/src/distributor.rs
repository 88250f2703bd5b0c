//! [`Distributor`]: the server of `AssignmentDistributor.Watch`, fanning one publisher
//! out to many watchers. The client is `steady_tonic::watch_assignments`.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use futures_util::Stream;
use steady_slice::Assignment;
use steady_tonic::proto::assignment_distributor_server::{
    AssignmentDistributor, AssignmentDistributorServer,
};
use steady_tonic::proto::{AssignmentUpdate, WatchRequest};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

/// The server side: holds the current assignment of each job and streams every newer
/// one to every watcher of that job.
///
/// Clone it freely: clones publish to the same watchers. Serve it with
/// `tonic::transport::Server::builder().add_service(distributor.service())`.
#[derive(Debug, Clone)]
pub struct Distributor {
    jobs: Arc<Mutex<HashMap<String, watch::Sender<Option<Assignment>>>>>,
    /// Bumped by [`Distributor::close_watchers`]: every open stream ends.
    epoch: watch::Sender<u64>,
}

impl Default for Distributor {
    fn default() -> Self {
        Self { jobs: Arc::default(), epoch: watch::Sender::new(0) }
    }
}

impl Distributor {
    /// A distributor with no assignments yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Ends every open watch stream (watchers reconnect and resume from the generation
    /// they have). Call it before a graceful server shutdown, which otherwise waits for
    /// the streams, which never end on their own.
    pub fn close_watchers(&self) {
        self.epoch.send_modify(|e| *e += 1);
    }

    fn sender(&self, job: &str) -> watch::Sender<Option<Assignment>> {
        self.jobs
            .lock()
            .expect("not poisoned")
            .entry(job.to_owned())
            .or_insert_with(|| watch::Sender::new(None))
            .clone()
    }

    /// Publishes `assignment` for `job` if it is newer than the current one; returns
    /// whether it was.
    pub fn publish(&self, job: &str, assignment: Assignment) -> bool {
        self.sender(job).send_if_modified(|current| {
            if current.as_ref().is_some_and(|c| c.generation() >= assignment.generation()) {
                return false;
            }
            *current = Some(assignment);
            true
        })
    }

    /// The current assignment of `job`.
    pub fn current(&self, job: &str) -> Option<Assignment> {
        self.sender(job).borrow().clone()
    }

    /// How many watchers `job` has now.
    pub fn watchers(&self, job: &str) -> usize {
        self.sender(job).receiver_count()
    }

    /// The tonic service to add to a server.
    pub fn service(&self) -> AssignmentDistributorServer<Self> {
        AssignmentDistributorServer::new(self.clone())
    }
}

/// The stream a watcher receives.
pub type WatchStream = Pin<Box<dyn Stream<Item = Result<AssignmentUpdate, Status>> + Send>>;

#[tonic::async_trait]
impl AssignmentDistributor for Distributor {
    type WatchStream = WatchStream;

    async fn watch(&self, request: Request<WatchRequest>) -> Result<Response<WatchStream>, Status> {
        let WatchRequest { job, known_generation } = request.into_inner();
        let mut updates = self.sender(&job).subscribe();
        // Mark the current value unseen so a newer-than-known one is sent at once.
        updates.mark_changed();
        let closed = self.epoch.subscribe();
        let state = (updates, closed, known_generation);
        let stream = futures_util::stream::unfold(state, |(mut updates, mut closed, known)| async move {
            loop {
                tokio::select! {
                    changed = updates.changed() => changed.ok()?,
                    _ = closed.changed() => return None,
                }
                let newer = updates.borrow_and_update().clone().filter(|a| a.generation() > known);
                if let Some(a) = newer {
                    let generation = a.generation();
                    return Some((Ok(AssignmentUpdate::from(&a)), (updates, closed, generation)));
                }
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }
}
