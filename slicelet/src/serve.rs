//! A backend re-serving the assignment it holds: the `AssignmentDistributor.Watch` RPC
//! on the backend's own server, so that frontends that also list backends
//! (`steady_proto::watch_assignments_any`) keep up, and new ones start, while the
//! distributor is unreachable (Dicer's clerks bootstrap from slicelets the same way).
//! Each generation is encoded once, by the first stream that sends it, and its bytes
//! shared with every other stream (steady-proto's `EncodedWatchServer`).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use steady_proto::assignment::WatchRequest;
use steady_proto::{encode_update, EncodedWatch, EncodedWatchServer, EncodedWatchStream};
use steady_slice::Assignment;
use tokio::sync::watch;
use tonic::Status;

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
    /// The last generation encoded, shared by every stream.
    encoded: Arc<Mutex<Option<(u64, Bytes)>>>,
    /// Encodings made (tests).
    encodings: Arc<AtomicU64>,
}

impl AssignmentService {
    pub(crate) fn new(slicelet: Slicelet, job: String) -> Self {
        Self {
            slicelet,
            job,
            watchers: Arc::default(),
            max_watchers: MAX_SLICELET_WATCHERS,
            closed: watch::Sender::new(false),
            encoded: Arc::default(),
            encodings: Arc::default(),
        }
    }

    /// `assignment`'s message, encoded by the first stream that needs its generation.
    fn encoded(&self, assignment: &Assignment) -> Bytes {
        let mut last = self.encoded.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match &*last {
            Some((generation, bytes)) if *generation == assignment.generation() => bytes.clone(),
            _ => {
                let bytes = encode_update(assignment);
                self.encodings.fetch_add(1, Ordering::Relaxed);
                *last = Some((assignment.generation(), bytes.clone()));
                bytes
            }
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

    /// The tonic service (the same `AssignmentDistributor.Watch` as the Distributor's).
    pub fn into_server(self) -> EncodedWatchServer<Self> {
        EncodedWatchServer::new(self)
    }
}

/// Counts one open stream; uncounts it when the stream is dropped.
struct Watching(Arc<AtomicUsize>);

impl Drop for Watching {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The stream a watcher of a backend receives: encoded `AssignmentUpdate` messages.
pub type SliceletWatchStream = EncodedWatchStream;

impl EncodedWatch for AssignmentService {
    /// Streams the Slicelet's assignments newer than `known_generation`.
    ///
    /// # Errors
    ///
    /// `NOT_FOUND` for a job this backend does not belong to (retried by the client: its
    /// other endpoints serve it); `RESOURCE_EXHAUSTED` past the most watchers;
    /// `UNAVAILABLE` once the watchers are closed.
    fn watch(&self, request: WatchRequest) -> Result<SliceletWatchStream, Status> {
        let WatchRequest { job, known_generation } = request;
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
        let closed = self.closed.subscribe();
        let state = (installs, closed, self.clone(), known_generation, watching);
        let stream = futures_util::stream::unfold(
            state,
            |(mut installs, mut closed, service, known, watching)| async move {
                loop {
                    if *closed.borrow_and_update() {
                        return None;
                    }
                    tokio::select! {
                        changed = installs.changed() => changed.ok()?,
                        _ = closed.changed() => continue,
                    }
                    installs.borrow_and_update();
                    let current = service.slicelet.state.assignment.load_full();
                    if let Some(held) = current.filter(|h| h.assignment.generation() > known) {
                        let generation = held.assignment.generation();
                        let update = service.encoded(&held.assignment);
                        return Some((Ok(update), (installs, closed, service, generation, watching)));
                    }
                }
            },
        );
        Ok(Box::pin(stream))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;
    use prost::Message;
    use steady_proto::assignment::AssignmentUpdate;

    #[tokio::test]
    async fn every_stream_sends_the_bytes_of_one_encoding_per_generation() {
        let slicelet = Slicelet::new(0);
        let service = slicelet.assignment_service("users");
        let request = || WatchRequest { job: "users".into(), known_generation: 0 };
        let mut streams: Vec<SliceletWatchStream> =
            (0..5).map(|_| service.watch(request()).unwrap()).collect();
        for g in 1..=3u64 {
            let assignment = Assignment::single(g, vec![0, g as u32]).unwrap();
            slicelet.set_assignment(assignment.clone());
            for stream in &mut streams {
                let bytes = stream.next().await.unwrap().unwrap();
                let decoded = Assignment::try_from(AssignmentUpdate::decode(bytes).unwrap()).unwrap();
                assert_eq!(decoded, assignment);
            }
            assert_eq!(
                service.encodings.load(Ordering::Relaxed),
                g,
                "one encoding per generation, five streams"
            );
        }
        assert_eq!(service.watchers(), 5);
        drop(streams);
        assert_eq!(service.watchers(), 0);
    }
}
