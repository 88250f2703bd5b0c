//! The benchmark's output: a row per mode and the comparison with Slicer's figures.
//!
//! The row's columns are what `lab/tests/consistent.rs` reads, by position: mode,
//! requests, satisfied %, refused, rerouted, unowned, overlaps, timed out, failed,
//! p50 µs, p99 µs, generations, recalls, recall p50 ms, recall max ms, moved per change %
//! (`-` where a mode has none).

use std::io::Write;
use std::time::Duration;

use super::Mode;
use crate::LabResult;

/// Slicer's consistency benchmark (OSDI 2016): the share of requests satisfied with the
/// bridge and without it.
const SLICER_WITH_BRIDGE: f64 = 99.85;
const SLICER_WITHOUT_BRIDGE: f64 = 99.19;

/// One mode's figures.
#[derive(Debug)]
pub(super) struct Row {
    pub(super) mode: Mode,
    pub(super) requests: u64,
    pub(super) satisfied: u64,
    pub(super) refused: u64,
    pub(super) rerouted: u64,
    pub(super) unowned: u64,
    pub(super) overlaps: u64,
    pub(super) timed_out: u64,
    pub(super) failed: u64,
    pub(super) p50_us: u32,
    pub(super) p99_us: u32,
    pub(super) generations: u64,
    /// Exclusive modes only.
    pub(super) recalls: Option<u64>,
    pub(super) recall_p50: Option<Duration>,
    pub(super) recall_max: Option<Duration>,
    /// The mean share of the key space that changed owner per new generation.
    pub(super) churn: Option<f64>,
}

impl Row {
    fn satisfied_share(&self) -> f64 {
        100.0 * self.satisfied as f64 / self.requests.max(1) as f64
    }
}

pub(super) fn header(out: &mut impl Write) -> LabResult {
    writeln!(
        out,
        "{:<20} {:>8} {:>10} {:>7} {:>8} {:>7} {:>8} {:>7} {:>6} {:>7} {:>7} {:>5} {:>7} {:>10} {:>10} {:>8}",
        "mode",
        "requests",
        "satisfied",
        "refused",
        "rerouted",
        "unowned",
        "overlaps",
        "timeout",
        "failed",
        "p50 µs",
        "p99 µs",
        "gens",
        "recalls",
        "recall p50",
        "recall max",
        "moved",
    )?;
    Ok(())
}

pub(super) fn row(out: &mut impl Write, r: &Row) -> LabResult {
    let ms = |d: Option<Duration>| d.map_or("-".to_owned(), |d| format!("{:.1}ms", d.as_secs_f64() * 1e3));
    writeln!(
        out,
        "{:<20} {:>8} {:>9.3}% {:>7} {:>8} {:>7} {:>8} {:>7} {:>6} {:>7} {:>7} {:>5} {:>7} {:>10} {:>10} {:>8}",
        r.mode.name(),
        r.requests,
        r.satisfied_share(),
        r.refused,
        r.rerouted,
        r.unowned,
        r.overlaps,
        r.timed_out,
        r.failed,
        r.p50_us,
        r.p99_us,
        r.generations,
        r.recalls.map_or("-".to_owned(), |n| n.to_string()),
        ms(r.recall_p50),
        ms(r.recall_max),
        r.churn.map_or("-".to_owned(), |c| format!("{:.2}%", c * 100.0)),
    )?;
    Ok(())
}

/// The figure the benchmark is for: satisfied with the bridge and without, eventual
/// beside them, and Slicer's.
pub(super) fn summary(out: &mut impl Write, rows: &[Row]) -> LabResult {
    let share = |mode| {
        rows.iter()
            .find(|r| r.mode == mode)
            .map_or("not run".to_owned(), |r| format!("{:.3}%", r.satisfied_share()))
    };
    writeln!(
        out,
        "# satisfied: exclusive with the bridge {}, without {}; eventual {} (Slicer, OSDI 2016: {SLICER_WITH_BRIDGE}% with the bridge, {SLICER_WITHOUT_BRIDGE}% without)",
        share(Mode::Exclusive),
        share(Mode::ExclusiveNoBridge),
        share(Mode::Eventual),
    )?;
    Ok(())
}
