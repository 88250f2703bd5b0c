//! The client side of assignment distribution over gRPC: a stream that watches a
//! distributor, reconnects and never ends. (The server, the `Distributor`, is in
//! `steady-slicer`.)

use futures_util::Stream;
use steady_balance::Backoff;
use steady_slice::{Assignment, AssignmentError};
use steady_subset::prng::SplitMix64;
use tonic::transport::Endpoint;
use tonic::{Response, Streaming};

use crate::proto::assignment_distributor_client::AssignmentDistributorClient;
use crate::proto::{AssignmentUpdate, WatchRequest};

/// The assignments of `job` from the distributor at `endpoint` (a `steady_slicer::Distributor`,
/// or any server of `AssignmentDistributor.Watch`), as a
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
                    let result = Assignment::try_from(update);
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
