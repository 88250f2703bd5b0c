//! [`LoadReporter`]: the task that streams a Slicelet's load reports to a
//! `LoadCollector` (the client of `LoadCollector.Report`), reconnecting with backoff.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::Stream;
use steady_core::Backoff;
use steady_proto::load as load_proto;
use steady_proto::load::load_collector_client::LoadCollectorClient;
use steady_subset::prng::SplitMix64;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};
use tonic::transport::Endpoint;

#[cfg(feature = "tls")]
use steady_proto::tls::ClientTlsSource;

use super::Slicelet;

/// The shortest reporting interval: a shorter one is raised to it (a zero interval
/// would make the ticker spin).
pub const MIN_REPORT_INTERVAL: Duration = Duration::from_millis(1);

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) sent: AtomicU64,
    pub(crate) streams: AtomicU64,
    /// Connection attempts that failed and streams that broke.
    pub(crate) failed: AtomicU64,
}

/// The task that streams a [`Slicelet`]'s load reports for one job to a
/// `LoadCollector` (made by [`Slicelet::report_to`]).
///
/// It connects, opens one `LoadCollector.Report` stream and sends
/// [`Slicelet::load_report`] every interval on it (the first at once), skipping the
/// ticks when there is nothing to report (no assignment yet, or a job name no report
/// can carry). When the connection fails, or the stream ends or breaks (the collector
/// restarted, or refused it), it opens a new one after a backoff delay (doubling with
/// each failure in a row, with jitter; back to the base delay once a stream has lasted
/// an interval). It never ends on its own and never panics; the report that was being
/// sent when a stream broke is lost (the next one supersedes it anyway). A collector
/// that vanishes without closing the connection (a partition) is noticed only by the
/// endpoint's HTTP/2 keep-alive: set `Endpoint::http2_keep_alive_interval` and
/// `keep_alive_timeout` on `endpoint` to bound that.
///
/// **Dropping it stops the task** (as does [`LoadReporter::stop`]): unlike a tokio
/// `JoinHandle`, it is not detached on drop. Keep it for as long as reports should flow.
#[derive(Debug)]
pub struct LoadReporter {
    task: JoinHandle<()>,
    pub(crate) counters: Arc<Counters>,
}

/// Where a reporter connects: the collector's endpoint and, with the `tls` feature, a
/// source of TLS settings read at each connection (so a rotated client identity is
/// presented from the next stream on).
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) endpoint: Endpoint,
    #[cfg(feature = "tls")]
    pub(crate) tls: Option<ClientTlsSource>,
}

impl Target {
    pub(crate) fn plain(endpoint: Endpoint) -> Self {
        Self {
            endpoint,
            #[cfg(feature = "tls")]
            tls: None,
        }
    }

    /// The endpoint for the next connection, with the TLS settings in force now.
    fn endpoint(&self) -> Result<Endpoint, tonic::transport::Error> {
        #[cfg(feature = "tls")]
        if let Some(tls) = &self.tls {
            return tls.apply(self.endpoint.clone());
        }
        Ok(self.endpoint.clone())
    }
}

impl LoadReporter {
    pub(super) fn spawn(
        slicelet: Slicelet,
        target: Target,
        job: String,
        interval: Duration,
        backoff: Backoff,
    ) -> Self {
        let counters = Arc::new(Counters::default());
        if !steady_core::valid_job_name(&job) {
            tracing::warn!(
                job_len = job.len(),
                "load reporter: no report can name this job; nothing will be sent"
            );
        }
        let task = tokio::spawn(run(
            slicelet,
            target,
            job,
            interval.max(MIN_REPORT_INTERVAL),
            backoff,
            counters.clone(),
        ));
        Self { task, counters }
    }

    /// Reports handed to a stream so far (sent, unless the stream broke meanwhile).
    pub fn reports_sent(&self) -> u64 {
        self.counters.sent.load(Ordering::Relaxed)
    }

    /// Report streams opened so far: 1 while the first one holds, one more per
    /// reconnection.
    pub fn streams_opened(&self) -> u64 {
        self.counters.streams.load(Ordering::Relaxed)
    }

    /// Connections to the collector that failed and report streams that broke (each
    /// followed by a reconnection after the backoff).
    pub fn failures(&self) -> u64 {
        self.counters.failed.load(Ordering::Relaxed)
    }

    /// Stops the task now (the open stream, if any, is reset; the collector counts what it
    /// received).
    pub fn stop(self) {
        drop(self);
    }
}

impl Drop for LoadReporter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn run(
    slicelet: Slicelet,
    target: Target,
    job: String,
    interval: Duration,
    backoff: Backoff,
    counters: Arc<Counters>,
) {
    let seed = steady_subset::hash::mix64(u64::from(slicelet.task()) ^ (u64::from(std::process::id()) << 32));
    let mut rng = SplitMix64::new(seed);
    let mut failures = 0u32;
    loop {
        if failures > 0 {
            tokio::time::sleep(backoff.delay(failures, &mut rng)).await;
        }
        let connected = match target.endpoint() {
            Ok(endpoint) => LoadCollectorClient::connect(endpoint).await,
            Err(error) => Err(error),
        };
        let mut client = match connected {
            Ok(client) => client,
            Err(error) => {
                counters.failed.fetch_add(1, Ordering::Relaxed);
                failures = failures.saturating_add(1);
                tracing::warn!(%job, %error, failures, "load reporter: cannot connect to the collector");
                continue;
            }
        };
        counters.streams.fetch_add(1, Ordering::Relaxed);
        let opened = Instant::now();
        tracing::debug!(%job, task = slicelet.task(), "load reporter: stream open");
        match client.report(reports(slicelet.clone(), job.clone(), interval, counters.clone())).await {
            Ok(summary) => {
                let summary = summary.into_inner();
                tracing::info!(
                    %job,
                    accepted = summary.accepted,
                    dropped = summary.dropped,
                    invalid = summary.invalid,
                    "load reporter: the collector ended the stream; reopening"
                );
            }
            Err(status) => {
                counters.failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%job, %status, "load reporter: stream broke; reconnecting");
            }
        }
        // A stream that lasted an interval worked: start the backoff over.
        failures = if opened.elapsed() >= interval { 1 } else { failures.saturating_add(1) };
    }
}

/// The reports of one stream: one per tick of `interval` that has something to report.
fn reports(
    slicelet: Slicelet,
    job: String,
    interval: Duration,
    counters: Arc<Counters>,
) -> impl Stream<Item = load_proto::LoadReport> + Send + 'static {
    let mut ticker = tokio::time::interval(interval);
    // After a stall, report once and go on at the interval: a burst of catch-up reports
    // would say nothing new.
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    futures_util::stream::unfold(ticker, move |mut ticker| {
        let (slicelet, job, counters) = (slicelet.clone(), job.clone(), counters.clone());
        async move {
            loop {
                ticker.tick().await;
                if let Some(report) = slicelet.load_report(&job) {
                    counters.sent.fetch_add(1, Ordering::Relaxed);
                    return Some((load_proto::LoadReport::from(&report), ticker));
                }
            }
        }
    })
}
