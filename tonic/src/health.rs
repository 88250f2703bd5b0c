//! Active health checks (optional, off by default): each member's
//! `grpc.health.v1.Health/Watch` stream, and a member reported `NOT_SERVING` taken out
//! of rotation as a draining task is.
//!
//! How it works. When checks are on, every connection the channel makes also opens a
//! `Watch` stream for the configured service name on that same connection. The status it
//! reports goes on a [`HealthBoard`] keyed by the member's URI; the job views the
//! balancer follows pass through [`with_health`], which marks every task whose URI is
//! `NOT_SERVING` (any status but `SERVING`, as gRPC reads it) as draining. The balancer
//! then stops sending it requests, lets its requests in flight finish, closes the
//! connection and lets the next backend in the frontend's order stand in. The watcher
//! keeps its own handle on the connection while its member is not serving, so it sees the
//! member come back; then the task serves again in the next view and is reconnected (with
//! slow start), and the old watcher ends.
//!
//! Failure modes. A member starts as serving, before its first report. A backend without
//! the health service (`UNIMPLEMENTED`) is left serving, logged once, and not checked
//! again on that connection. A `Watch` stream that fails or ends is re-opened with
//! backoff, the last status standing meanwhile. Memory: one entry per URI of the current
//! view that is not serving, and at most one watcher per connection plus one per member
//! not serving.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use http::Uri;
use steady_balance::{Backoff, JobView, Task, TaskState};
use tokio::sync::{oneshot, watch};
use tonic::transport::Channel;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

use crate::endpoint::TaskEndpoint;

/// The health of every member, by URI, and who follows it.
#[derive(Debug)]
pub(crate) struct HealthBoard {
    /// The service name every `Watch` asks about (`""`: the server as a whole).
    service: String,
    state: Mutex<BoardState>,
    /// Bumped on every change of `not_serving`.
    changed: watch::Sender<u64>,
}

#[derive(Debug, Default)]
struct BoardState {
    /// The URIs of the current view.
    in_view: HashSet<Uri>,
    /// Those reported not serving.
    not_serving: HashSet<Uri>,
}

/// Stops its watcher's checks once the balancer has dropped the connection (every clone
/// of the member's service); the watcher goes on alone while its member is not serving.
#[derive(Debug)]
pub(crate) struct WatchGuard {
    _stop: oneshot::Sender<()>,
}

/// Delays between attempts to (re)open a `Watch` stream.
const RETRY: Backoff =
    Backoff { base: Duration::from_millis(100), max: Duration::from_secs(10), jitter: 0.5 };

impl HealthBoard {
    pub(crate) fn new(service: String) -> Arc<Self> {
        Arc::new(Self { service, state: Mutex::default(), changed: watch::Sender::new(0) })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BoardState> {
        // A poisoned lock only means a panic elsewhere mid-update of two sets: go on.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records `uri`'s status (a URI no longer in the view is ignored).
    fn set(&self, uri: &Uri, serving: bool) {
        let changed = {
            let mut state = self.lock();
            if !state.in_view.contains(uri) {
                return;
            }
            if serving {
                state.not_serving.remove(uri)
            } else {
                state.not_serving.insert(uri.clone())
            }
        };
        if changed {
            tracing::info!(%uri, serving, "health check: member status changed");
            self.changed.send_modify(|v| *v += 1);
        }
    }

    fn is_serving(&self, uri: &Uri) -> bool {
        !self.lock().not_serving.contains(uri)
    }

    fn in_view(&self, uri: &Uri) -> bool {
        self.lock().in_view.contains(uri)
    }

    /// Follows a new view: forgets what is not in it.
    fn set_view(&self, view: &JobView<TaskEndpoint>) {
        let mut state = self.lock();
        state.in_view = view.tasks.values().map(|t| t.address.0.uri().clone()).collect();
        let BoardState { in_view, not_serving } = &mut *state;
        not_serving.retain(|uri| in_view.contains(uri));
    }

    /// `view` with every task reported not serving marked draining.
    fn mark(&self, view: &JobView<TaskEndpoint>) -> JobView<TaskEndpoint> {
        let state = self.lock();
        if state.not_serving.is_empty() {
            return view.clone();
        }
        let tasks: BTreeMap<usize, Task<TaskEndpoint>> = view
            .tasks
            .iter()
            .map(|(&index, task)| {
                let mut task = task.clone();
                if task.state == TaskState::Serving && state.not_serving.contains(task.address.0.uri()) {
                    task.state = TaskState::Draining;
                }
                (index, task)
            })
            .collect();
        JobView { size: view.size, tasks: Arc::new(tasks) }
    }

    /// Starts watching the health of the member at `uri` over `channel` (its connection);
    /// the checks stop once the returned guard is dropped and the member serves.
    pub(crate) fn watch(self: &Arc<Self>, uri: Uri, channel: Channel) -> WatchGuard {
        let (stop, stopped) = oneshot::channel();
        tokio::spawn(watch_member(self.clone(), uri, channel, stopped));
        WatchGuard { _stop: stop }
    }
}

/// One member's watcher (see the module docs).
async fn watch_member(
    board: Arc<HealthBoard>,
    uri: Uri,
    channel: Channel,
    mut stopped: oneshot::Receiver<()>,
) {
    let mut released = false;
    let mut failures = 0u32;
    let mut rng = steady_subset::prng::SplitMix64::new(steady_subset::hash::mix64(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64),
    ));
    loop {
        if !board.in_view(&uri) || (released && board.is_serving(&uri)) {
            return;
        }
        let mut client = HealthClient::new(channel.clone());
        let request = HealthCheckRequest { service: board.service.clone() };
        let opened = tokio::select! {
            opened = client.watch(request) => opened,
            _ = &mut stopped, if !released => { released = true; continue }
        };
        match opened {
            Ok(response) => {
                failures = 0;
                let mut stream = response.into_inner();
                loop {
                    tokio::select! {
                        message = stream.message() => match message {
                            Ok(Some(report)) => {
                                let serving = report.status == ServingStatus::Serving as i32;
                                board.set(&uri, serving);
                                if released && serving {
                                    return;
                                }
                            }
                            // The stream ended or failed: re-open it, after a pause.
                            _ => break,
                        },
                        _ = &mut stopped, if !released => {
                            released = true;
                            if board.is_serving(&uri) {
                                return;
                            }
                        }
                    }
                }
            }
            Err(status) if status.code() == Code::Unimplemented => {
                tracing::warn!(%uri, "health checks on, but the backend has no health service: taken as serving");
                board.set(&uri, true);
                return;
            }
            Err(status) => {
                failures = failures.saturating_add(1);
                tracing::debug!(%uri, %status, failures, "health check: Watch failed");
            }
        }
        let pause = RETRY.delay(failures.max(1), &mut rng);
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            _ = &mut stopped, if !released => released = true,
        }
    }
}

/// The job views with the members reported not serving marked draining, re-published
/// whenever a member's status changes. When `views` ends, the last view stays and is
/// still re-marked.
pub(crate) fn with_health(
    views: impl Stream<Item = JobView<TaskEndpoint>> + Send + 'static,
    board: Arc<HealthBoard>,
) -> impl Stream<Item = JobView<TaskEndpoint>> + Send + 'static {
    let changes = board.changed.subscribe();
    let state = (Some(Box::pin(views)), None::<JobView<TaskEndpoint>>, changes, board);
    futures_util::stream::unfold(state, |(mut views, mut last, mut changes, board)| async move {
        loop {
            let next = async {
                match views.as_mut() {
                    Some(views) => views.next().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                view = next => match view {
                    Some(view) => {
                        board.set_view(&view);
                        last = Some(view);
                    }
                    None => {
                        views = None;
                        continue;
                    }
                },
                // The board lives as long as this stream: `changed` fails only then.
                Ok(()) = changes.changed() => {}
            }
            if let Some(view) = &last {
                let marked = board.mark(view);
                return Some((marked, (views, last, changes, board)));
            }
        }
    })
}
