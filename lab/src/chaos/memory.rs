//! Memory over the soak: every process's resident set (`VmRSS` in `/proc/<pid>/status`)
//! sampled once a second, and the judgement of whether it grew without bound.
//!
//! Each process life (a name and a pid: a restarted backend is a new life) is judged on
//! its own: after a warm-up, the mean of its first window is compared with the mean of
//! its last. It grew without bound when the last is above [`MAX_GROWTH`] times the first
//! *and* more than [`SLACK_MIB`] above it (a few MiB of allocator arenas and caches are
//! not a leak in a process of ten). A life too short for a warm-up and two windows is
//! listed, not judged; so are the etcd members' ([`Growth::judged`]).

use std::collections::BTreeMap;
use std::time::Duration;

/// The largest ratio of the last window's mean to the first's.
pub(super) const MAX_GROWTH: f64 = 1.5;
/// Growth below this many MiB passes whatever the ratio.
pub(super) const SLACK_MIB: f64 = 8.0;

/// The resident set of process `pid` in KiB (`None` when it is gone).
pub(super) fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Samples per process life: (seconds since the soak started, KiB).
#[derive(Debug, Default)]
pub(super) struct MemoryLog {
    lives: BTreeMap<(String, u32), Vec<(f64, u64)>>,
}

/// One process life's judgement.
#[derive(Debug, Clone)]
pub(super) struct Growth {
    pub(super) name: String,
    pub(super) pid: u32,
    /// How long it was sampled.
    pub(super) lived: Duration,
    /// The first and last windows' means, MiB (`None`: too short a life to judge).
    pub(super) first_mib: Option<f64>,
    pub(super) last_mib: f64,
    /// The largest sample, MiB.
    pub(super) peak_mib: f64,
}

impl Growth {
    /// The last window's mean over the first's.
    pub(super) fn ratio(&self) -> Option<f64> {
        self.first_mib.map(|first| self.last_mib / first.max(f64::MIN_POSITIVE))
    }

    /// Whether it grew without bound (see the module docs); `false` when not judged.
    pub(super) fn violated(&self) -> bool {
        self.judged()
            && self
                .first_mib
                .is_some_and(|first| self.last_mib > first * MAX_GROWTH && self.last_mib - first > SLACK_MIB)
    }

    /// Whether it is one of steady's processes (or the lab), judged, rather than an etcd
    /// member: etcd keeps every revision until it is compacted (the test cluster never
    /// is) and maps its database file, so its resident set grows with the writes (about
    /// 15 MiB in 100 s of this soak's), which says nothing about steady.
    pub(super) fn judged(&self) -> bool {
        !self.name.starts_with("etcd-")
    }
}

impl MemoryLog {
    /// Records a sample of `name`'s process `pid`, `at` seconds into the soak.
    pub(super) fn record(&mut self, name: &str, pid: u32, at: f64, kib: u64) {
        self.lives.entry((name.to_owned(), pid)).or_default().push((at, kib));
    }

    /// Every life, judged: a warm-up of a sixth of its life (at least 10 s), then windows
    /// of a sixth (at least 5 s).
    pub(super) fn judge(&self) -> Vec<Growth> {
        self.lives
            .iter()
            .filter(|(_, samples)| !samples.is_empty())
            .map(|((name, pid), samples)| {
                let (start, end) = (samples[0].0, samples[samples.len() - 1].0);
                let lived = end - start;
                let warm_up = (lived / 6.0).max(10.0);
                let window = (lived / 6.0).max(5.0);
                let mean = |from: f64, to: f64| {
                    let inside: Vec<u64> =
                        samples.iter().filter(|(t, _)| *t >= from && *t <= to).map(|(_, k)| *k).collect();
                    (!inside.is_empty())
                        .then(|| inside.iter().sum::<u64>() as f64 / inside.len() as f64 / 1024.0)
                };
                let judged = lived >= warm_up + 2.0 * window;
                let first = if judged { mean(start + warm_up, start + warm_up + window) } else { None };
                let last = mean(end - window, end).unwrap_or(0.0);
                let peak = samples.iter().map(|(_, k)| *k).max().unwrap_or(0) as f64 / 1024.0;
                Growth {
                    name: name.clone(),
                    pid: *pid,
                    lived: Duration::from_secs_f64(lived.max(0.0)),
                    first_mib: first,
                    last_mib: last,
                    peak_mib: peak,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn life(kib: impl Fn(f64) -> u64, seconds: u32) -> Growth {
        let mut log = MemoryLog::default();
        for s in 0..=seconds {
            log.record("p", 1, f64::from(s), kib(f64::from(s)));
        }
        log.judge().remove(0)
    }

    #[test]
    fn a_flat_process_passes_and_a_leaking_one_is_caught() {
        let flat = life(|_| 20 * 1024, 60);
        assert_eq!(flat.ratio(), Some(1.0));
        assert!(!flat.violated());
        // 20 MiB growing by 1 MiB a second.
        let leaking = life(|t| (20.0 * 1024.0 + t * 1024.0) as u64, 60);
        assert!(leaking.violated(), "{leaking:?}");
        // Doubling from 2 MiB is within the slack.
        let small = life(|t| (2048.0 + t * 40.0) as u64, 60);
        assert!(small.ratio().unwrap() > MAX_GROWTH && !small.violated(), "{small:?}");
    }

    #[test]
    fn an_etcd_member_is_listed_not_judged() {
        let mut log = MemoryLog::default();
        for s in 0..=60u32 {
            log.record("etcd-0", 1, f64::from(s), 20 * 1024 + u64::from(s) * 1024);
        }
        let etcd = log.judge().remove(0);
        assert!(etcd.ratio().unwrap() > MAX_GROWTH && !etcd.judged() && !etcd.violated(), "{etcd:?}");
    }

    #[test]
    fn a_short_life_is_not_judged() {
        let short = life(|t| (t * 1024.0 * 100.0) as u64, 15);
        assert_eq!(short.first_mib, None);
        assert!(!short.violated());
    }
}
