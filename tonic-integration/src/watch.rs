//! Distributing assignments over gRPC: a server that fans one publisher out to many
//! watchers, and a client stream that watches, reconnects and never ends.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use futures_util::Stream;
use steady_balance::{Assignment, AssignmentError, Backoff};
use steady_subset::prng::SplitMix64;
use tokio::sync::watch;
use tonic::transport::Endpoint;
use tonic::{Request, Response, Status, Streaming};

use crate::convert::{from_proto, to_proto};
use crate::proto::assignment_distributor_client::AssignmentDistributorClient;
use crate::proto::assignment_distributor_server::{AssignmentDistributor, AssignmentDistributorServer};
use crate::proto::{AssignmentUpdate, WatchRequest};

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
                    return Some((Ok(to_proto(&a)), (updates, closed, generation)));
                }
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }
}

/// The client side: the assignments of `job` from the distributor at `endpoint`, as a
/// stream for [`crate::SteadyChannel::follow_assignments`] (or any
/// `steady_balance::Balance`).
///
/// It connects, watches, and when the connection or the stream fails, reconnects after
/// `backoff` (with jitter), asking only for generations newer than the last it
/// received. It never ends on its own. Invalid assignments come through as errors, so
/// that the balancer counts and rejects them and keeps the last good one.
pub fn watch_assignments(
    endpoint: Endpoint,
    job: impl Into<String>,
    backoff: Backoff,
) -> impl Stream<Item = Result<Assignment, AssignmentError>> + Send + 'static {
    struct State {
        endpoint: Endpoint,
        job: String,
        known: u64,
        stream: Option<Streaming<AssignmentUpdate>>,
        failures: u32,
        rng: SplitMix64,
        backoff: Backoff,
    }
    let job = job.into();
    let seed = steady_subset::hash::mix64(job.len() as u64 ^ std::process::id() as u64);
    let state =
        State { endpoint, job, known: 0, stream: None, failures: 0, rng: SplitMix64::new(seed), backoff };
    futures_util::stream::unfold(state, |mut s| async move {
        loop {
            if s.failures > 0 && s.stream.is_none() {
                tokio::time::sleep(s.backoff.delay(s.failures, &mut s.rng)).await;
            }
            let stream = match s.stream.as_mut() {
                Some(stream) => stream,
                None => {
                    let request = WatchRequest { job: s.job.clone(), known_generation: s.known };
                    let opened = match AssignmentDistributorClient::connect(s.endpoint.clone()).await {
                        Ok(mut client) => {
                            client.watch(request).await.map(Response::into_inner).map_err(|e| e.to_string())
                        }
                        Err(e) => Err(e.to_string()),
                    };
                    match opened {
                        Ok(stream) => {
                            tracing::debug!(job = %s.job, known = s.known, "watching assignments");
                            s.stream.insert(stream)
                        }
                        Err(error) => {
                            s.failures += 1;
                            tracing::warn!(job = %s.job, %error, failures = s.failures, "cannot watch assignments");
                            continue;
                        }
                    }
                }
            };
            match stream.message().await {
                Ok(Some(update)) => {
                    s.failures = 0;
                    let result = from_proto(update);
                    if let Ok(a) = &result {
                        s.known = s.known.max(a.generation());
                    }
                    return Some((result, s));
                }
                Ok(None) | Err(_) => {
                    tracing::warn!(job = %s.job, "assignment stream ended: reconnecting");
                    s.stream = None;
                    s.failures += 1;
                }
            }
        }
    })
}
