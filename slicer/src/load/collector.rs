//! [`LoadCollector`]: the server of `LoadCollector.Report`, which takes the Slicelets'
//! report streams into a [`LoadBook`]. The client is `Slicelet::report_to`.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use steady_proto::load as load_proto;
use steady_proto::load::load_collector_server::{self, LoadCollectorServer};
use steady_proto::load::ReportSummary;
use tokio::sync::watch;
use tonic::{Code, Request, Response, Status, Streaming};

use super::book::LoadBook;
use super::reporters::ReporterNames;
#[cfg(doc)]
use steady_core::MAX_JOB_NAME_LEN;
use steady_slicelet::report::{LoadReport, MAX_REPORTED_KEYS, MAX_REPORTED_SLICES};

/// The largest report message the collector decodes ([`LoadCollector::max_message_bytes`]).
const MAX_REPORT_MESSAGE_BYTES: usize = 128 * 1024;

/// The default of [`LoadCollector::with_max_invalid_in_a_row`].
const MAX_INVALID_IN_A_ROW: u32 = 8;

/// The default of [`LoadCollector::with_max_streams`].
const MAX_REPORT_STREAMS: usize = 16_384;

// The bound above must hold for the largest valid report (with room for framing).
const _: () = assert!(MAX_REPORT_MESSAGE_BYTES > (MAX_REPORTED_SLICES + MAX_REPORTED_KEYS) * 20 + 512);

/// How many refusing peers are remembered so that each is logged once; past it, refusals
/// are still counted but no longer logged one by one.
const MAX_LOGGED_REFUSED_PEERS: usize = 1024;

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) invalid: AtomicU64,
    streams_ended_invalid: AtomicU64,
    pub(crate) open_streams: AtomicUsize,
    pub(crate) refused: AtomicU64,
    /// The peers whose refusals were logged (bounded by [`MAX_LOGGED_REFUSED_PEERS`]).
    refused_peers: Mutex<HashSet<String>>,
}

/// The server side of load reporting: validates every report a Slicelet streams and
/// hands the valid ones to its [`LoadBook`].
///
/// Clone it freely (clones share the book, the counters and the stream limit). Serve it
/// with `tonic::transport::Server::builder().add_service(collector.service())`.
///
/// # What a peer can cost
///
/// * **Memory**: nothing a peer sends is kept but its task's latest report, in the
///   [`LoadBook`] (bounded by the jobs and tasks the Assigner names). Messages over
///   [`LoadCollector::max_message_bytes`] are refused before they are buffered; at most
///   [`LoadCollector::max_streams`] streams are open at once.
/// * **Work**: one validation and one [`LoadBook::accept`] per message. A stream that
///   sends [`LoadCollector::max_invalid_in_a_row`] invalid messages in a row is ended. How fast a peer
///   may send valid reports is the server's to limit (tonic's
///   `Server::builder().concurrency_limit_per_connection`, HTTP/2 flow control).
///
/// # Counters
///
/// A message is either *invalid* (it does not decode, its version is not 1, or the
/// report is not valid: [`LoadCollector::invalid`]) or a valid report, which the book
/// then *accepts* or *drops* (unknown job, task or generation: [`LoadBook::accepted`],
/// [`LoadBook::dropped`]). Each stream's own counts come back in its `ReportSummary`.
///
/// # Who may report (feature `tls`)
///
/// By default any peer that reaches the collector may report for any known task, so the
/// server must be reachable only by the job's backends. With
/// [`LoadCollector::authorize_reporters`] and a server that verifies client certificates
/// (tonic's `ServerTlsConfig::client_ca_root`), a report for task `i` of job `J` is
/// accepted only from a peer whose certificate holds a name that [`ReporterNames`] maps
/// to `i` for `J`: a stream without a client certificate, or one that sends a report for
/// another task, ends with `PERMISSION_DENIED` and nothing of it reaches the book. Each
/// refusal is counted ([`LoadCollector::refused`]) and logged once per peer.
#[derive(Debug, Clone)]
pub struct LoadCollector {
    book: LoadBook,
    /// Who may report for which task; `None`: anyone.
    reporters: Option<ReporterNames>,
    pub(crate) counters: Arc<Counters>,
    /// Bumped by [`LoadCollector::close_streams`]: every open stream ends.
    epoch: watch::Sender<u64>,
    max_invalid_in_a_row: u32,
    max_streams: usize,
}

impl LoadCollector {
    /// A collector that feeds `book`.
    pub fn new(book: LoadBook) -> Self {
        Self {
            book,
            reporters: None,
            counters: Arc::default(),
            epoch: watch::Sender::new(0),
            max_invalid_in_a_row: MAX_INVALID_IN_A_ROW,
            max_streams: MAX_REPORT_STREAMS,
        }
    }

    /// Ends a stream (with `INVALID_ARGUMENT`) after `max` invalid messages in a row
    /// (default 8; at least 1: 0 counts as 1): a peer that only sends garbage gets no
    /// more of the collector's work than this per stream. "In a row" means with no
    /// accepted report between them (reports that are valid but dropped do not count
    /// either way).
    pub fn with_max_invalid_in_a_row(mut self, max: u32) -> Self {
        self.max_invalid_in_a_row = max.max(1);
        self
    }

    /// Allows `max` open streams at once (default 16,384); one more fails with
    /// `RESOURCE_EXHAUSTED`. One per backend task is the expected use.
    pub fn with_max_streams(mut self, max: usize) -> Self {
        self.max_streams = max;
        self
    }

    /// How many invalid messages in a row end a stream
    /// ([`LoadCollector::with_max_invalid_in_a_row`]).
    pub fn max_invalid_in_a_row(&self) -> u32 {
        self.max_invalid_in_a_row
    }

    /// How many report streams may be open at once ([`LoadCollector::with_max_streams`]).
    pub fn max_streams(&self) -> usize {
        self.max_streams
    }

    /// The largest report message the collector decodes, in bytes (128 KiB): above any
    /// report `steady-slicelet` builds (a message with [`MAX_REPORTED_SLICES`] slices,
    /// [`MAX_REPORTED_KEYS`] keys and a job name of [`MAX_JOB_NAME_LEN`] bytes takes about
    /// 84 KiB). A larger one ends its stream with `OUT_OF_RANGE` before it is buffered
    /// (counted as invalid).
    pub fn max_message_bytes(&self) -> usize {
        MAX_REPORT_MESSAGE_BYTES
    }

    /// Accepts a report only from a peer whose client certificate names its task (see
    /// "Who may report"). The server must verify client certificates
    /// (`ServerTlsConfig::client_ca_root`): without them every stream is refused.
    #[cfg(feature = "tls")]
    pub fn authorize_reporters(mut self, names: ReporterNames) -> Self {
        self.reporters = Some(names);
        self
    }

    /// Who may report for which task, when reports are authorized.
    pub fn reporters(&self) -> Option<&ReporterNames> {
        self.reporters.as_ref()
    }

    /// Streams refused because their peer may not report what it sent (no client
    /// certificate, or a report for a task its certificate does not name).
    pub fn refused(&self) -> u64 {
        self.counters.refused.load(Ordering::Relaxed)
    }

    /// The book it feeds.
    pub fn book(&self) -> &LoadBook {
        &self.book
    }

    /// The tonic service to add to a server (decoding messages of at most
    /// [`LoadCollector::max_message_bytes`]).
    pub fn service(&self) -> LoadCollectorServer<Self> {
        LoadCollectorServer::new(self.clone()).max_decoding_message_size(MAX_REPORT_MESSAGE_BYTES)
    }

    /// Messages refused as invalid so far, over all streams.
    pub fn invalid(&self) -> u64 {
        self.counters.invalid.load(Ordering::Relaxed)
    }

    /// Streams ended for sending too many invalid messages in a row (or one that could
    /// not be decoded).
    pub fn streams_ended_invalid(&self) -> u64 {
        self.counters.streams_ended_invalid.load(Ordering::Relaxed)
    }

    /// Report streams open now.
    pub fn open_streams(&self) -> usize {
        self.counters.open_streams.load(Ordering::Relaxed)
    }

    /// Ends every open stream with `UNAVAILABLE` (reporters reconnect). Call it before a
    /// graceful server shutdown, which otherwise waits for the streams, which the
    /// reporters never end on their own.
    pub fn close_streams(&self) {
        self.epoch.send_modify(|e| *e += 1);
    }

    fn open_stream(&self) -> Result<OpenStream, Status> {
        let open = &self.counters.open_streams;
        let admitted = open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < self.max_streams).then_some(n + 1));
        match admitted {
            Ok(_) => Ok(OpenStream { counters: self.counters.clone() }),
            Err(n) => Err(Status::resource_exhausted(format!(
                "{n} report streams are open (limit {})",
                self.max_streams
            ))),
        }
    }

    /// Counts a refusal and logs it, once per peer (up to [`MAX_LOGGED_REFUSED_PEERS`]
    /// peers), and returns the status that ends the stream.
    fn refuse(&self, peer: &str, why: String) -> Status {
        self.counters.refused.fetch_add(1, Ordering::Relaxed);
        let mut logged = self.counters.refused_peers.lock().unwrap_or_else(|e| e.into_inner());
        if logged.len() < MAX_LOGGED_REFUSED_PEERS && logged.insert(peer.to_owned()) {
            tracing::warn!(%peer, %why, "load collector: report refused (logged once per peer)");
        } else if logged.len() == MAX_LOGGED_REFUSED_PEERS && logged.insert(String::new()) {
            tracing::warn!("load collector: {MAX_LOGGED_REFUSED_PEERS} peers refused; further peers are counted, not logged");
        }
        Status::permission_denied(why)
    }

    /// Counts an invalid message on `summary`; returns whether the stream has sent too
    /// many in a row.
    fn count_invalid(&self, summary: &mut ReportSummary, in_a_row: &mut u32) -> bool {
        self.counters.invalid.fetch_add(1, Ordering::Relaxed);
        summary.invalid += 1;
        *in_a_row += 1;
        *in_a_row >= self.max_invalid_in_a_row
    }
}

/// One admitted stream; dropping it frees its place.
#[derive(Debug)]
struct OpenStream {
    pub(crate) counters: Arc<Counters>,
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.counters.open_streams.fetch_sub(1, Ordering::AcqRel);
    }
}

#[tonic::async_trait]
impl load_collector_server::LoadCollector for LoadCollector {
    /// Takes one Slicelet's reports until it ends the stream, then answers with what
    /// became of them.
    ///
    /// # Errors
    ///
    /// `RESOURCE_EXHAUSTED` when the most streams allowed are open; `INVALID_ARGUMENT`
    /// after too many invalid messages in a row; the decoding error (`OUT_OF_RANGE` for a
    /// message over [`LoadCollector::max_message_bytes`], `INTERNAL` for one that is not
    /// protobuf); `UNAVAILABLE` after [`LoadCollector::close_streams`].
    async fn report(
        &self,
        request: Request<Streaming<load_proto::LoadReport>>,
    ) -> Result<Response<ReportSummary>, Status> {
        let _open = self.open_stream()?;
        let peer = request.remote_addr();
        // Who the peer is, when reports are authorized: the names in its certificate.
        let certified = match &self.reporters {
            None => None,
            Some(reporters) => match certificate_names(&request) {
                Some(names) => Some((reporters, names)),
                None => {
                    let from = peer.map_or_else(|| "an unknown address".to_owned(), |a| a.ip().to_string());
                    return Err(self.refuse(
                        &format!("no certificate from {from}"),
                        "load reports need a client certificate naming the task".to_owned(),
                    ));
                }
            },
        };
        let mut messages = request.into_inner();
        let mut closed = self.epoch.subscribe();
        let mut summary = ReportSummary::default();
        let mut invalid_in_a_row = 0;
        loop {
            let message = tokio::select! {
                // Closing first: a collector shutting down stops reading at once, even from
                // a peer whose messages are always ready.
                biased;
                _ = closed.changed() => return Err(Status::unavailable("the load collector is closing")),
                message = messages.message() => message,
            };
            let message = match message {
                Ok(Some(message)) => message,
                Ok(None) => return Ok(Response::new(summary)),
                Err(status) => {
                    // A message that does not decode ends the stream (the decoder cannot go
                    // on); a peer that went away is no one's fault.
                    if matches!(status.code(), Code::OutOfRange | Code::Internal) {
                        self.count_invalid(&mut summary, &mut invalid_in_a_row);
                        self.counters.streams_ended_invalid.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(?peer, %status, "load collector: undecodable report; stream ended");
                    }
                    return Err(status);
                }
            };
            let report = match LoadReport::try_from(message) {
                Ok(report) => report,
                Err(error) => {
                    tracing::debug!(?peer, %error, "load collector: invalid report");
                    if self.count_invalid(&mut summary, &mut invalid_in_a_row) {
                        self.counters.streams_ended_invalid.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(?peer, invalid_in_a_row, %error, "load collector: stream ended");
                        return Err(Status::invalid_argument(format!(
                            "{invalid_in_a_row} invalid load reports in a row; the last: {error}"
                        )));
                    }
                    continue;
                }
            };
            let (job, task, generation) = (report.job().to_owned(), report.task(), report.generation());
            if let Some((reporters, names)) = &certified {
                if !reporters.allows(names.iter().map(String::as_str), &job, task) {
                    let peer = names.join(",");
                    let why = format!(
                        "a client certificate naming [{peer}] may not report for task {task} of job {job} \
                         (reporter names: {reporters})"
                    );
                    return Err(self.refuse(&peer, why));
                }
            }
            match self.book.accept(report) {
                Ok(()) => {
                    // Only an accepted report clears the count: a peer cannot keep a
                    // garbage stream open by mixing in cheap reports that are dropped.
                    invalid_in_a_row = 0;
                    summary.accepted += 1;
                }
                Err(reason) => {
                    summary.dropped += 1;
                    tracing::debug!(?peer, %job, task, generation, %reason, "load collector: report dropped");
                }
            }
        }
    }
}

/// The DNS names (subject alternative names) of the peer's certificate, when it sent
/// one the server verified.
#[cfg(feature = "tls")]
fn certificate_names<T>(request: &Request<T>) -> Option<Vec<String>> {
    let chain = request.peer_certs()?;
    let leaf = webpki::EndEntityCert::try_from(chain.first()?).ok()?;
    Some(leaf.valid_dns_names().map(str::to_owned).collect())
}

/// Without TLS there are no certificates (and no way to authorize reporters).
#[cfg(not(feature = "tls"))]
fn certificate_names<T>(_: &Request<T>) -> Option<Vec<String>> {
    None
}
