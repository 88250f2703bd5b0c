//! One A119 stream: its first message checked, the configuration and the job's
//! generations sent, its acks and load reports taken.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use prost::Message;
use steady_core::{valid_job_name, MAX_JOB_NAME_LEN};
use steady_proto::autosharding::ranges::validate;
use steady_proto::autosharding::v1::{
    AssignmentAck, InitialClientConfig, LoadReport, LoadReportingConfig, WatchShardingAssignmentRequest,
    WatchShardingAssignmentResponse,
};
use steady_proto::autosharding::EncodedAutoshardingStream;
use tokio::sync::watch;
use tokio::time::Instant;
use tonic::{Code, Status, Streaming};

use super::acks::{AckRejection, Unacked};
use super::generations::Slot;
use super::{Autosharding, MAX_CLIENT_UUID_BYTES};
use crate::distributor::Subscription;

/// How long a new stream may take to name its job.
const FIRST_MESSAGE_WITHIN: Duration = Duration::from_secs(10);

/// How often one stream's rejected acks and invalid messages are logged, at most.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// The responses of one call: its messages are read as the responses are polled.
pub(super) fn open(
    service: Autosharding,
    request: tonic::Request<Streaming<WatchShardingAssignmentRequest>>,
) -> EncodedAutoshardingStream {
    service.shared.counters.open_streams.fetch_add(1, Ordering::Relaxed);
    let peer = request.remote_addr();
    let closed = service.distributor.closings();
    let state = Stream {
        _open: OpenStream(service.clone()),
        service,
        peer,
        requests: Some(request.into_inner()),
        closed,
        phase: Phase::Starting,
    };
    Box::pin(futures_util::stream::unfold(state, |mut state| async move {
        let item = state.next().await?;
        if item.is_err() {
            state.phase = Phase::Done;
        }
        Some((item, state))
    }))
}

/// Counts the stream among the open ones while it lives.
struct OpenStream(Autosharding);

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.shared.counters.open_streams.fetch_sub(1, Ordering::Relaxed);
    }
}

struct Stream {
    service: Autosharding,
    _open: OpenStream,
    peer: Option<SocketAddr>,
    /// The client's messages; `None` once it half-closed its side.
    requests: Option<Streaming<WatchShardingAssignmentRequest>>,
    /// Changes on `Distributor::close_watchers`.
    closed: watch::Receiver<u64>,
    phase: Phase,
}

enum Phase {
    /// Waiting for the `initial_client_config`.
    Starting,
    Watching(Box<Watching>),
    /// Ended (after an error).
    Done,
}

/// A stream that named its job.
struct Watching {
    job: String,
    client: String,
    subscription: Subscription,
    slot: Slot,
    /// The newest generation the client has or was sent.
    latest: i64,
    /// The generation being sent and how many of its messages went out.
    sending: Option<(Arc<[Bytes]>, usize)>,
    /// The load quantum of the last `LoadReportingConfig` sent.
    quantum: f64,
    /// A `LoadReportingConfig` to send before the next generation's chunks: the job's
    /// task count changed the quantum (per task).
    config_due: Option<Bytes>,
    unacked: Unacked,
    invalid_in_a_row: u32,
    log: Throttle,
}

impl Stream {
    /// The next response, or the error that ends the stream; `None`: it ends cleanly.
    async fn next(&mut self) -> Option<Result<Bytes, Status>> {
        match &self.phase {
            Phase::Done => None,
            Phase::Starting => Some(self.start().await),
            Phase::Watching(_) => self.watch().await,
        }
    }

    /// Takes the first message; on a good one, subscribes and returns the configuration.
    async fn start(&mut self) -> Result<Bytes, Status> {
        let requests = self.requests.as_mut().expect("present while starting");
        let first = tokio::select! {
            biased;
            _ = self.closed.changed() => return Err(Status::unavailable("the server is closing")),
            first = tokio::time::timeout(FIRST_MESSAGE_WITHIN, requests.message()) => first,
        };
        let config = match first {
            Err(_) => Err(Status::invalid_argument(format!(
                "no initial_client_config within {FIRST_MESSAGE_WITHIN:?}"
            ))),
            Ok(Err(status)) => Err(status),
            Ok(Ok(None)) => {
                Err(Status::invalid_argument("the stream ended before its initial_client_config"))
            }
            Ok(Ok(Some(message))) => match message {
                WatchShardingAssignmentRequest {
                    initial_client_config: Some(config),
                    load_report: None,
                    assignment_ack: None,
                } => Ok(config),
                _ => Err(Status::invalid_argument(
                    "the first message must carry an initial_client_config and nothing else",
                )),
            },
        };
        let watching = config.and_then(|config| self.admit(config)).inspect_err(|status| {
            // A first message that is not a good initial_client_config, or that does
            // not decode (or, no message at all).
            if matches!(status.code(), Code::InvalidArgument | Code::OutOfRange | Code::Internal) {
                self.counters().invalid_messages.fetch_add(1, Ordering::Relaxed);
                self.counters().streams_ended_invalid.fetch_add(1, Ordering::Relaxed);
            }
        })?;
        let config = config_message(&self.service.settings, watching.quantum);
        self.phase = Phase::Watching(Box::new(watching));
        Ok(config)
    }

    /// Checks the client's configuration and subscribes to its job.
    fn admit(&self, config: InitialClientConfig) -> Result<Watching, Status> {
        let InitialClientConfig { target, client_uuid, latest_generation } = config;
        if !valid_job_name(&target) {
            return Err(Status::invalid_argument(format!(
                "target of {} bytes: a job name has 1 to {MAX_JOB_NAME_LEN}",
                target.len()
            )));
        }
        if client_uuid.is_empty() || client_uuid.len() > MAX_CLIENT_UUID_BYTES {
            return Err(Status::invalid_argument(format!(
                "client_uuid of {} bytes: it must have 1 to {MAX_CLIENT_UUID_BYTES}",
                client_uuid.len()
            )));
        }
        if !self.service.is_known(&target) {
            return Err(Status::not_found(format!("no job {target}")));
        }
        let mut subscription = self.service.distributor.subscribe(target.clone())?;
        // The current generation is unseen: it is sent at once if the client lacks it.
        subscription.updates().mark_changed();
        let slot = self.service.shared.generations.join(&target);
        // The job's task count as it is now sets the quantum when it is per task (and is
        // sent again when a generation of another count changes it).
        let quantum = quantum_now(&mut subscription, &self.service.settings);
        Ok(Watching {
            job: target,
            client: client_uuid,
            subscription,
            slot,
            latest: latest_generation,
            sending: None,
            quantum,
            config_due: None,
            unacked: Unacked::default(),
            invalid_in_a_row: 0,
            log: Throttle::default(),
        })
    }

    /// The next message of the generation being sent, or of the next newer one (after a
    /// configuration with its quantum, when that changed), taking the client's messages
    /// meanwhile.
    async fn watch(&mut self) -> Option<Result<Bytes, Status>> {
        let Phase::Watching(watching) = &mut self.phase else { unreachable!("watching") };
        loop {
            if let Some(config) = watching.config_due.take() {
                return Some(Ok(config));
            }
            if let Some((responses, sent)) = &mut watching.sending {
                let message = responses[*sent].clone();
                *sent += 1;
                if *sent == responses.len() {
                    watching.sending = None;
                }
                return Some(Ok(message));
            }
            let request = async {
                match self.requests.as_mut() {
                    Some(requests) => requests.message().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                // Closing first, then the client's messages (so that a flood of new
                // generations never starves its acks and reports), then the generations.
                biased;
                _ = self.closed.changed() => return None,
                message = request => match message {
                    Ok(Some(message)) => {
                        if let Err(status) = handle(&self.service, watching, self.peer, message) {
                            return Some(Err(status));
                        }
                    }
                    Ok(None) => self.requests = None,
                    Err(status) => {
                        // A message that does not decode ends the stream (the decoder cannot
                        // go on); a peer that went away is no one's fault.
                        if matches!(status.code(), Code::OutOfRange | Code::Internal) {
                            let counters = &self.service.shared.counters;
                            counters.invalid_messages.fetch_add(1, Ordering::Relaxed);
                            counters.streams_ended_invalid.fetch_add(1, Ordering::Relaxed);
                            tracing::warn!(job = %watching.job, client = %watching.client, peer = ?self.peer, %status,
                                "autosharding: undecodable message; stream ended");
                        }
                        return Some(Err(status));
                    }
                },
                changed = watching.subscription.updates().changed() => {
                    changed.ok()?;
                    let settings = &self.service.settings;
                    let newest = watching
                        .slot
                        .newest(&mut watching.subscription, &self.service.names, settings.max_chunk_bytes)
                        .await;
                    if let Some((generation, responses)) = newest {
                        let generation = i64::try_from(generation).unwrap_or(i64::MAX);
                        if generation > watching.latest {
                            let quantum = quantum_now(&mut watching.subscription, settings);
                            if quantum != watching.quantum {
                                watching.quantum = quantum;
                                watching.config_due = Some(config_message(settings, quantum));
                            }
                            watching.latest = generation;
                            watching.unacked.sent(generation);
                            watching.sending = Some((responses, 0));
                        }
                    }
                }
            }
        }
    }

    fn counters(&self) -> &super::Counters {
        &self.service.shared.counters
    }
}

/// The load quantum for the job's task count as `subscription` has it now.
fn quantum_now(subscription: &mut Subscription, settings: &super::Settings) -> f64 {
    settings.quantum.fraction(subscription.updates().borrow().as_ref().map(|p| p.tasks))
}

/// The `LoadReportingConfig` message with load quantum `quantum` and the service's other
/// settings.
fn config_message(settings: &super::Settings, quantum: f64) -> Bytes {
    let duration = |d: Duration| prost_types::Duration::try_from(d).ok();
    let response = WatchShardingAssignmentResponse {
        config: Some(LoadReportingConfig {
            load_quantum_fraction: quantum,
            max_load_balancing_resolution_bytes: i32::try_from(settings.rules.resolution_bytes).unwrap_or(8),
            load_reporting_interval: duration(settings.interval),
            load_report_start_threshold: duration(settings.rules.start_threshold),
        }),
        ..Default::default()
    };
    Bytes::from(response.encode_to_vec())
}

/// Takes one client message after the first; the error ends the stream.
fn handle(
    service: &Autosharding,
    watching: &mut Watching,
    peer: Option<SocketAddr>,
    message: WatchShardingAssignmentRequest,
) -> Result<(), Status> {
    let counters = &service.shared.counters;
    let outcome = match message {
        WatchShardingAssignmentRequest {
            initial_client_config: None,
            load_report: Some(report),
            assignment_ack: None,
        } => take_report(service, watching, &report),
        WatchShardingAssignmentRequest {
            initial_client_config: None,
            load_report: None,
            assignment_ack: Some(ack),
        } => take_ack(service, watching, peer, ack),
        WatchShardingAssignmentRequest {
            initial_client_config: Some(_),
            load_report: None,
            assignment_ack: None,
        } => Err("a second initial_client_config".to_owned()),
        _ => Err("a message must set exactly one of load_report and assignment_ack".to_owned()),
    };
    let Err(why) = outcome else {
        watching.invalid_in_a_row = 0;
        return Ok(());
    };
    counters.invalid_messages.fetch_add(1, Ordering::Relaxed);
    watching.invalid_in_a_row += 1;
    if watching.invalid_in_a_row >= service.settings.max_invalid_in_a_row {
        counters.streams_ended_invalid.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(job = %watching.job, client = %watching.client, ?peer, %why,
            in_a_row = watching.invalid_in_a_row, "autosharding: too many invalid messages; stream ended");
        return Err(Status::invalid_argument(format!(
            "{} invalid messages in a row; the last: {why}",
            watching.invalid_in_a_row
        )));
    }
    if let Some(suppressed) = watching.log.allow() {
        tracing::debug!(job = %watching.job, client = %watching.client, ?peer, %why, suppressed,
            "autosharding: invalid message");
    }
    Ok(())
}

/// A load report: validated and handed to the sink; `Err`: why it is invalid.
fn take_report(service: &Autosharding, watching: &Watching, report: &LoadReport) -> Result<(), String> {
    let counters = &service.shared.counters;
    match validate(report, &service.settings.rules, SystemTime::now()) {
        Ok(rates) => {
            counters.reports_accepted.fetch_add(1, Ordering::Relaxed);
            if let Some(sink) = &service.sink {
                sink.accept(&watching.job, &watching.client, rates);
            }
            Ok(())
        }
        Err(error) => {
            counters.reports_invalid.fetch_add(1, Ordering::Relaxed);
            Err(error.to_string())
        }
    }
}

/// An ack: counted, a rejection kept and logged; `Err`: it acks a generation not sent.
fn take_ack(
    service: &Autosharding,
    watching: &mut Watching,
    peer: Option<SocketAddr>,
    ack: AssignmentAck,
) -> Result<(), String> {
    let counters = &service.shared.counters;
    let AssignmentAck { generation, accepted, error_message } = ack;
    if !watching.unacked.ack(generation) {
        counters.acks_invalid.fetch_add(1, Ordering::Relaxed);
        return Err(format!("an ack of generation {generation}, not sent on this stream or acked already"));
    }
    if accepted {
        counters.acks_accepted.fetch_add(1, Ordering::Relaxed);
        return Ok(());
    }
    counters.acks_rejected.fetch_add(1, Ordering::Relaxed);
    let rejection = AckRejection {
        client: watching.client.clone(),
        generation,
        message: error_message,
        at: SystemTime::now(),
    };
    if let Some(suppressed) = watching.log.allow() {
        tracing::warn!(job = %watching.job, client = %watching.client, ?peer, generation,
            message = %steady_proto::autosharding::reassembly::bounded(rejection.message.clone()),
            suppressed, "autosharding: a client rejected an assignment");
    }
    service.shared.rejections.note(&watching.job, rejection);
    Ok(())
}

/// At most one log line per [`LOG_EVERY`] for one stream.
#[derive(Debug, Default)]
struct Throttle {
    last: Option<Instant>,
    suppressed: u64,
}

impl Throttle {
    /// `Some(lines not logged since the last one)` if a line may be logged now.
    fn allow(&mut self) -> Option<u64> {
        let now = Instant::now();
        if self.last.is_some_and(|last| now.duration_since(last) < LOG_EVERY) {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }
}
