//! The control plane's HTTP pages: Prometheus text at `/metrics` and a status page at
//! `/`, for one job (the `steady-slicer` binary serves them with `--metrics-listen`).
//!
//! ```no_run
//! # async fn run(sources: steady_slicer_server::status::StatusSources) -> std::io::Result<()> {
//! use steady_slicer_server::status::{MetricsRegistry, StatusServer};
//!
//! let registry = MetricsRegistry::new();
//! // Components register their instruments in registry.meter() (see their observe_metrics).
//! // Loopback: the pages are for the operator's own machine or a scraper beside it.
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:9464").await?;
//! StatusServer::new(sources, registry).serve(listener).await
//! # }
//! ```
//!
//! * `/metrics`: every instrument registered in the [`MetricsRegistry`]'s meter, read at
//!   the scrape (nothing is computed between scrapes), in the Prometheus text format.
//! * `/`: the assignment in force drawn over the key space (aggregated into a fixed
//!   number of columns, so 15,000 slices cost what 15 do), each task's state, slices, key
//!   share and load from its latest report, imbalance and key churn over the last
//!   published runs, the leader and the store, the placement (`met`, or each constraint
//!   of the job spec the last run misses with its slices and key share, and why the task
//!   set cannot meet it when it cannot), and recent events (leadership changes,
//!   generations, drains and departures, refused and dropped reports, placement missed
//!   and met again). One HTML document with inline SVG, no external assets and no
//!   script, refreshing itself every 2 seconds.
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
//! * The event log keeps the last 100 events.
//!
//! What the slots cannot stop is a flood of new connections: a peer that connects 64
//! times in the moment between a scraper's connect and its request (microseconds on a
//! nearby machine) closes the scraper's connection to make room. That is for the
//! firewall or a connection rate limit in front of the listener.

mod page;
mod prometheus;
mod slots;

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use steady_assigner::{TaskState, Tasks};
use steady_slicer::assigner_service::AssignerStats;
use steady_slicer::load::LoadCollector;
use steady_slicer::Distributor;
use tokio::net::TcpListener;
use tokio::sync::watch;

use slots::{Slots, Timeouts, TrackedBody, TrackedIo};

pub use prometheus::MetricsRegistry;

/// How often the status page reloads itself.
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
/// How many events the page keeps.
const MAX_EVENTS: usize = 100;
/// How old a load report may be to count on the page.
const FRESH_REPORTS: Duration = Duration::from_secs(30);
/// How often the event log looks for changes.
const EVENT_POLL: Duration = Duration::from_millis(250);

/// What the pages read: one job's control plane.
#[derive(Debug, Clone)]
pub struct StatusSources {
    /// The job.
    pub job: String,
    /// This instance's name in the election.
    pub candidate: String,
    /// The store, as the page names it (`memory`, `etcd at https://...`).
    pub store: String,
    /// The Distributor it serves.
    pub distributor: Distributor,
    /// The load collector (and through it, the book).
    pub collector: LoadCollector,
    /// The statistics of this instance's Assigner service
    /// ([`steady_slicer::assigner_service::AssignerHandle::shared_stats`]); replaced when the service is
    /// (a restart, a standby that took over in the same process).
    pub assigner: watch::Receiver<Arc<AssignerStats>>,
    /// The task set the Assigner follows.
    pub tasks: watch::Receiver<Tasks>,
}

/// The HTTP server of the pages; see the module documentation.
#[derive(Debug, Clone)]
pub struct StatusServer {
    sources: StatusSources,
    registry: MetricsRegistry,
    events: Arc<Mutex<VecDeque<(SystemTime, String)>>>,
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

    /// The HTML `/` serves now.
    pub fn page(&self) -> String {
        page::render(&self.snapshot())
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
        let (status, content_type, body) = match (request.method().as_str(), request.uri().path()) {
            _ if has_body => {
                (StatusCode::PAYLOAD_TOO_LARGE, "text/plain", "requests carry no body here\n".to_owned())
            }
            ("GET", "/") => (StatusCode::OK, "text/html; charset=utf-8", self.page()),
            ("GET", "/metrics") => {
                (StatusCode::OK, "text/plain; version=0.0.4; charset=utf-8", self.metrics())
            }
            ("GET", _) => {
                (StatusCode::NOT_FOUND, "text/plain", "not found: / and /metrics are served\n".to_owned())
            }
            _ => (StatusCode::METHOD_NOT_ALLOWED, "text/plain", "GET only\n".to_owned()),
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

    fn snapshot(&self) -> page::Snapshot {
        let s = &self.sources;
        let job = &s.job;
        page::Snapshot {
            job: job.clone(),
            candidate: s.candidate.clone(),
            store: s.store.clone(),
            leading: s.assigner.borrow().is_leading(),
            assignment: s.distributor.current(job),
            tasks: s.tasks.borrow().iter().collect(),
            loads: s
                .collector
                .book()
                .fresh(job, FRESH_REPORTS)
                .iter()
                .map(|r| (r.report.task(), r.report.total()))
                .collect(),
            history: s.assigner.borrow().history(),
            placement: {
                let stats = s.assigner.borrow();
                (stats.runs() > 0).then(|| stats.placement())
            },
            watchers: s.distributor.watchers(job),
            reports_accepted: s.collector.book().accepted(),
            reports_refused: s.collector.refused(),
            events: self.events.lock().unwrap_or_else(|p| p.into_inner()).iter().cloned().collect(),
            refresh: REFRESH,
        }
    }

    fn event(&self, text: String) {
        tracing::info!(job = %self.sources.job, event = %text, "status");
        let mut events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        if events.len() == MAX_EVENTS {
            events.pop_front();
        }
        events.push_back((SystemTime::now(), text));
    }

    /// Turns changes of the sources into events, forever (polling: every source is a
    /// counter or a snapshot already).
    async fn watch_events(self) {
        let s = &self.sources;
        let mut seen = Seen::read(s);
        loop {
            tokio::time::sleep(EVENT_POLL).await;
            let now = Seen::read(s);
            for event in seen.changes(&now, s) {
                self.event(event);
            }
            seen = now;
        }
    }
}

/// What the event log compares between two looks.
struct Seen {
    leading: bool,
    generation: u64,
    tasks: Vec<(u32, TaskState)>,
    refused: u64,
    dropped: u64,
    invalid: u64,
    /// The constraints the last run misses, by name, and why they cannot be met.
    missed: Vec<&'static str>,
    infeasible: Option<String>,
}

impl Seen {
    fn read(s: &StatusSources) -> Self {
        let placement = s.assigner.borrow().placement();
        Self {
            leading: s.assigner.borrow().is_leading(),
            generation: s.distributor.current(&s.job).map_or(0, |a| a.generation()),
            tasks: s.tasks.borrow().iter().collect(),
            refused: s.collector.refused(),
            dropped: s.collector.book().dropped(),
            invalid: s.collector.invalid(),
            missed: placement.violations.iter().map(|v| v.constraint.name()).collect(),
            infeasible: placement.infeasible.map(|why| why.to_string()),
        }
    }

    fn changes(&self, now: &Self, s: &StatusSources) -> Vec<String> {
        let mut events = Vec::new();
        if now.leading != self.leading {
            events.push(if now.leading {
                format!("{} became the leader (failover or start)", s.candidate)
            } else {
                format!("{} lost the leadership", s.candidate)
            });
        }
        if now.generation != self.generation {
            let run = s.assigner.borrow().history().into_iter().find(|r| r.generation == now.generation);
            events.push(match run {
                Some(r) => format!(
                    "generation {} published: imbalance {} to {:.2}, key churn {:.2}%",
                    r.generation,
                    r.imbalance_before.map_or("n/a".to_owned(), |b| format!("{b:.2}")),
                    r.imbalance_after,
                    r.key_churn * 100.0
                ),
                None => format!("generation {} in force (from the store)", now.generation),
            });
        }
        for &(task, state) in &now.tasks {
            let before = self.tasks.iter().find(|(t, _)| *t == task).map(|(_, s)| *s);
            match (before, state) {
                (None, _) => events.push(format!("task {task} joined ({state:?})")),
                (Some(b), s) if b != s => events.push(format!("task {task}: {b:?} to {s:?}")),
                _ => {}
            }
        }
        for &(task, _) in &self.tasks {
            if !now.tasks.iter().any(|(t, _)| *t == task) {
                events.push(format!("task {task} left the job"));
            }
        }
        for (what, before, after) in [
            ("load reports refused (sender not authorized for the task)", self.refused, now.refused),
            ("load reports dropped (unknown job, task or generation)", self.dropped, now.dropped),
            ("invalid load report messages", self.invalid, now.invalid),
        ] {
            if after > before {
                events.push(format!("{} {what}", after - before));
            }
        }
        if now.infeasible != self.infeasible {
            events.push(match &now.infeasible {
                Some(why) => format!("placement infeasible: {why}"),
                None => "placement feasible again".to_owned(),
            });
        }
        if now.missed != self.missed {
            events.push(if now.missed.is_empty() {
                "placement met: no slice misses a constraint".to_owned()
            } else {
                format!("placement missed: {}", now.missed.join(", "))
            });
        }
        events
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
