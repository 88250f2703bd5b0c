//! The control plane's HTTP pages for a fleet instance: an overview of the fleet at `/`,
//! a page per job at `/jobs/<job>`, a job's tasks as JSON at `/jobs/<job>.json`, and
//! Prometheus text at `/metrics` (the `steady-slicer` binary serves them with
//! `--metrics-listen`).
//!
//! ```no_run
//! # async fn run(sources: steady_slicer_server::status::StatusSources) -> std::io::Result<()> {
//! use steady_slicer_server::status::{observe_fleet, MetricsRegistry, StatusServer};
//!
//! let registry = MetricsRegistry::new();
//! // Once, whatever the jobs: the Assigners' instruments over the fleet as it is at each
//! // scrape, and the Distributor's and the collector's (see their observe_metrics).
//! observe_fleet(&registry.meter(), sources.fleet.clone(), &sources.instance);
//! sources.distributor.observe_metrics(&registry.meter());
//! sources.collector.observe_metrics(&registry.meter());
//! // Loopback: the pages are for the operator's own machine or a scraper beside it.
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:9464").await?;
//! StatusServer::new(sources, registry).serve(listener).await
//! # }
//! ```
//!
//! Everything is read from the sources at the request (nothing is computed between
//! requests but the event log's looks): the [`FleetStatus`] in force, the Distributor
//! (every job's assignment in force) and the load collector.
//!
//! * `/`: the instance's name and store; the live instances (name, gRPC address, a link
//!   to their pages when they serve some); a row per job of the fleet (name, algorithm,
//!   consistency, owner: the instance the spread names to run its Assigner, with a link
//!   to its page of the job; here: `leading`, `campaigning` or not, for an Assigner
//!   running on this instance; the generation in force; its tasks; its drained tasks;
//!   runs, publications and errors of the Assigner here), each linking to the job's page;
//!   the recent events of every job. At most `steady_slicer::specs::MAX_JOBS` rows: 2.5 MB of
//!   HTML for 10,000 jobs with names like `job-01234` (measured in the tests).
//! * `/jobs/<job>`: the assignment in force drawn over the key space (aggregated into a
//!   fixed number of columns, so 15,000 slices cost what 15 do), each task's state,
//!   slices, key share and load from its latest report, imbalance, the leader (or where
//!   the Assigner runs, linked), the store, and, when the Assigner runs here, key churn
//!   over its last published runs and the placement (`met`, or each constraint of the job
//!   spec the last run misses with its slices and key share, and why the task set cannot
//!   meet it when it cannot); the job's recent events. Its tasks are the task set the
//!   Assigner follows when it runs here, else every task the assignment in force names
//!   (serving) and the spec's drained tasks (draining). An unknown job is 404.
//! * `/jobs/<job>.json`: the job's tasks (below). An unknown job is 404.
//! * `/metrics`: every instrument registered in the [`MetricsRegistry`]'s meter, read at
//!   the scrape, in the Prometheus text format ([`observe_fleet`] for the Assigners').
//!
//! The HTML pages are each one document with inline SVG, no external assets and no
//! script, refreshing themselves every 2 seconds. A job's name is percent-encoded in
//! its paths: every byte but ASCII letters, digits, `-`, `_` and `~` (`.` too); any
//! percent-encoding is decoded, and the `.json` suffix is read before decoding
//! (`/jobs/a.json` is job `a`'s JSON, `/jobs/a%2Ejson` job `a.json`'s page).
//!
//! # A job's tasks as JSON (a contract)
//!
//! `GET /jobs/<job>.json` answers `200` with `Content-Type: application/json` and one
//! object (`steadyctl tasks JOB` reads it from the instance leading the job):
//!
//! ```json
//! {"job":"users","generation":12,"owner":"slicer-a","here":"leading",
//!  "tasks":[{"task":0,"state":"serving","slices":3,"key_share":0.25,"load":12.5},
//!           {"task":1,"state":"draining","slices":0,"key_share":0,"load":null}]}
//! ```
//!
//! * `job`: the job's name. `generation`: the generation in force on this instance (0
//!   before the first). `owner`: the instance the spread names to run the job's
//!   Assigner, `null` while no instance is known alive. `here`: `"leading"` (the
//!   Assigner runs here and leads), `"campaigning"` (it runs here and does not lead yet)
//!   or `"none"` (it runs elsewhere).
//! * `tasks`, by task index: every task of the job as its page shows them (above), each
//!   with its `state` (`"serving"`, `"draining"`, or `"gone"`: a task the assignment in
//!   force still names that the task set no longer lists as up), the `slices` it holds a
//!   replica of, its `key_share` of the key space (0 to 1; a slice's range split evenly
//!   over its replicas), and `load`: the total of its latest report received within 30
//!   seconds (requests per second), `null` without one. Only the leading instance's
//!   collector receives the reports, so only its loads are known.
//!
//! Fields may be added; none is removed or changes meaning.
//! `status::tests::the_job_json_is_the_documented_contract` pins the form.
//!
//! # Bounds
//!
//! The pages serve whoever reaches the listener, so bind it where only operators and the
//! scraper can (loopback by default in the binary).
//!
//! * At most 64 connections are served at once. New connections are always accepted:
//!   when every slot is taken, the idlest connection is closed to make room (one with no
//!   response under way that made no progress for longest; a busy one only when all
//!   are), so idle or slow peers cannot lock a fresh scraper out.
//! * A request's head must arrive in full within 5 seconds
//!   ([`StatusServer::head_timeout`]) of the accept, or of its first byte on a
//!   keep-alive connection, however it trickles in; its response must be written to the
//!   socket within as long (a peer that does not read it is closed).
//! * A keep-alive connection idles at most 30 seconds between a response and the next
//!   request ([`StatusServer::idle_timeout`]).
//! * Timed-out connections are closed by a sweep, at most an eighth of the shorter
//!   timeout (and at most 250 ms) late.
//! * A request head is at most 16 KiB and 64 header fields (431 otherwise); only GET is
//!   served (405 otherwise), and a request with a body is refused unread (413) and its
//!   connection closed.
//! * The event log keeps the last 100 events, of every job; a change that concerns more
//!   than 5 jobs at once (an instance joining, the specs read at start) is one event.
//!
//! What the slots cannot stop is a flood of new connections: a peer that connects 64
//! times in the moment between a scraper's connect and its request (microseconds on a
//! nearby machine) closes the scraper's connection to make room. That is for the
//! firewall or a connection rate limit in front of the listener.

mod events;
mod fleet_metrics;
mod html;
mod json;
mod overview;
mod page;
mod prometheus;
mod route;
mod slots;
#[cfg(test)]
mod tests;
mod view;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use steady_slicer::autosharding::Autosharding;
use steady_slicer::fleet::MAX_INSTANCES;
use steady_slicer::load::LoadCollector;
use steady_slicer::specs::MAX_JOBS;
use steady_slicer::Distributor;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::fleet::FleetStatus;
use events::{EventLog, Seen};
use html::pages_base;
use route::{job_path, route, Route};
use slots::{Slots, Timeouts, TrackedBody, TrackedIo};
use view::{rows, task_count, task_states, Here};

pub use fleet_metrics::observe_fleet;
pub use prometheus::MetricsRegistry;

/// How often the pages reload themselves.
const REFRESH: Duration = Duration::from_secs(2);
/// The most connections served at once.
const MAX_CONNECTIONS: usize = 64;
/// How long a request's head may take to arrive, by default ([`StatusServer::head_timeout`]).
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a keep-alive connection may idle, by default ([`StatusServer::idle_timeout`]).
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// The most a request head may take (hyper's read buffer; a longer head is answered 431).
const MAX_HEAD_BYTES: usize = 16 * 1024;
/// The most header fields a request may have (more are answered 431).
const MAX_HEADERS: usize = 64;
/// How old a load report may be to count on the pages.
const FRESH_REPORTS: Duration = Duration::from_secs(30);
/// How often the event log looks for changes.
const EVENT_POLL: Duration = Duration::from_millis(250);

/// What the pages read: a fleet instance's control plane.
#[derive(Debug, Clone)]
pub struct StatusSources {
    /// This instance's name (its candidate name in the jobs' elections).
    pub instance: String,
    /// The store, as the pages name it (`memory`, `etcd at https://...`).
    pub store: String,
    /// The Distributor it serves, every job's.
    pub distributor: Distributor,
    /// The load collector of every job (and through it, the book).
    pub collector: LoadCollector,
    /// The fleet as this instance sees it, replaced whole on each change.
    pub fleet: watch::Receiver<Arc<FleetStatus>>,
    /// The A119 server of every job, when the instance serves one: a job's page lists the
    /// last assignments its clients refused here.
    pub autosharding: Option<Autosharding>,
}

/// The HTTP server of the pages; see the module documentation.
#[derive(Debug, Clone)]
pub struct StatusServer {
    sources: StatusSources,
    registry: MetricsRegistry,
    events: Arc<EventLog>,
    timeouts: Timeouts,
}

impl StatusServer {
    /// The pages of `sources`, with `registry`'s instruments at `/metrics`.
    pub fn new(sources: StatusSources, registry: MetricsRegistry) -> Self {
        Self {
            sources,
            registry,
            events: Arc::default(),
            timeouts: Timeouts { head: HEAD_TIMEOUT, idle: IDLE_TIMEOUT },
        }
    }

    /// The Prometheus text `/metrics` serves now.
    pub fn metrics(&self) -> String {
        self.registry.render()
    }

    /// The overview `/` serves now.
    pub fn overview(&self) -> String {
        overview::render(&self.overview_snapshot())
    }

    /// The page `/jobs/<job>` serves now; `None` for a job the fleet does not serve.
    pub fn job_page(&self, job: &str) -> Option<String> {
        self.job_snapshot(job).map(|s| page::render(&s))
    }

    /// The JSON `/jobs/<job>.json` serves now (see the module documentation); `None` for
    /// a job the fleet does not serve.
    pub fn job_json(&self, job: &str) -> Option<String> {
        let fleet = self.sources.fleet.borrow().clone();
        let status = fleet.jobs.get(job)?;
        let assignment = self.sources.distributor.current(job);
        let rows = rows(&task_states(status, assignment.as_ref()), assignment.as_ref(), &self.loads(job));
        Some(json::render(&json::JobJson {
            job,
            generation: assignment.as_ref().map_or(0, |a| a.generation()),
            owner: status.owner.as_deref(),
            here: Here::of(status),
            rows: &rows,
        }))
    }

    /// How long a request head may take to arrive in full: from the accept, or from the
    /// first byte of a request after the previous response, however slowly it trickles
    /// in. A response, too, must be written to the socket within this long of its
    /// request's head (a peer that does not read it is closed). 5 seconds by default.
    pub fn head_timeout(mut self, timeout: Duration) -> Self {
        self.timeouts.head = timeout;
        self
    }

    /// How long a keep-alive connection may stay idle between a response and the next
    /// request's first byte. 30 seconds by default.
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.timeouts.idle = timeout;
        self
    }

    /// Serves the pages on `listener` until the future is dropped (which closes every
    /// connection it serves), and keeps the event log meanwhile.
    ///
    /// At most 64 connections are served at once. When all slots are taken, a new
    /// connection takes the slot of the idlest (see the module documentation's bounds):
    /// new connections are always accepted and served.
    ///
    /// # Errors
    ///
    /// Only when accepting connections fails for good (the listener is closed).
    pub async fn serve(self, listener: TcpListener) -> std::io::Result<()> {
        let watcher = tokio::spawn(self.clone().watch_events());
        let _stop_watcher = AbortOnDrop(watcher);
        // The only strong reference: the sweeper and the connections hold weak ones, so
        // dropping this future drops the table and with it every connection.
        let slots = Arc::new(Slots::new(MAX_CONNECTIONS, self.timeouts));
        let sweeper = tokio::spawn(sweep(Arc::downgrade(&slots)));
        let _stop_sweeper = AbortOnDrop(sweeper);
        loop {
            let (stream, _) = match listener.accept().await {
                Ok(accepted) => accepted,
                // A connection that failed before we took it (reset, out of descriptors
                // for a moment): the next one may work.
                Err(error) if is_transient(&error) => {
                    tracing::debug!(%error, "status: accept failed; going on");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                Err(error) => return Err(error),
            };
            let admitted = slots.admit();
            let slots = Arc::downgrade(&slots);
            let server = self.clone();
            tokio::spawn(async move {
                let tracker = admitted.tracker.clone();
                let service = hyper::service::service_fn(move |request| {
                    tracker.request();
                    let response =
                        server.respond(&request).map(|body| TrackedBody::new(body, tracker.clone()));
                    async move { Ok::<_, Infallible>(response) }
                });
                let io = TokioIo::new(TrackedIo::new(stream, admitted.tracker.clone()));
                let connection = hyper::server::conn::http1::Builder::new()
                    // Ours instead (see the slots module: hyper's would bound keep-alive
                    // idleness by the head timeout).
                    .header_read_timeout(None)
                    .max_buf_size(MAX_HEAD_BYTES)
                    .max_headers(MAX_HEADERS)
                    .serve_connection(io, service);
                tokio::select! {
                    result = connection => {
                        if let Err(error) = result {
                            tracing::debug!(%error, "status: connection ended with an error");
                        }
                    }
                    _ = admitted.close => {}
                }
                if let Some(slots) = slots.upgrade() {
                    slots.leave(admitted.id);
                }
            });
        }
    }

    fn respond<B: hyper::body::Body>(&self, request: &Request<B>) -> Response<Full<Bytes>> {
        // Only GET is served, and no request carries a body: one that does is refused
        // unread, and the connection closed (its body is never buffered).
        let has_body = !request.body().is_end_stream();
        const HTML: &str = "text/html; charset=utf-8";
        const TEXT: &str = "text/plain; charset=utf-8";
        let unknown = |job: &str| (StatusCode::NOT_FOUND, TEXT, format!("no job {job:?} in this fleet\n"));
        let (status, content_type, body) = match request.method().as_str() {
            _ if has_body => {
                (StatusCode::PAYLOAD_TOO_LARGE, TEXT, "requests carry no body here\n".to_owned())
            }
            "GET" => match route(request.uri().path()) {
                Route::Overview => (StatusCode::OK, HTML, self.overview()),
                Route::Metrics => {
                    (StatusCode::OK, "text/plain; version=0.0.4; charset=utf-8", self.metrics())
                }
                Route::Job(job) => match self.job_page(&job) {
                    Some(page) => (StatusCode::OK, HTML, page),
                    None => unknown(&job),
                },
                Route::JobJson(job) => match self.job_json(&job) {
                    Some(json) => (StatusCode::OK, "application/json", json),
                    None => unknown(&job),
                },
                Route::NotFound => (
                    StatusCode::NOT_FOUND,
                    TEXT,
                    "not found: /, /jobs/<job>, /jobs/<job>.json and /metrics are served\n".to_owned(),
                ),
            },
            _ => (StatusCode::METHOD_NOT_ALLOWED, TEXT, "GET only\n".to_owned()),
        };
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        if let Ok(value) = content_type.parse() {
            response.headers_mut().insert(hyper::header::CONTENT_TYPE, value);
        }
        if has_body {
            response
                .headers_mut()
                .insert(hyper::header::CONNECTION, hyper::header::HeaderValue::from_static("close"));
        }
        response
    }

    /// The loads of `job`'s tasks: each one's latest fresh report's total.
    fn loads(&self, job: &str) -> Vec<(u32, f64)> {
        let fresh = self.sources.collector.book().fresh(job, FRESH_REPORTS);
        fresh.iter().map(|r| (r.report.task(), r.report.total())).collect()
    }

    fn overview_snapshot(&self) -> overview::Snapshot {
        let s = &self.sources;
        let fleet = s.fleet.borrow().clone();
        let pages: BTreeMap<&str, String> = fleet
            .instances
            .iter()
            .take(MAX_INSTANCES)
            .filter_map(|(name, i)| Some((name.as_str(), pages_base(i.pages.as_deref()?)?)))
            .collect();
        let instances = fleet
            .instances
            .iter()
            .take(MAX_INSTANCES)
            .map(|(name, i)| overview::InstanceRow {
                name: name.clone(),
                address: i.address.clone(),
                pages: pages.get(name.as_str()).cloned(),
            })
            .collect();
        let jobs = fleet
            .jobs
            .iter()
            .take(MAX_JOBS)
            .map(|(name, job)| {
                let assignment = s.distributor.current(name);
                let drained = &job.config.drained;
                overview::JobRow {
                    name: name.clone(),
                    algorithm: job.config.algorithm.clone(),
                    consistency: job.config.consistency.to_string(),
                    owner: job.owner.clone(),
                    owner_pages: job
                        .owner
                        .as_deref()
                        .filter(|owner| *owner != s.instance)
                        .and_then(|owner| pages.get(owner).cloned()),
                    here: Here::of(job),
                    generation: assignment.as_ref().map(|a| a.generation()),
                    tasks: task_count(job, assignment.as_ref()),
                    drained: (
                        drained.iter().take(overview::DRAINED_LISTED).copied().collect(),
                        drained.len(),
                    ),
                    counts: job.assigner.as_ref().map(|a| [a.runs(), a.published(), a.errors()]),
                }
            })
            .collect();
        overview::Snapshot {
            instance: s.instance.clone(),
            store: s.store.clone(),
            instances,
            jobs,
            watchers: s.distributor.total_watchers(),
            reports_accepted: s.collector.book().accepted(),
            reports_refused: s.collector.refused(),
            events: self.events.all(),
            refresh: REFRESH,
        }
    }

    fn job_snapshot(&self, name: &str) -> Option<page::Snapshot> {
        let s = &self.sources;
        let fleet = s.fleet.borrow().clone();
        let job = fleet.jobs.get(name)?;
        let assignment = s.distributor.current(name);
        let stats = job.assigner.as_ref();
        let owner_page = job
            .owner
            .as_deref()
            .filter(|owner| *owner != s.instance)
            .and_then(|owner| fleet.instances.get(owner)?.pages.as_deref())
            .and_then(pages_base)
            .map(|base| format!("{base}{}", job_path(name)));
        Some(page::Snapshot {
            job: name.to_owned(),
            instance: s.instance.clone(),
            store: s.store.clone(),
            algorithm: job.config.algorithm.clone(),
            consistency: job.config.consistency.to_string(),
            here: Here::of(job),
            owner: job.owner.clone(),
            owner_page,
            tasks: task_states(job, assignment.as_ref()),
            assignment,
            loads: self.loads(name),
            history: stats.map(|s| s.history()).unwrap_or_default(),
            placement: stats.filter(|s| s.runs() > 0).map(|s| s.placement()),
            watchers: s.distributor.watchers(name),
            reports_accepted: s.collector.book().accepted(),
            reports_refused: s.collector.refused(),
            events: self.events.of(name),
            refusals: s.autosharding.as_ref().map(|a| a.rejections(name)).unwrap_or_default(),
            refresh: REFRESH,
        })
    }

    /// Turns changes of the sources into events, forever (polling: every source is a
    /// counter or a snapshot already).
    async fn watch_events(self) {
        let mut seen = Seen::read(&self.sources);
        loop {
            tokio::time::sleep(EVENT_POLL).await;
            let now = Seen::read(&self.sources);
            for (job, text) in seen.changes(&now, &self.sources.instance) {
                self.events.push(job, text);
            }
            seen = now;
        }
    }
}

/// Aborts the task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Closes the connections past their timeouts, until the table is gone.
async fn sweep(slots: Weak<Slots>) {
    loop {
        let Some(every) = slots.upgrade().map(|s| s.sweep_every()) else { return };
        tokio::time::sleep(every).await;
        match slots.upgrade() {
            Some(slots) => slots.sweep(),
            None => return,
        }
    }
}

/// Accept errors that concern one connection, not the listener.
fn is_transient(error: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(error.kind(), ConnectionAborted | ConnectionReset | Interrupted | WouldBlock)
        || error.raw_os_error().is_some_and(|code| code == 23 || code == 24) // ENFILE, EMFILE
}
