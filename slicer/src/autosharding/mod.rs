//! [`Autosharding`]: gRPC's autosharding protocol (gRFC A119,
//! `google.cloud.autosharding.v1.AutoshardingService/WatchShardingAssignment`) served
//! beside steady's own Watch, from the same [`Distributor`].
//!
//! A client opens one bidirectional stream per job and names it first (its
//! `initial_client_config`: `target` is the job's name). The server answers with its
//! `LoadReportingConfig`, then the job's assignment if it is newer than the client's
//! `latest_generation`, then each newer one, every assignment as chunks closed by its
//! metadata. The client acks each assignment and reports the load it sent per key range;
//! valid reports go to a [`ClientLoadSink`].
//!
//! * Each (job, generation) is encoded once, with the job's [`EndpointNames`] as they are
//!   then, and the same bytes go to every stream: a generation costs one encoding and a
//!   copy per client, as it does on Watch.
//! * Streams count against the Distributor's limits (watchers, unpublished jobs) like its
//!   own watchers, and end with them on [`Distributor::close_watchers`].
//!
//! ```no_run
//! use steady_slicer::autosharding::Autosharding;
//! use steady_slicer::Distributor;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let distributor = Distributor::new();
//! let autosharding = Autosharding::new(distributor.clone())
//!     .with_client_load(|job: &str, client: &str, rates| println!("{job} {client}: {rates:?}"));
//! tonic::transport::Server::builder()
//!     .add_service(distributor.service())
//!     .add_service(autosharding.service())
//!     .serve("127.0.0.1:50051".parse()?)
//!     .await?;
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use steady_proto::autosharding::ranges::{RangeRates, ReportRules};
use steady_proto::autosharding::v1::WatchShardingAssignmentRequest;
use steady_proto::autosharding::{EncodedAutosharding, EncodedAutoshardingServer, EncodedAutoshardingStream};
use tonic::{Status, Streaming};

use crate::load::LoadBook;
use crate::Distributor;

mod acks;
mod generations;
mod names;
mod stream;

pub use acks::{AckRejection, KEPT_REJECTIONS};
pub use names::{EndpointNames, MAX_ENDPOINT_NAME_BYTES, NAMES_WAIT};

/// The longest `client_uuid` taken, in bytes.
pub const MAX_CLIENT_UUID_BYTES: usize = 128;

/// The tonic service of an [`Autosharding`] (made by [`Autosharding::service`]): add it to
/// a server like any generated one.
pub type AutoshardingServer = EncodedAutoshardingServer<Autosharding>;

/// Where the load clients report goes: each valid report of a client (its `client_uuid`)
/// on a job, as rates per key range of steady's balanced metric.
///
/// Called on the stream's task for each valid report, so it must not block. Any
/// `Fn(&str, &str, RangeRates)` is one.
pub trait ClientLoadSink: Send + Sync + 'static {
    /// Takes `client`'s report on `job`.
    fn accept(&self, job: &str, client: &str, rates: RangeRates);
}

impl<F> ClientLoadSink for F
where
    F: Fn(&str, &str, RangeRates) + Send + Sync + 'static,
{
    fn accept(&self, job: &str, client: &str, rates: RangeRates) {
        self(job, client, rates);
    }
}

/// The Assigner's book takes each report as the client's latest
/// ([`LoadBook::accept_client`]); a report it drops (a job no Assigner here runs, an
/// overlong client id, too many ranges) is counted there.
impl ClientLoadSink for LoadBook {
    fn accept(&self, job: &str, client: &str, rates: RangeRates) {
        if let Err(dropped) = self.accept_client(job, client, rates) {
            tracing::debug!(job, %dropped, "autosharding: a client's load report was dropped");
        }
    }
}

/// Which jobs may be watched before anything is published for them.
type KnownJobs = dyn Fn(&str) -> bool + Send + Sync;

/// The server of A119 over a [`Distributor`]'s jobs; see the module documentation.
///
/// Clone it freely: clones share the counters, the encoded generations and the names.
/// Configure it before cloning (the `with_` methods change this value only).
///
/// # Protocol, and what each error means
///
/// * The first message must be an `initial_client_config`, sent within 10 seconds:
///   otherwise `INVALID_ARGUMENT`. Its `target` must be a valid job name
///   (`INVALID_ARGUMENT`) of a known job: published in the Distributor, or accepted by
///   [`Autosharding::with_known_jobs`] (`NOT_FOUND`); its `client_uuid` must have 1 to
///   [`MAX_CLIENT_UUID_BYTES`] bytes (`INVALID_ARGUMENT`). The Distributor's limits give
///   `RESOURCE_EXHAUSTED`.
/// * Every later message must set exactly one of `load_report` and `assignment_ack`.
///   Anything else (no field, several, a second `initial_client_config`), an ack of a
///   generation not sent on the stream (or acked already, or one of more than 16 sent
///   since), and a report that [`ranges::validate`] refuses are *invalid*: counted, and
///   after [`Autosharding::max_invalid_in_a_row`] of them with no valid message between,
///   the stream ends with `INVALID_ARGUMENT`. A message that does not decode (or is over
///   1 MiB: `OUT_OF_RANGE`) ends it at once.
/// * A rejected ack (`accepted: false`) is valid: counted, logged at warn (at most once a
///   minute per stream, with how many were not logged) and kept for the status page
///   ([`Autosharding::rejections`]).
/// * A client that half-closes its side keeps receiving assignments. The stream ends
///   without an error on [`Distributor::close_watchers`] (clients reconnect with their
///   generation).
///
/// # What a client can cost
///
/// Per stream: its place among the Distributor's watchers, the last 16 generations sent
/// (for acks) and the chunks of the generation being sent (shared). Per job with
/// streams: one encoded generation. Per job with rejections: the last
/// [`KEPT_REJECTIONS`] (at most 4,096 jobs). Nothing a client sends is kept but that.
///
/// [`ranges::validate`]: steady_proto::autosharding::ranges::validate
#[derive(Clone)]
pub struct Autosharding {
    distributor: Distributor,
    names: EndpointNames,
    sink: Option<Arc<dyn ClientLoadSink>>,
    known_jobs: Option<Arc<KnownJobs>>,
    settings: Settings,
    pub(crate) shared: Arc<Shared>,
}

impl fmt::Debug for Autosharding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Autosharding")
            .field("names", &self.names)
            .field("sink", &self.sink.is_some())
            .field("known_jobs", &self.known_jobs.is_some())
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// What the server tells clients and what it takes from them.
#[derive(Debug, Clone)]
struct Settings {
    quantum: Quantum,
    interval: Duration,
    max_chunk_bytes: usize,
    max_invalid_in_a_row: u32,
    rules: ReportRules,
}

/// The state every clone shares.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    counters: Counters,
    generations: Arc<generations::Generations>,
    rejections: acks::Rejections,
}

/// What the metrics read: streams open, acks (accepted, rejected, invalid), reports
/// (accepted, invalid), generations encoded.
#[cfg(feature = "metrics")]
pub(crate) type Figures = (usize, [u64; 3], [u64; 2], u64);

impl Shared {
    #[cfg(feature = "metrics")]
    pub(crate) fn figures(&self) -> Figures {
        let c = &self.counters;
        let n = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        (
            c.open_streams.load(Ordering::Relaxed),
            [n(&c.acks_accepted), n(&c.acks_rejected), n(&c.acks_invalid)],
            [n(&c.reports_accepted), n(&c.reports_invalid)],
            self.generations.encodings(),
        )
    }
}

#[derive(Debug, Default)]
struct Counters {
    open_streams: AtomicUsize,
    acks_accepted: AtomicU64,
    acks_rejected: AtomicU64,
    acks_invalid: AtomicU64,
    reports_accepted: AtomicU64,
    reports_invalid: AtomicU64,
    invalid_messages: AtomicU64,
    streams_ended_invalid: AtomicU64,
}

/// The quantum sent for a job nothing is published for yet, when the quantum is per task
/// (the default; see [`Autosharding::with_load_quantum`]).
pub const DEFAULT_LOAD_QUANTUM: f64 = 0.01;

/// The quantum sent to the clients of a job of `tasks` tasks by default: `1 / (16 *
/// tasks)`, within `[1/1024, 1/20]`.
pub fn quantum_per_task(tasks: usize) -> f64 {
    (1.0 / (16.0 * tasks.max(1) as f64)).clamp(1.0 / 1024.0, 1.0 / 20.0)
}

/// The most load one reported range may carry, as a share of a client's total.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Quantum {
    /// The same for every job.
    Fixed(f64),
    /// `1 / (16 * tasks)`, within `[1/1024, 1/20]`: each range well under one task's
    /// share, so that the Assigner sees where within a task's load it could split.
    PerTask,
}

impl Quantum {
    /// The fraction sent for a job of `tasks` tasks (`None`: unknown yet).
    fn fraction(self, tasks: Option<usize>) -> f64 {
        match (self, tasks) {
            (Self::Fixed(fraction), _) => fraction,
            (Self::PerTask, None | Some(0)) => DEFAULT_LOAD_QUANTUM,
            (Self::PerTask, Some(tasks)) => quantum_per_task(tasks),
        }
    }
}
/// The default of [`Autosharding::with_report_interval`].
pub const DEFAULT_REPORT_INTERVAL: Duration = Duration::from_secs(10);
/// The default of [`Autosharding::with_report_start_threshold`].
pub const DEFAULT_REPORT_START_THRESHOLD: Duration = Duration::from_secs(300);
/// The default of [`Autosharding::with_max_invalid_in_a_row`].
const MAX_INVALID_IN_A_ROW: u32 = 8;

impl Autosharding {
    /// Serves `distributor`'s jobs, every task named by its index, valid load reports
    /// counted and dropped (until [`Autosharding::with_client_load`]).
    pub fn new(distributor: Distributor) -> Self {
        let rules = ReportRules { start_threshold: DEFAULT_REPORT_START_THRESHOLD, ..ReportRules::default() };
        Self {
            distributor,
            names: EndpointNames::new(),
            sink: None,
            known_jobs: None,
            settings: Settings {
                quantum: Quantum::PerTask,
                interval: DEFAULT_REPORT_INTERVAL,
                max_chunk_bytes: steady_proto::autosharding::chunks::DEFAULT_MAX_CHUNK_BYTES,
                max_invalid_in_a_row: MAX_INVALID_IN_A_ROW,
                rules,
            },
            shared: Arc::default(),
        }
    }

    /// Hands each valid load report to `sink`.
    pub fn with_client_load(mut self, sink: impl ClientLoadSink) -> Self {
        self.sink = Some(Arc::new(sink));
        self
    }

    /// Names tasks from `names` (shared: the program keeps it current).
    pub fn with_endpoint_names(mut self, names: EndpointNames) -> Self {
        self.names = names;
        self
    }

    /// Also takes streams for the jobs `known` accepts before anything is published for
    /// them (the fleet's jobs with a spec): they wait for the first generation. A job
    /// published is always known.
    pub fn with_known_jobs(mut self, known: impl Fn(&str) -> bool + Send + Sync + 'static) -> Self {
        self.known_jobs = Some(Arc::new(known));
        self
    }

    /// Asks clients to keep each reported range at most `fraction` of their total load,
    /// for every job (clamped to `[1/1024, 1]`, so that a conforming report stays within
    /// the 4,096 ranges a report may have; not a number: per task). By default the
    /// quantum is per task: `1 / (16 * tasks)` of the job's assignment, within
    /// `[1/1024, 1/20]` (0.01 before the job's first assignment), sent when the stream
    /// starts and again before a generation whose task count changes it. In the
    /// sharding simulation a fixed 0.01 balanced 10 tasks to 1.12 but 50 to 1.52; ranges
    /// well under a task's share are what the Assigner needs to place load finely.
    pub fn with_load_quantum(mut self, fraction: f64) -> Self {
        self.settings.quantum = if fraction.is_nan() {
            Quantum::PerTask
        } else {
            Quantum::Fixed(fraction.clamp(1.0 / 1024.0, 1.0))
        };
        self
    }

    /// Asks clients to report every `interval` (default 10 s; at least 1 ms).
    pub fn with_report_interval(mut self, interval: Duration) -> Self {
        self.settings.interval = interval.max(Duration::from_millis(1));
        self
    }

    /// Takes reports that start at most `threshold` ago (default 5 minutes), and tells
    /// clients so.
    pub fn with_report_start_threshold(mut self, threshold: Duration) -> Self {
        self.settings.rules.start_threshold = threshold;
        // A report may then cover all of it.
        self.settings.rules.max_interval = self.settings.rules.max_interval.max(threshold);
        self
    }

    /// Splits assignments into chunks of at most `bytes` encoded (default 64 KiB; never
    /// less than `chunks::MIN_MAX_CHUNK_BYTES`, 8 KiB).
    pub fn with_max_chunk_bytes(mut self, bytes: usize) -> Self {
        self.settings.max_chunk_bytes = bytes;
        self
    }

    /// Ends a stream after `max` invalid messages in a row (default 8; 0 counts as 1).
    pub fn with_max_invalid_in_a_row(mut self, max: u32) -> Self {
        self.settings.max_invalid_in_a_row = max.max(1);
        self
    }

    /// How many invalid messages in a row end a stream.
    pub fn max_invalid_in_a_row(&self) -> u32 {
        self.settings.max_invalid_in_a_row
    }

    /// The names it gives tasks.
    pub fn endpoint_names(&self) -> &EndpointNames {
        &self.names
    }

    /// The distributor it serves from.
    pub fn distributor(&self) -> &Distributor {
        &self.distributor
    }

    /// The tonic service to add to a server (requests of at most 1 MiB).
    pub fn service(&self) -> AutoshardingServer {
        EncodedAutoshardingServer::new(self.clone())
    }

    /// A119 streams open now (each also one of the Distributor's watchers once it named
    /// its job).
    pub fn open_streams(&self) -> usize {
        self.shared.counters.open_streams.load(Ordering::Relaxed)
    }

    /// Acks that accepted an assignment.
    pub fn acks_accepted(&self) -> u64 {
        self.shared.counters.acks_accepted.load(Ordering::Relaxed)
    }

    /// Acks that rejected one (the client keeps the one it had).
    pub fn acks_rejected(&self) -> u64 {
        self.shared.counters.acks_rejected.load(Ordering::Relaxed)
    }

    /// Acks of a generation not sent on their stream (or acked already): invalid.
    pub fn acks_invalid(&self) -> u64 {
        self.shared.counters.acks_invalid.load(Ordering::Relaxed)
    }

    /// Valid load reports (handed to the sink, if any).
    pub fn reports_accepted(&self) -> u64 {
        self.shared.counters.reports_accepted.load(Ordering::Relaxed)
    }

    /// Load reports refused as invalid.
    pub fn reports_invalid(&self) -> u64 {
        self.shared.counters.reports_invalid.load(Ordering::Relaxed)
    }

    /// Invalid messages of every kind (invalid acks and reports included).
    pub fn invalid_messages(&self) -> u64 {
        self.shared.counters.invalid_messages.load(Ordering::Relaxed)
    }

    /// Streams ended for invalid messages (too many in a row, one that did not decode, a
    /// bad first message).
    pub fn streams_ended_invalid(&self) -> u64 {
        self.shared.counters.streams_ended_invalid.load(Ordering::Relaxed)
    }

    /// Generations encoded so far, over all jobs (one per job and generation that had
    /// streams to send it to).
    pub fn encodings(&self) -> u64 {
        self.shared.generations.encodings()
    }

    /// How many jobs have an encoded generation held now (those with streams).
    pub fn encoded_jobs(&self) -> usize {
        self.shared.generations.jobs()
    }

    /// `job`'s last rejected acks, oldest first (at most [`KEPT_REJECTIONS`]).
    pub fn rejections(&self, job: &str) -> Vec<AckRejection> {
        self.shared.rejections.of(job)
    }

    /// Whether streams may watch `job`.
    fn is_known(&self, job: &str) -> bool {
        self.distributor.is_published(job) || self.known_jobs.as_ref().is_some_and(|known| known(job))
    }
}

impl EncodedAutosharding for Autosharding {
    fn watch_sharding_assignment(
        &self,
        request: tonic::Request<Streaming<WatchShardingAssignmentRequest>>,
    ) -> Result<EncodedAutoshardingStream, Status> {
        Ok(stream::open(self.clone(), request))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_quantum_per_task_keeps_each_range_well_under_a_task_s_share() {
        assert_eq!(Quantum::PerTask.fraction(None), DEFAULT_LOAD_QUANTUM);
        assert_eq!(Quantum::PerTask.fraction(Some(2)), 1.0 / 32.0);
        assert_eq!(Quantum::PerTask.fraction(Some(20)), 1.0 / 320.0);
        assert_eq!(Quantum::PerTask.fraction(Some(1)), 1.0 / 20.0, "at most 1/20");
        assert_eq!(
            Quantum::PerTask.fraction(Some(5000)),
            1.0 / 1024.0,
            "at least 1/1024: reports stay small"
        );
        assert_eq!(Quantum::Fixed(0.2).fraction(Some(20)), 0.2);
    }
}
