//! The soak's invariants: what the monitors saw ([`Observations`]), each invariant's
//! stated bound, and the verdict, a row per invariant.

use std::time::{Duration, Instant};

use super::load::Counts;
use super::memory::{Growth, MemoryLog, MAX_GROWTH, SLACK_MIB};
use super::schedule::{Fault, Injected};

/// No slice of the newest assignment without a serving replica for longer than this
/// (with two replicas per slice and one fault at a time, none should be).
pub(super) const UNCOVERED: Duration = Duration::from_secs(2);
/// Every frontend routes by a publication within this long after the lab saw it in
/// the store.
pub(super) const LAG: Duration = Duration::from_secs(3);
/// A running instance's Distributor serves the store's newest generation within this
/// long (a standby's follows the store's etcd watch, the backup path).
pub(super) const DISTRIBUTOR_LAG: Duration = Duration::from_secs(3);
/// A running instance prints its status line (once a second) at least this often.
pub(super) const STATUS_GAP: Duration = Duration::from_secs(3);
/// A running backend beats (four times a second) at least this often.
pub(super) const BEAT_GAP: Duration = Duration::from_secs(2);
/// A running backend sends a load report at least this often (two reporters, one every
/// 500 ms each).
pub(super) const REPORT_GAP: Duration = Duration::from_secs(5);
/// A running steady-slicer instance answers its `/metrics` page at least this often.
pub(super) const PAGE_GAP: Duration = Duration::from_secs(5);
/// The leading instance's load collector accepts a report at least this often (a
/// reporter reconnecting to a restarted instance backs off up to 10 s; a standby drops
/// every report until it leads).
pub(super) const COLLECTOR_GAP: Duration = Duration::from_secs(12);
/// Some instance leads, and some leader's Assigner runs, at least this often (the
/// election's lease is 2 s, the cadence 1 s).
pub(super) const LEADERLESS: Duration = Duration::from_secs(10);

/// A stretch of time a condition held: the longest, and how often it began.
#[derive(Debug, Default, Clone)]
pub(super) struct Stretch {
    since: Option<Instant>,
    pub(super) longest: Duration,
    pub(super) episodes: u32,
}

impl Stretch {
    /// Whether the condition holds `now`.
    pub(super) fn observe(&mut self, holds: bool, now: Instant) {
        match (holds, self.since) {
            (true, None) => {
                self.since = Some(now);
                self.episodes += 1;
            }
            (true, Some(since)) => self.longest = self.longest.max(now - since),
            (false, _) => self.since = None,
        }
    }
}

/// The longest of some gap, and whose.
#[derive(Debug, Default, Clone)]
pub(super) struct Gap {
    pub(super) longest: Duration,
    pub(super) who: String,
    /// When the longest was seen.
    pub(super) when: Option<Instant>,
}

impl Gap {
    pub(super) fn observe(&mut self, gap: Duration, who: &str) {
        if gap > self.longest {
            self.longest = gap;
            who.clone_into(&mut self.who);
            self.when = Some(Instant::now());
        }
    }
}

/// What the monitors saw over the soak.
#[derive(Debug, Default)]
pub(super) struct Observations {
    /// When the monitors started (times in the table count from there).
    pub(super) began: Option<Instant>,
    /// Any slice of the newest assignment without a serving replica.
    pub(super) uncovered: Stretch,
    /// The largest share of the key space uncovered at once.
    pub(super) uncovered_share: f64,
    /// Per publication, how long until every frontend routed by it (or a newer one).
    pub(super) lag: Vec<Duration>,
    /// The longest a publication was waited for (resolved or not).
    pub(super) lag_waiting: Duration,
    /// A running instance's Distributor behind the store.
    pub(super) distributor_gap: Gap,
    /// A running instance without a status line.
    pub(super) status_gap: Gap,
    pub(super) beat_gap: Gap,
    pub(super) report_gap: Gap,
    pub(super) page_gap: Gap,
    pub(super) collector_gap: Gap,
    /// Time since an instance last said it leads.
    pub(super) leaderless: Gap,
    /// Time since an instance's Assigner last ran.
    pub(super) runless: Gap,
    pub(super) memory: MemoryLog,
}

/// One invariant's verdict.
#[derive(Debug, Clone)]
pub(super) struct Row {
    pub(super) invariant: String,
    pub(super) bound: String,
    pub(super) observed: String,
    pub(super) holds: bool,
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

fn gap_row(o: &Observations, invariant: &str, gap: &Gap, bound: Duration) -> Row {
    let at =
        gap.when.zip(o.began).map_or(String::new(), |(w, b)| format!(" at {:.0} s", (w - b).as_secs_f64()));
    let who = if gap.who.is_empty() { String::new() } else { format!(" ({}{at})", gap.who) };
    Row {
        invariant: invariant.to_owned(),
        bound: format!("<= {}", secs(bound)),
        observed: format!("{}{who}", secs(gap.longest)),
        holds: gap.longest <= bound,
    }
}

/// Every invariant's row: the requests lost before the first fault and per kind of
/// fault, coverage, the frontends' lag, the control tasks, memory.
pub(super) fn judge(
    o: &Observations,
    faults: &[Injected],
    windows: &[Counts],
    memory: &[Growth],
) -> Vec<Row> {
    let mut rows = Vec::new();
    let quiet = windows.first().map_or(0, Counts::lost);
    rows.push(Row {
        invariant: "requests lost before the first fault".into(),
        bound: "0".into(),
        observed: quiet.to_string(),
        holds: quiet == 0,
    });
    let mut kinds: Vec<_> = faults.iter().map(|f| f.fault).collect();
    kinds.dedup();
    kinds.sort_by_key(|k| k.name());
    kinds.dedup();
    for kind in kinds {
        let (worst, at, bound) = faults
            .iter()
            .filter(|f| f.fault == kind)
            .map(|f| (windows.get(f.window).map_or(0, Counts::lost), f.at, f.bound))
            .max_by_key(|(lost, _, bound)| (lost > bound, *lost))
            .unwrap_or_default();
        rows.push(Row {
            invariant: format!("requests lost per {} (worst)", kind.name()),
            bound: format!("<= {bound}"),
            observed: format!("{worst} (at {:.0} s)", at.as_secs_f64()),
            holds: worst <= bound,
        });
    }
    let rotations: Vec<&Injected> = faults.iter().filter(|f| f.fault == Fault::CertRotate).collect();
    if !rotations.is_empty() {
        let violations: Vec<&String> = rotations.iter().flat_map(|f| &f.violations).collect();
        rows.push(Row {
            invariant: "a rotation taken by every process; the dropped CA refused by every server".into(),
            bound: "every rotation".into(),
            observed: match violations.first() {
                None => format!("{} of {} rotations", rotations.len(), rotations.len()),
                Some(first) => format!("{} violations; first: {first}", violations.len()),
            },
            holds: violations.is_empty(),
        });
    }
    rows.push(Row {
        invariant: "a slice without a serving replica".into(),
        bound: format!("<= {}", secs(UNCOVERED)),
        observed: format!(
            "{} longest, {} times, {:.1}% of keys at most",
            secs(o.uncovered.longest),
            o.uncovered.episodes,
            o.uncovered_share * 100.0
        ),
        holds: o.uncovered.longest <= UNCOVERED,
    });
    let mut lags = o.lag.clone();
    lags.sort_unstable();
    let worst = lags.last().copied().unwrap_or_default().max(o.lag_waiting);
    rows.push(Row {
        invariant: "every frontend on a new generation".into(),
        bound: format!("<= {} after it is stored", secs(LAG)),
        observed: format!(
            "{} worst, {} median, {} publications",
            secs(worst),
            secs(lags.get(lags.len() / 2).copied().unwrap_or_default()),
            lags.len()
        ),
        holds: worst <= LAG,
    });
    rows.push(gap_row(
        o,
        "a running instance's Distributor behind the store",
        &o.distributor_gap,
        DISTRIBUTOR_LAG,
    ));
    rows.push(gap_row(o, "a running instance's status line silent", &o.status_gap, STATUS_GAP));
    rows.push(gap_row(o, "a running backend silent (heartbeat)", &o.beat_gap, BEAT_GAP));
    rows.push(gap_row(o, "a running backend sending no load report", &o.report_gap, REPORT_GAP));
    rows.push(gap_row(o, "a running instance not answering /metrics", &o.page_gap, PAGE_GAP));
    rows.push(gap_row(o, "the leader's collector accepting no report", &o.collector_gap, COLLECTOR_GAP));
    rows.push(gap_row(o, "no instance leading", &o.leaderless, LEADERLESS));
    rows.push(gap_row(o, "no Assigner run", &o.runless, LEADERLESS));
    let judged: Vec<&Growth> = memory.iter().filter(|g| g.first_mib.is_some() && g.judged()).collect();
    let worst =
        judged.iter().max_by(|a, b| a.ratio().partial_cmp(&b.ratio()).unwrap_or(std::cmp::Ordering::Equal));
    let violated: Vec<&str> = judged.iter().filter(|g| g.violated()).map(|g| g.name.as_str()).collect();
    rows.push(Row {
        invariant: "memory (RSS) growing without bound".into(),
        bound: format!(
            "last window <= {MAX_GROWTH}x the first, or within {SLACK_MIB} MiB (etcd's listed, not judged)"
        ),
        observed: match worst {
            Some(g) => format!(
                "worst {:.2}x ({}), {} lives judged{}",
                g.ratio().unwrap_or(0.0),
                g.name,
                judged.len(),
                if violated.is_empty() { String::new() } else { format!("; grew: {}", violated.join(", ")) }
            ),
            None => "no life long enough to judge".into(),
        },
        holds: violated.is_empty(),
    });
    rows
}
