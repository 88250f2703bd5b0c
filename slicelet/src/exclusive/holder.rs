//! [`LeaseHolder`]: the Slicelet's side of the lease protocol on etcd (see
//! `docs/exclusive.md`, "The Slicelet's steps").

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, EventType, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use steady_core::ConfigError;
use steady_slice::guard::{guard_key, hold_key, Guard, Hold};
use steady_slice::{Assignment, KeyRange};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{intersect, LeaseClock};
use crate::Slicelet;

/// The largest assignment value the holder decodes (as the stores': 1 MiB).
const MAX_ASSIGNMENT_BYTES: usize = 1 << 20;
/// Assignments remembered, newest first kept: enough for a bridge across one change
/// seen late.
const KNOWN_ASSIGNMENTS: usize = 4;
/// Renewals sent and not yet answered, at most.
const MAX_IN_FLIGHT: usize = 8;
/// The first wait after a failed etcd call; it doubles up to a quarter of the TTL.
const FIRST_RETRY: Duration = Duration::from_millis(20);

/// How a [`LeaseHolder`] holds its leases.
#[derive(Debug, Clone)]
pub struct ExclusiveConfig {
    key_prefix: String,
    lease_ttl: Duration,
    margin: Duration,
    drift: f64,
    request_timeout: Duration,
    bridge: bool,
    deadline_from_answer: bool,
}

impl Default for ExclusiveConfig {
    fn default() -> Self {
        Self {
            key_prefix: "/steady/jobs/".to_owned(),
            lease_ttl: Duration::from_secs(2),
            margin: Duration::from_millis(20),
            drift: 0.01,
            request_timeout: Duration::from_secs(1),
            bridge: true,
            deadline_from_answer: false,
        }
    }
}

impl ExclusiveConfig {
    /// The store's key prefix, as the Assigner's `EtcdConfig::key_prefix` (default
    /// `/steady/jobs/`).
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// The lease's TTL: whole seconds, 1 s to 1 minute (default 2 s). A dead or cut-off
    /// task holds up the keys that move off it for about this long; shorter costs more
    /// renewals (four per TTL). etcd raises a TTL below its minimum.
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }

    /// The clock margin taken off every deadline: a fixed part (default 20 ms) and a
    /// share of the TTL for the clocks' rates (default 1%).
    pub fn clock_margin(mut self, fixed: Duration, drift: f64) -> Self {
        self.margin = fixed;
        self.drift = drift;
        self
    }

    /// How long one etcd request may take (default 1 s, at most the TTL).
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Whether to hold the bridge while the guard is recalled (default on): unchanged
    /// slices stay owned across a change. Off, every key pauses at every change (for
    /// measuring what the bridge is worth).
    pub fn bridge(mut self, on: bool) -> Self {
        self.bridge = on;
        self
    }

    /// **Unsafe, for showing that the checker can fail**: computes the deadline from
    /// when a renewal's answer *arrived* instead of when it was sent, so an answer the
    /// network delayed stretches belief past etcd's expiry.
    #[doc(hidden)]
    pub fn unsafe_deadline_from_answer(mut self) -> Self {
        self.deadline_from_answer = true;
        self
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let ttl = self.lease_ttl;
        if ttl.subsec_nanos() != 0 || !(1..=60).contains(&ttl.as_secs()) {
            return Err(ConfigError::new("lease_ttl", ttl, "whole seconds, 1 s to 1 minute"));
        }
        if !(0.0..0.5).contains(&self.drift) || self.margin >= ttl / 4 {
            return Err(ConfigError::new(
                "clock_margin",
                (self.margin, self.drift),
                "a drift in [0, 0.5) and a fixed part below a quarter of the TTL",
            ));
        }
        if self.request_timeout.is_zero() || self.request_timeout > ttl {
            return Err(ConfigError::new(
                "request_timeout",
                self.request_timeout,
                "above zero, at most the lease TTL",
            ));
        }
        if self.key_prefix.is_empty() || self.key_prefix.len() > 256 {
            return Err(ConfigError::new("key_prefix", &self.key_prefix, "1 to 256 bytes"));
        }
        Ok(())
    }

    /// The deadline of a lease granted or renewed for `ttl` seconds by a request sent at
    /// `asked`.
    fn deadline(&self, asked: Instant, ttl: i64) -> Instant {
        let ttl = Duration::from_secs(ttl.max(0) as u64);
        let from = if self.deadline_from_answer { Instant::now() } else { asked };
        (from + ttl).checked_sub(ttl.mul_f64(self.drift) + self.margin).unwrap_or(from)
    }
}

/// Holds a Slicelet's etcd leases and holds for one exclusive job, on a task of its own:
/// made by [`Slicelet::hold_leases`]. The task never ends by itself: etcd errors are
/// retried (ownership lapses meanwhile, at the lease's deadline).
///
/// [`LeaseHolder::stop`] gives everything up in order (believe nothing, delete the hold,
/// revoke the lease). Dropping it does the same without waiting: the belief ends at
/// once, the rest in the background (or, without a runtime, when the lease lapses).
pub struct LeaseHolder {
    slicelet: Slicelet,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl fmt::Debug for LeaseHolder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseHolder").field("task", &self.slicelet.task()).finish_non_exhaustive()
    }
}

impl LeaseHolder {
    /// Stops: believes nothing, deletes the hold, revokes the lease, then returns.
    pub async fn stop(mut self) {
        self.slicelet.forget();
        self.stop.send_replace(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for LeaseHolder {
    fn drop(&mut self) {
        // Belief first: whatever happens to the task, nothing is believed past here.
        self.slicelet.forget();
        self.stop.send_replace(true);
    }
}

impl Slicelet {
    /// Takes part in `job`'s lease protocol on the etcd cluster `client` reaches: holds
    /// a lease, follows the job's guard and assignments, and believes it owns a key only
    /// while its hold allows it (see `docs/exclusive.md`). Must be called within a tokio
    /// runtime, on a Slicelet made by [`Slicelet::exclusive`]. Feeding it assignments
    /// otherwise is not needed: it reads them from etcd. One [`LeaseHolder`] per Slicelet:
    /// two would each take the other's belief for their own.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the field of `config` out of range, or `consistency` when
    /// this Slicelet is not exclusive.
    pub fn hold_leases(
        &self,
        client: Client,
        job: impl Into<String>,
        config: ExclusiveConfig,
    ) -> Result<LeaseHolder, ConfigError> {
        if self.state.exclusive.is_none() {
            return Err(ConfigError::new(
                "consistency",
                "eventual",
                "exclusive (Slicelet::exclusive) to hold leases",
            ));
        }
        config.validate()?;
        let job = job.into();
        if job.is_empty() || job.contains('/') {
            // `a/exclusive/holds/1` would keep its keys among job `a`'s holds.
            return Err(ConfigError::new("job", job, "a name of an exclusive job: not empty, no `/`"));
        }
        let (stop, stopped) = watch::channel(false);
        let driver = Driver {
            guard_key: guard_key(&config.key_prefix, &job),
            assignment_key: format!("{}{job}/assignment", config.key_prefix),
            watch_prefix: format!("{}{job}/", config.key_prefix),
            slicelet: self.clone(),
            client,
            job,
            config,
            known: BTreeMap::new(),
            guard: None,
            guard_revision: 0,
            epoch: 0,
        };
        let task = tokio::spawn(driver.run(stopped));
        Ok(LeaseHolder { slicelet: self.clone(), stop, task: Some(task) })
    }
}

/// Why a tenure ended.
enum Ended {
    /// Asked to stop.
    Stopped,
    /// The lease is lost (deadline passed, or etcd no longer knows it): take another.
    Lost(String),
}

/// The task behind a [`LeaseHolder`].
struct Driver {
    slicelet: Slicelet,
    client: Client,
    job: String,
    config: ExclusiveConfig,
    guard_key: String,
    assignment_key: String,
    watch_prefix: String,
    /// Assignments read, by generation (at most [`KNOWN_ASSIGNMENTS`]).
    known: BTreeMap<u64, Arc<Assignment>>,
    /// The guard last seen (`None`: absent, the job is not exclusive) and its revision.
    guard: Option<Guard>,
    guard_revision: i64,
    /// Tenures so far.
    epoch: u64,
}

/// One lease and what rests on it.
struct Tenure {
    lease: i64,
    clock: Arc<LeaseClock>,
    hold: Option<Hold>,
}

impl Driver {
    async fn run(mut self, mut stop: watch::Receiver<bool>) {
        let mut failures = 0u32;
        loop {
            if *stop.borrow() {
                return;
            }
            match self.tenure(&mut stop).await {
                Ended::Stopped => return,
                Ended::Lost(why) => {
                    failures += 1;
                    tracing::warn!(job = %self.job, task = self.slicelet.task(), why, "exclusive: ownership given up; taking a new lease");
                }
            }
            let wait = self.retry_after(failures);
            tokio::select! {
                () = stopped(&mut stop) => return,
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    fn retry_after(&self, failures: u32) -> Duration {
        FIRST_RETRY.saturating_mul(2u32.saturating_pow(failures.min(16))).min(self.config.lease_ttl / 4)
    }

    /// One lease, from its grant to its loss (or the stop): believes nothing at its end,
    /// then revokes the lease (which deletes the hold).
    async fn tenure(&mut self, stop: &mut watch::Receiver<bool>) -> Ended {
        self.epoch += 1;
        let asked = Instant::now();
        let mut leases = self.client.lease_client();
        let ttl = self.config.lease_ttl.as_secs() as i64;
        let granted = match tokio::time::timeout(self.config.request_timeout, leases.grant(ttl, None)).await {
            Ok(Ok(granted)) => granted,
            Ok(Err(error)) => return Ended::Lost(format!("lease grant: {error}")),
            Err(_) => return Ended::Lost("lease grant: no answer in time".to_owned()),
        };
        let clock = Arc::new(LeaseClock::new(self.config.deadline(asked, granted.ttl())));
        let mut tenure = Tenure { lease: granted.id(), clock, hold: None };
        let ended = self.serve(&mut tenure, stop).await;
        // Belief first, then the keys: never a hold gone while it is believed.
        self.slicelet.forget();
        tenure.clock.end();
        match tokio::time::timeout(self.config.request_timeout, leases.revoke(tenure.lease)).await {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => {
                tracing::debug!(job = %self.job, lease = tenure.lease, %error, "exclusive: revoke failed; the lease will lapse")
            }
            Err(_) => {
                tracing::debug!(job = %self.job, lease = tenure.lease, "exclusive: revoke unanswered; the lease will lapse")
            }
        }
        ended
    }

    /// Follows the guard and renews the lease until the tenure ends.
    async fn serve(&mut self, tenure: &mut Tenure, stop: &mut watch::Receiver<bool>) -> Ended {
        let period = self.config.lease_ttl / 4;
        // Renewals run on a task of their own, so that a slow read or write here never
        // holds one back; they go on only while this loop shows progress.
        let progress = Arc::new(Progress::new());
        let (gone_tx, mut gone) = tokio::sync::oneshot::channel();
        let renewer = Renewer {
            client: self.client.clone(),
            lease: tenure.lease,
            clock: tenure.clock.clone(),
            config: self.config.clone(),
            progress: progress.clone(),
        };
        let _renewer = AbortOnDrop(tokio::spawn(renewer.run(gone_tx)));
        let mut events = None;
        let mut watched_from = 0;
        let mut next_read = Instant::now() + period;
        // A read of the guard and the assignment is due (at the start, after a failed
        // watch, at every renewal, after a write the guard refused).
        let mut read_due = true;
        let mut retry = Instant::now();
        let mut failures = 0u32;
        loop {
            progress.mark();
            if read_due && Instant::now() >= retry {
                let read = self.read().await;
                progress.mark();
                match read {
                    Ok(revision) => {
                        read_due = false;
                        if events.is_none() {
                            watched_from = revision + 1;
                        }
                    }
                    Err(error) => {
                        failures += 1;
                        retry = Instant::now() + self.retry_after(failures);
                        tracing::debug!(job = %self.job, %error, "exclusive: read failed");
                    }
                }
            }
            if !read_due {
                let reconciled = self.reconcile(tenure).await;
                progress.mark();
                match reconciled {
                    Ok(true) => failures = 0,
                    Ok(false) => read_due = true,
                    Err(Some(lost)) => return Ended::Lost(lost),
                    Err(None) => {
                        failures += 1;
                        retry = Instant::now() + self.retry_after(failures);
                        read_due = true;
                    }
                }
            }
            if events.is_none() && !read_due {
                let options = WatchOptions::new().with_prefix().with_start_revision(watched_from);
                let mut watches = self.client.watch_client();
                match tokio::time::timeout(
                    self.config.request_timeout,
                    watches.watch(self.watch_prefix.clone(), Some(options)),
                )
                .await
                {
                    Ok(Ok(stream)) => events = Some(stream),
                    _ => read_due = true,
                }
            }
            let deadline = tenure.clock.until();
            tokio::select! {
                biased;
                () = stopped(stop) => {
                    self.slicelet.forget();
                    let mut kv = self.client.kv_client();
                    let key = hold_key(&self.config.key_prefix, &self.job, self.slicelet.task(), tenure.lease);
                    let _ = tokio::time::timeout(self.config.request_timeout, kv.delete(key, None)).await;
                    return Ended::Stopped;
                }
                () = tokio::time::sleep_until(deadline) => {
                    return Ended::Lost("no renewal answered before the lease's deadline".to_owned());
                }
                lost = &mut gone => {
                    return Ended::Lost(lost.unwrap_or_else(|_| "the renewals stopped".to_owned()));
                }
                () = tokio::time::sleep_until(next_read) => {
                    // The backstop for a watch that stalls without failing.
                    read_due = true;
                    next_read = Instant::now() + period;
                }
                () = tokio::time::sleep_until(retry), if read_due => {}
                message = next_event(&mut events), if events.is_some() => match message {
                    Ok(Some(response)) if !response.canceled() => {
                        if let Some(header) = response.header() {
                            watched_from = header.revision() + 1;
                        }
                        for event in response.events() {
                            if let Some(kv) = event.kv() {
                                self.apply(kv, event.event_type() == EventType::Delete);
                            }
                        }
                    }
                    _ => {
                        // Broken, ended or cancelled (compacted): read afresh, watch again.
                        events = None;
                        read_due = true;
                    }
                },
            }
        }
    }

    /// Reads the guard and the assignment at one revision; returns it.
    async fn read(&mut self) -> Result<i64, String> {
        let txn = Txn::new().and_then([
            TxnOp::get(self.guard_key.clone(), None),
            TxnOp::get(self.assignment_key.clone(), None),
        ]);
        let mut kv = self.client.kv_client();
        let response = match tokio::time::timeout(self.config.request_timeout, kv.txn(txn)).await {
            Ok(Ok(response)) => response,
            Ok(Err(error)) => return Err(error.to_string()),
            Err(_) => return Err("no answer in time".to_owned()),
        };
        let revision = response.header().map_or(0, |h| h.revision());
        let mut guard_seen = false;
        for op in response.op_responses() {
            if let TxnOpResponse::Get(get) = op {
                for kv in get.kvs() {
                    guard_seen |= kv.key() == self.guard_key.as_bytes();
                    self.apply(kv, false);
                }
            }
        }
        if !guard_seen && revision > self.guard_revision {
            self.set_guard(None, revision);
        }
        Ok(revision)
    }

    /// Takes in one key's new value (or its deletion) from a read or the watch.
    fn apply(&mut self, kv: &KeyValue, deleted: bool) {
        if kv.key() == self.guard_key.as_bytes() {
            if kv.mod_revision() <= self.guard_revision {
                return; // older than what a read already showed
            }
            let guard = if deleted {
                None
            } else {
                match Guard::decode(kv.value()) {
                    Ok(guard) => Some(guard),
                    Err(error) => {
                        tracing::warn!(job = %self.job, %error, "exclusive: unreadable guard: owning nothing until it is readable");
                        None
                    }
                }
            };
            self.set_guard(guard, kv.mod_revision());
        } else if kv.key() == self.assignment_key.as_bytes() && !deleted {
            self.learn(kv.value());
        }
    }

    fn set_guard(&mut self, guard: Option<Guard>, revision: i64) {
        if guard.is_none() && self.guard.is_some() {
            tracing::warn!(job = %self.job, "exclusive: the job has no guard (not exclusive): owning nothing");
        }
        self.guard = guard;
        self.guard_revision = revision;
    }

    /// Remembers an assignment read from etcd, if it can be one of an exclusive job.
    fn learn(&mut self, bytes: &[u8]) {
        if bytes.len() > MAX_ASSIGNMENT_BYTES {
            tracing::warn!(job = %self.job, bytes = bytes.len(), "exclusive: assignment too large: ignored");
            return;
        }
        let assignment = match Assignment::decode(bytes) {
            Ok(a) => a,
            Err(error) => {
                tracing::warn!(job = %self.job, %error, "exclusive: unreadable assignment: ignored");
                return;
            }
        };
        if let Some(slice) =
            assignment.slices().iter().find(|s| s.replicas().len() > 1 || !s.warming().is_empty())
        {
            tracing::warn!(job = %self.job, generation = assignment.generation(), start = %slice.start, "exclusive: an assignment with more than one owner for a slice grants nothing");
            return;
        }
        let generation = assignment.generation();
        if self.known.contains_key(&generation) {
            return;
        }
        self.slicelet.set_assignment(assignment.clone());
        self.known.insert(generation, Arc::new(assignment));
        while self.known.len() > KNOWN_ASSIGNMENTS {
            self.known.pop_first();
        }
    }

    /// The hold this task should have under the guard seen, given what it knows.
    fn wanted(&self) -> Option<Hold> {
        let hold = self.guard?.hold_to_take(self.config.bridge)?;
        let known = |g| self.known.contains_key(&g);
        match hold {
            Hold::Full(g) => known(g),
            Hold::Bridge { from, to } => known(from) && known(to),
        }
        .then_some(hold)
    }

    fn ranges(&self, hold: Option<Hold>) -> Vec<KeyRange> {
        hold.map(|h| h.ranges(self.slicelet.task(), |g| self.known.get(&g).map(|a| &**a))).unwrap_or_default()
    }

    /// Moves the hold to the one wanted: narrow the belief, write, widen (see the
    /// specification). `Ok(true)`: done (or nothing to do); `Ok(false)`: the guard moved
    /// on (read again); `Err(Some)`: the lease is gone; `Err(None)`: etcd did not answer.
    async fn reconcile(&mut self, tenure: &mut Tenure) -> Result<bool, Option<String>> {
        let wanted = self.wanted();
        if wanted == tenure.hold {
            return Ok(true);
        }
        let task = self.slicelet.task();
        let target = self.ranges(wanted);
        // What is believed now, read from the belief itself (not recomputed from the
        // assignments, which could have been forgotten): narrowing must cover all of it.
        let now = self.slicelet.believed_ranges();
        let narrowed = intersect(&now, &target);
        let label = |h: Option<Hold>| h.map_or(0, Hold::latest);
        if narrowed != now {
            let generation = label(tenure.hold).max(label(wanted));
            self.slicelet.believe(self.epoch, tenure.clock.clone(), tenure.hold, generation, &narrowed);
        }
        let key = hold_key(&self.config.key_prefix, &self.job, task, tenure.lease);
        let mut kv = self.client.kv_client();
        let Some(hold) = wanted else {
            let deleted = tokio::time::timeout(self.config.request_timeout, kv.delete(key, None)).await;
            return match deleted {
                Ok(Ok(_)) => {
                    tenure.hold = None;
                    Ok(true)
                }
                _ => Err(None),
            };
        };
        let guard = self.guard.expect("a hold is wanted only under a guard");
        let txn = Txn::new()
            .when([Compare::value(self.guard_key.clone(), CompareOp::Equal, guard.encode())])
            .and_then([TxnOp::put(key, hold.encode(), Some(PutOptions::new().with_lease(tenure.lease)))]);
        match tokio::time::timeout(self.config.request_timeout, kv.txn(txn)).await {
            Ok(Ok(response)) if response.succeeded() => {
                tenure.hold = Some(hold);
                self.slicelet.believe(self.epoch, tenure.clock.clone(), Some(hold), hold.latest(), &target);
                tracing::debug!(job = %self.job, task, %hold, "exclusive: holding");
                Ok(true)
            }
            Ok(Ok(_)) => Ok(false),
            Ok(Err(error)) if error.to_string().contains("lease not found") => {
                Err(Some("etcd no longer knows the lease".to_owned()))
            }
            _ => Err(None),
        }
    }
}

/// Resolves once the holder is told to stop (or dropped).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// When the driver's loop last went round, for the renewer: a driver stuck for a whole
/// TTL (a bug, a wedged call) must not keep its hold alive through renewals and block
/// every recall; its lease then lapses.
struct Progress {
    origin: Instant,
    last: std::sync::atomic::AtomicU64,
}

impl Progress {
    fn new() -> Self {
        Self { origin: Instant::now(), last: std::sync::atomic::AtomicU64::new(0) }
    }

    fn mark(&self) {
        let nanos = self.origin.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64;
        self.last.store(nanos, std::sync::atomic::Ordering::Release);
    }

    fn since(&self) -> Duration {
        let last = self.origin + Duration::from_nanos(self.last.load(std::sync::atomic::Ordering::Acquire));
        last.elapsed()
    }
}

/// Aborts its task when dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The task that renews one tenure's lease every quarter TTL, moving its clock.
struct Renewer {
    client: Client,
    lease: i64,
    clock: Arc<LeaseClock>,
    config: ExclusiveConfig,
    progress: Arc<Progress>,
}

impl Renewer {
    /// Renews until the lease is gone (said on `gone`) or the driver stops showing
    /// progress (then it stops, and the lease lapses).
    ///
    /// Pipelined: a renewal is sent every quarter TTL whether or not the ones before
    /// were answered (at most [`MAX_IN_FLIGHT`]), and each answer, in order, moves the
    /// deadline to when *its* renewal was sent plus the TTL granted. So a link whose
    /// round trip is long (up to about three quarters of the TTL) keeps the lease as well
    /// as a fast one. Answers that stop coming for the request timeout reopen the stream.
    async fn run(self, gone: tokio::sync::oneshot::Sender<String>) {
        let period = self.config.lease_ttl / 4;
        let mut stream: Option<(etcd_client::LeaseKeeper, etcd_client::LeaseKeepAliveStream)> = None;
        // When each unanswered renewal was sent, oldest first.
        let mut sent: std::collections::VecDeque<Instant> = std::collections::VecDeque::new();
        let mut next = Instant::now() + period;
        loop {
            let stalled = sent.front().is_some_and(|&at| at.elapsed() > self.config.request_timeout);
            if stalled {
                (stream, next) = (None, Instant::now());
                sent.clear();
            }
            let answer = async {
                match stream.as_mut() {
                    Some((_, answers)) if !sent.is_empty() => answers.message().await,
                    _ => std::future::pending().await,
                }
            };
            tokio::select! {
                answer = answer => match answer {
                    Ok(Some(response)) if response.ttl() > 0 => {
                        let asked = sent.pop_front().expect("an answer to a renewal sent");
                        self.clock.extend(self.config.deadline(asked, response.ttl()));
                    }
                    Ok(Some(_)) => {
                        let _ = gone.send("etcd no longer knows the lease".to_owned());
                        return;
                    }
                    _ => {
                        (stream, next) = (None, Instant::now() + FIRST_RETRY);
                        sent.clear();
                    }
                },
                () = tokio::time::sleep_until(next) => {
                    next = Instant::now() + period;
                    if self.progress.since() > self.config.lease_ttl + self.config.request_timeout {
                        tracing::warn!(lease = self.lease, "exclusive: the lease driver is stuck; no more renewals");
                        return;
                    }
                    if stream.is_none() {
                        // Opening the stream renews once, but its answer is not handed
                        // out: that renewal earns no credit, the next one does.
                        let mut leases = self.client.lease_client();
                        match tokio::time::timeout(self.config.request_timeout, leases.keep_alive(self.lease)).await {
                            Ok(Ok(opened)) => stream = Some(opened),
                            Ok(Err(etcd_client::Error::LeaseKeepAliveError(m))) if m == "lease not found" => {
                                let _ = gone.send("etcd no longer knows the lease".to_owned());
                                return;
                            }
                            _ => {
                                next = Instant::now() + FIRST_RETRY;
                                continue;
                            }
                        }
                    }
                    if sent.len() < MAX_IN_FLIGHT {
                        let (keeper, _) = stream.as_mut().expect("opened above");
                        let asked = Instant::now();
                        if keeper.keep_alive().await.is_ok() {
                            sent.push_back(asked);
                        } else {
                            (stream, next) = (None, Instant::now() + FIRST_RETRY);
                            sent.clear();
                        }
                    }
                }
            }
        }
    }
}

/// The next message of the watch (pending forever without one).
async fn next_event(
    events: &mut Option<etcd_client::WatchStream>,
) -> Result<Option<etcd_client::WatchResponse>, etcd_client::Error> {
    match events {
        Some(stream) => stream.message().await,
        None => std::future::pending().await,
    }
}
