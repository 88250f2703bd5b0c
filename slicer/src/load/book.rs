//! [`LoadBook`]: the latest load report of every known task of every job an Assigner
//! runs, and the assignments those reports refer to; and the latest load report of each
//! client that reports load per key range (gRFC A119), bounded per job.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use steady_proto::autosharding::ranges::RangeRates;
use steady_slice::Assignment;

use steady_slicelet::LoadReport;

/// How many of a job's latest generations reports may refer to. A report for an older
/// generation is dropped: its slices are too stale to say where load is now.
const KEPT_GENERATIONS: usize = 4;

/// Why [`LoadBook::accept`] or [`LoadBook::accept_client`] dropped a report. Every drop
/// is counted ([`LoadBook::dropped`], [`LoadBook::clients_dropped`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dropped {
    /// No Assigner here runs this job.
    UnknownJob,
    /// The job has no such task (it left, or never was).
    UnknownTask,
    /// Not one of the job's last 4 generations (too old, or never published): an older
    /// generation's slices are too stale to say where load is now.
    UnknownGeneration,
    /// A client's identifier longer than [`MAX_CLIENT_ID_BYTES`].
    ClientIdTooLong,
    /// A client's report with more ranges than its job may keep in all
    /// ([`ClientLimits::max_ranges`]).
    TooManyRanges,
}

impl fmt::Display for Dropped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::UnknownJob => "load report for a job this Assigner does not run",
            Self::UnknownTask => "load report from a task the job does not have",
            Self::UnknownGeneration => "load report for a generation that is unknown or too old",
            Self::ClientIdTooLong => "client load report with an identifier longer than allowed",
            Self::TooManyRanges => "client load report with more ranges than a job may keep",
        })
    }
}

impl std::error::Error for Dropped {}

/// A report with when it arrived and the assignment it refers to.
#[derive(Debug, Clone)]
pub struct Received {
    /// The report.
    pub report: LoadReport,
    /// When it was accepted (tokio's clock, so that tests on a paused clock can age it).
    pub at: Instant,
    /// The assignment of the report's generation.
    pub assignment: Arc<Assignment>,
}

/// The longest client identifier kept (a UUID in text is 36 bytes).
pub const MAX_CLIENT_ID_BYTES: usize = 128;

/// How much of clients' load a [`LoadBook`] keeps per job. When a report would pass
/// either bound, the reports that arrived longest ago are evicted until it fits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientLimits {
    /// The most clients whose latest report is kept.
    pub max_clients: usize,
    /// The most ranges kept, summed over the kept reports.
    pub max_ranges: usize,
}

impl Default for ClientLimits {
    /// 16,384 clients and 1,048,576 ranges per job (about 25 MB of ranges).
    fn default() -> Self {
        Self { max_clients: 16_384, max_ranges: 1 << 20 }
    }
}

/// A client's latest load report, as rates, with when it arrived.
///
/// A client reports the load it saw since its previous report, so its latest report
/// already is its current rate: the sum over clients of their latest fresh reports is
/// the job's rate as clients see it.
#[derive(Debug, Clone)]
pub struct ClientReceived {
    /// The client's identifier (its UUID, as it sent it).
    pub client: String,
    /// The report's load per key range, in rates per second.
    pub rates: Arc<RangeRates>,
    /// When it was accepted (tokio's clock).
    pub at: Instant,
}

/// The kept client reports of one job, with an index by arrival for eviction.
#[derive(Debug, Default)]
struct ClientBook {
    /// By client: the report and its key in `by_arrival`.
    reports: HashMap<String, (ClientReceived, u64)>,
    /// Arrival order (a sequence number, increasing with arrival) to client.
    by_arrival: BTreeMap<u64, String>,
    next: u64,
    /// The ranges of all kept reports.
    ranges: usize,
}

impl ClientBook {
    fn remove(&mut self, client: &str) {
        if let Some((old, seq)) = self.reports.remove(client) {
            self.by_arrival.remove(&seq);
            self.ranges -= old.rates.ranges.len();
        }
    }

    /// Evicts the report that arrived first; whether there was one.
    fn evict_stalest(&mut self) -> bool {
        let Some((_, client)) = self.by_arrival.pop_first() else { return false };
        if let Some((old, _)) = self.reports.remove(&client) {
            self.ranges -= old.rates.ranges.len();
        }
        true
    }
}

#[derive(Debug, Default)]
struct JobBook {
    /// The latest generations, newest last.
    published: VecDeque<Arc<Assignment>>,
    tasks: BTreeSet<u32>,
    reports: HashMap<u32, Received>,
    clients: ClientBook,
}

/// The load reports an Assigner bases its runs on.
///
/// Shared (clone it; clones share state) between the report collector, which calls
/// [`LoadBook::accept`] for every report received, and the Assigner, which tells it
/// what it published ([`LoadBook::published`]) and reads the fresh reports back
/// ([`LoadBook::fresh`]).
///
/// Clients that report load per key range (gRFC A119) feed it through
/// [`LoadBook::accept_client`]; the Assigner reads theirs back with
/// [`LoadBook::fresh_clients`].
///
/// **Bounded**: only the Assigner creates jobs and names their tasks; remote peers can
/// only replace the one report kept per known task, so nothing a peer sends grows it.
/// Clients are not known in advance: per job at most [`ClientLimits::max_clients`]
/// reports and [`ClientLimits::max_ranges`] ranges are kept, the report that arrived
/// longest ago evicted to make room, and a client's identifier is at most
/// [`MAX_CLIENT_ID_BYTES`] long.
#[derive(Debug, Clone, Default)]
pub struct LoadBook {
    jobs: Arc<Mutex<HashMap<String, JobBook>>>,
    accepted: Arc<AtomicU64>,
    dropped: Arc<AtomicU64>,
    clients: ClientCounters,
    client_limits: ClientLimits,
}

#[derive(Debug, Clone, Default)]
struct ClientCounters {
    accepted: Arc<AtomicU64>,
    dropped: Arc<AtomicU64>,
    evicted: Arc<AtomicU64>,
}

impl LoadBook {
    /// An empty book, with the default [`ClientLimits`].
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty book that keeps at most `limits` of each job's client reports.
    pub fn with_client_limits(limits: ClientLimits) -> Self {
        Self { client_limits: limits, ..Self::default() }
    }

    /// Records that `assignment` is `job`'s newest generation and `tasks` its tasks:
    /// reports for it (and the few generations before) are accepted from those tasks;
    /// kept reports of tasks no longer listed are forgotten.
    pub fn published(&self, job: &str, assignment: Arc<Assignment>, tasks: impl IntoIterator<Item = u32>) {
        let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        let book = jobs.entry(job.to_owned()).or_default();
        if book.published.back().is_none_or(|a| a.generation() < assignment.generation()) {
            book.published.push_back(assignment);
            while book.published.len() > KEPT_GENERATIONS {
                book.published.pop_front();
            }
        }
        book.tasks = tasks.into_iter().collect();
        let known = &book.tasks;
        book.reports.retain(|t, _| known.contains(t));
    }

    /// Sets `job`'s known tasks (no effect on a job not yet [`published`]): reports from
    /// tasks that joined are accepted from now on, kept reports of tasks that left are
    /// forgotten. The Assigner calls it when the task set changes without a new
    /// generation.
    ///
    /// [`published`]: LoadBook::published
    pub fn set_tasks(&self, job: &str, tasks: impl IntoIterator<Item = u32>) {
        let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(book) = jobs.get_mut(job) {
            book.tasks = tasks.into_iter().collect();
            let known = &book.tasks;
            book.reports.retain(|t, _| known.contains(t));
        }
    }

    /// Keeps `report` as its task's latest, unless it is older than the one kept.
    ///
    /// # Errors
    ///
    /// [`Dropped`] for an unknown job, task or generation (counted).
    pub fn accept(&self, report: LoadReport) -> Result<(), Dropped> {
        let result = self.try_accept(report);
        let counter = if result.is_ok() { &self.accepted } else { &self.dropped };
        counter.fetch_add(1, Ordering::Relaxed);
        result
    }

    fn try_accept(&self, report: LoadReport) -> Result<(), Dropped> {
        let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        let book = jobs.get_mut(report.job()).ok_or(Dropped::UnknownJob)?;
        if !book.tasks.contains(&report.task()) {
            return Err(Dropped::UnknownTask);
        }
        let assignment = book
            .published
            .iter()
            .find(|a| a.generation() == report.generation())
            .cloned()
            .ok_or(Dropped::UnknownGeneration)?;
        let newer =
            book.reports.get(&report.task()).is_none_or(|r| r.report.generation() <= report.generation());
        if newer {
            book.reports.insert(report.task(), Received { report, at: Instant::now(), assignment });
        }
        Ok(())
    }

    /// The reports of `job` received within `max_age`, one per task, by task.
    pub fn fresh(&self, job: &str, max_age: Duration) -> Vec<Received> {
        let jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        let Some(book) = jobs.get(job) else { return Vec::new() };
        let mut fresh: Vec<Received> =
            book.reports.values().filter(|r| r.at.elapsed() <= max_age).cloned().collect();
        fresh.sort_by_key(|r| r.report.task());
        fresh
    }

    /// Keeps `rates` as `client`'s latest load report for `job` (replacing the one kept),
    /// evicting the reports that arrived longest ago when the job's [`ClientLimits`]
    /// would be passed. A report without ranges is kept too: the client saw no load.
    ///
    /// # Errors
    ///
    /// [`Dropped::UnknownJob`] for a job no Assigner here published,
    /// [`Dropped::ClientIdTooLong`] for an identifier over [`MAX_CLIENT_ID_BYTES`],
    /// [`Dropped::TooManyRanges`] for a report that alone passes
    /// [`ClientLimits::max_ranges`] (counted; the kept report stays).
    pub fn accept_client(&self, job: &str, client: &str, rates: RangeRates) -> Result<(), Dropped> {
        let result = self.try_accept_client(job, client, rates);
        let counter = if result.is_ok() { &self.clients.accepted } else { &self.clients.dropped };
        counter.fetch_add(1, Ordering::Relaxed);
        result
    }

    fn try_accept_client(&self, job: &str, client: &str, rates: RangeRates) -> Result<(), Dropped> {
        if client.len() > MAX_CLIENT_ID_BYTES {
            return Err(Dropped::ClientIdTooLong);
        }
        let limits = self.client_limits;
        if rates.ranges.len() > limits.max_ranges {
            return Err(Dropped::TooManyRanges);
        }
        let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        let book = &mut jobs.get_mut(job).ok_or(Dropped::UnknownJob)?.clients;
        book.remove(client);
        let mut evicted = 0;
        while (book.reports.len() >= limits.max_clients
            || book.ranges + rates.ranges.len() > limits.max_ranges)
            && book.evict_stalest()
        {
            evicted += 1;
        }
        self.clients.evicted.fetch_add(evicted, Ordering::Relaxed);
        if limits.max_clients == 0 {
            return Ok(());
        }
        let seq = book.next;
        book.next += 1;
        book.ranges += rates.ranges.len();
        book.by_arrival.insert(seq, client.to_owned());
        let received =
            ClientReceived { client: client.to_owned(), rates: Arc::new(rates), at: Instant::now() };
        book.reports.insert(client.to_owned(), (received, seq));
        Ok(())
    }

    /// The client reports of `job` received within `max_age`, one per client, by client.
    pub fn fresh_clients(&self, job: &str, max_age: Duration) -> Vec<ClientReceived> {
        let jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        let Some(book) = jobs.get(job) else { return Vec::new() };
        let mut fresh: Vec<ClientReceived> = book
            .clients
            .reports
            .values()
            .filter(|(r, _)| r.at.elapsed() <= max_age)
            .map(|(r, _)| r.clone())
            .collect();
        fresh.sort_by(|a, b| a.client.cmp(&b.client));
        fresh
    }

    /// Stops accepting reports (the Slicelets' and the clients') for `job` and forgets
    /// it.
    pub fn forget(&self, job: &str) {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner()).remove(job);
    }

    /// Reports accepted so far.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    /// Reports dropped so far (unknown job, task or generation).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Client reports accepted so far.
    pub fn clients_accepted(&self) -> u64 {
        self.clients.accepted.load(Ordering::Relaxed)
    }

    /// Client reports dropped so far ([`Dropped`]: unknown job, identifier too long,
    /// too many ranges).
    pub fn clients_dropped(&self) -> u64 {
        self.clients.dropped.load(Ordering::Relaxed)
    }

    /// Kept client reports evicted so far to make room under [`ClientLimits`].
    pub fn clients_evicted(&self) -> u64 {
        self.clients.evicted.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use steady_slice::SliceKey;

    use super::*;

    fn report(task: u32, generation: u64) -> LoadReport {
        LoadReport::new("job", task, generation, vec![(SliceKey(0), 5.0)], vec![]).unwrap()
    }

    #[test]
    fn reports_from_unknown_jobs_tasks_and_generations_are_dropped_and_counted() {
        let book = LoadBook::new();
        assert_eq!(book.accept(report(0, 1)), Err(Dropped::UnknownJob));
        book.published("job", Arc::new(Assignment::single(1, vec![0, 1]).unwrap()), [0, 1]);
        assert_eq!(book.accept(report(0, 1)), Ok(()));
        assert_eq!(book.accept(report(7, 1)), Err(Dropped::UnknownTask));
        assert_eq!(book.accept(report(1, 2)), Err(Dropped::UnknownGeneration));
        for g in 2..=1 + KEPT_GENERATIONS as u64 {
            book.published("job", Arc::new(Assignment::single(g, vec![0, 1]).unwrap()), [0, 1]);
        }
        // Generation 1 is now one too many back.
        assert_eq!(book.accept(report(1, 1)), Err(Dropped::UnknownGeneration));
        assert_eq!((book.accepted(), book.dropped()), (1, 4));
    }

    #[test]
    fn the_latest_report_per_task_is_kept_and_departed_tasks_are_forgotten() {
        let book = LoadBook::new();
        book.published("job", Arc::new(Assignment::single(1, vec![0, 1]).unwrap()), [0, 1]);
        book.published("job", Arc::new(Assignment::single(2, vec![0, 1]).unwrap()), [0, 1]);
        book.accept(report(0, 2)).unwrap();
        book.accept(report(0, 1)).unwrap();
        book.accept(report(1, 1)).unwrap();
        let fresh = book.fresh("job", Duration::from_secs(60));
        assert_eq!(
            fresh.iter().map(|r| (r.report.task(), r.report.generation())).collect::<Vec<_>>(),
            [(0, 2), (1, 1)]
        );
        assert_eq!(fresh[1].assignment.generation(), 1);
        book.published("job", Arc::new(Assignment::single(3, vec![0]).unwrap()), [0]);
        assert_eq!(book.fresh("job", Duration::from_secs(60)).len(), 1);
        // A task that joins without a new generation is accepted once it is known.
        assert_eq!(book.accept(report(5, 3)), Err(Dropped::UnknownTask));
        book.set_tasks("job", [0, 5]);
        assert_eq!(book.accept(report(5, 3)), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn reports_older_than_the_age_asked_for_are_not_fresh() {
        let book = LoadBook::new();
        book.published("job", Arc::new(Assignment::single(1, vec![0, 1]).unwrap()), [0, 1]);
        book.accept(report(0, 1)).unwrap();
        tokio::time::advance(Duration::from_secs(20)).await;
        book.accept(report(1, 1)).unwrap();
        tokio::time::advance(Duration::from_secs(15)).await;
        let fresh: Vec<u32> =
            book.fresh("job", Duration::from_secs(30)).iter().map(|r| r.report.task()).collect();
        assert_eq!(fresh, [1]);
    }

    /// Rates over `n` contiguous ranges of 1 per second each.
    fn rates(n: u64) -> RangeRates {
        let ranges = (0..n).map(|i| (SliceKey(i * 10), Some(SliceKey(i * 10 + 10)), 1.0)).collect();
        RangeRates { ranges, interval: Duration::from_secs(10) }
    }

    fn clients_of(book: &LoadBook) -> Vec<String> {
        book.fresh_clients("job", Duration::from_secs(3600)).into_iter().map(|r| r.client).collect()
    }

    #[test]
    fn client_reports_for_unknown_jobs_or_with_overlong_ids_are_dropped_and_counted() {
        let book = LoadBook::new();
        assert_eq!(book.accept_client("job", "a", rates(1)), Err(Dropped::UnknownJob));
        book.published("job", Arc::new(Assignment::single(1, vec![0]).unwrap()), [0]);
        assert_eq!(book.accept_client("job", "a", rates(1)), Ok(()));
        let long = "x".repeat(MAX_CLIENT_ID_BYTES + 1);
        assert_eq!(book.accept_client("job", &long, rates(1)), Err(Dropped::ClientIdTooLong));
        assert_eq!(book.accept_client("job", &long[1..], rates(1)), Ok(()), "the longest id allowed");
        assert_eq!((book.clients_accepted(), book.clients_dropped()), (2, 2));
        assert_eq!((book.accepted(), book.dropped()), (0, 0), "the Slicelets' counters are apart");
    }

    #[test]
    fn the_latest_report_per_client_is_kept_and_forget_drops_them() {
        let book = LoadBook::new();
        book.published("job", Arc::new(Assignment::single(1, vec![0]).unwrap()), [0]);
        book.accept_client("job", "b", rates(1)).unwrap();
        book.accept_client("job", "a", rates(2)).unwrap();
        book.accept_client("job", "b", rates(3)).unwrap();
        let fresh = book.fresh_clients("job", Duration::from_secs(60));
        let kept: Vec<(&str, usize)> =
            fresh.iter().map(|r| (r.client.as_str(), r.rates.ranges.len())).collect();
        assert_eq!(kept, [("a", 2), ("b", 3)]);
        book.forget("job");
        assert!(book.fresh_clients("job", Duration::from_secs(60)).is_empty());
        assert_eq!(book.accept_client("job", "a", rates(1)), Err(Dropped::UnknownJob));
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_job_evicts_the_client_report_that_arrived_longest_ago() {
        let book = LoadBook::with_client_limits(ClientLimits { max_clients: 3, max_ranges: 10 });
        book.published("job", Arc::new(Assignment::single(1, vec![0]).unwrap()), [0]);
        for client in ["a", "b", "c"] {
            book.accept_client("job", client, rates(1)).unwrap();
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        // "a" reports again: now "b" is the stalest.
        book.accept_client("job", "a", rates(1)).unwrap();
        book.accept_client("job", "d", rates(1)).unwrap();
        assert_eq!(clients_of(&book), ["a", "c", "d"], "the fourth client evicts b");
        // 9 more ranges do not fit beside 3 (nor a fourth client): the two stalest
        // reports make room.
        book.accept_client("job", "e", rates(9)).unwrap();
        assert_eq!(clients_of(&book), ["d", "e"]);
        assert_eq!(book.clients_evicted(), 3);
        // A report larger than the job may keep is dropped; the kept ones stay.
        assert_eq!(book.accept_client("job", "f", rates(11)), Err(Dropped::TooManyRanges));
        assert_eq!(clients_of(&book), ["d", "e"]);
    }

    #[test]
    fn hostile_clients_never_grow_a_job_past_its_limits() {
        let limits = ClientLimits { max_clients: 50, max_ranges: 200 };
        let book = LoadBook::with_client_limits(limits);
        book.published("job", Arc::new(Assignment::single(1, vec![0]).unwrap()), [0]);
        for i in 0..2_000u64 {
            book.accept_client("job", &format!("client-{i}"), rates(1 + i % 9)).unwrap();
            let fresh = book.fresh_clients("job", Duration::from_secs(60));
            let ranges: usize = fresh.iter().map(|r| r.rates.ranges.len()).sum();
            assert!(fresh.len() <= limits.max_clients && ranges <= limits.max_ranges, "{i}");
        }
        assert!(clients_of(&book).contains(&"client-1999".to_owned()), "the newest is kept");
    }

    #[tokio::test(start_paused = true)]
    async fn client_reports_older_than_the_age_asked_for_are_not_fresh() {
        let book = LoadBook::new();
        book.published("job", Arc::new(Assignment::single(1, vec![0]).unwrap()), [0]);
        book.accept_client("job", "old", rates(1)).unwrap();
        tokio::time::advance(Duration::from_secs(20)).await;
        book.accept_client("job", "new", rates(1)).unwrap();
        tokio::time::advance(Duration::from_secs(15)).await;
        assert_eq!(
            book.fresh_clients("job", Duration::from_secs(30))
                .iter()
                .map(|r| r.client.as_str())
                .collect::<Vec<_>>(),
            ["new"]
        );
    }
}
