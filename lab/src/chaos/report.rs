//! The soak's tables: the faults with the requests each window lost, the invariants with
//! their bounds and verdicts, and memory per process life.

use std::io::Write;

use super::invariants::Row;
use super::load::Counts;
use super::memory::Growth;
use super::schedule::Injected;

/// Prints the faults' table.
pub(super) fn faults(out: &mut impl Write, faults: &[Injected], windows: &[Counts]) -> std::io::Result<()> {
    writeln!(out, "\n## Faults\n")?;
    writeln!(
        out,
        "| # | at (s) | fault | target | recovered (s) | sent | lost | of them keyed | bound | p99 (ms) | first error |"
    )?;
    writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|")?;
    if let Some(quiet) = windows.first() {
        row(out, "0", "0", "(none: warm-up)", "", "", quiet, 0)?;
    }
    for (i, f) in faults.iter().enumerate() {
        let Some(counts) = windows.get(f.window) else { continue };
        let recovered =
            f.recovered.map_or_else(|| "not in 20".to_owned(), |r| format!("{:.2}", r.as_secs_f64()));
        let at = format!("{:.0}", f.at.as_secs_f64());
        row(out, &(i + 1).to_string(), &at, f.fault.name(), &f.target, &recovered, counts, f.bound)?;
    }
    let total = windows.iter().fold(Counts::default(), |mut t, c| {
        t.sent += c.sent;
        t.ok += c.ok;
        t.failed += c.failed;
        t.timed_out += c.timed_out;
        t.lost_keyed += c.lost_keyed;
        t
    });
    writeln!(
        out,
        "\nrequests: {} sent, {} answered, {} failed, {} timed out ({:.4}% lost)",
        total.sent,
        total.ok,
        total.failed,
        total.timed_out,
        100.0 * total.lost() as f64 / total.sent.max(1) as f64
    )
}

#[allow(clippy::too_many_arguments)]
fn row(
    out: &mut impl Write,
    n: &str,
    at: &str,
    fault: &str,
    target: &str,
    recovered: &str,
    counts: &Counts,
    bound: u64,
) -> std::io::Result<()> {
    let error = counts.errors.first().map_or(String::new(), |e| e.chars().take(90).collect::<String>());
    writeln!(
        out,
        "| {n} | {at} | {fault} | {target} | {recovered} | {} | {} | {} | {bound} | {:.1} | {} |",
        counts.sent,
        counts.lost(),
        counts.lost_keyed,
        counts.latency(0.99).as_secs_f64() * 1000.0,
        error.replace('|', "/"),
    )
}

/// Prints the invariants' table and the verdict line; returns how many were violated.
pub(super) fn invariants(out: &mut impl Write, rows: &[Row]) -> std::io::Result<usize> {
    writeln!(out, "\n## Invariants\n")?;
    writeln!(out, "| invariant | bound | observed | verdict |")?;
    writeln!(out, "|---|---|---|---|")?;
    for r in rows {
        writeln!(
            out,
            "| {} | {} | {} | {} |",
            r.invariant,
            r.bound,
            r.observed,
            if r.holds { "holds" } else { "VIOLATED" }
        )?;
    }
    let violated = rows.iter().filter(|r| !r.holds).count();
    Ok(violated)
}

/// Prints memory per process life.
pub(super) fn memory(out: &mut impl Write, lives: &[Growth]) -> std::io::Result<()> {
    writeln!(out, "\n## Memory (RSS, MiB)\n")?;
    writeln!(out, "| process | pid | sampled (s) | first window | last window | ratio | peak |")?;
    writeln!(out, "|---|---|---|---|---|---|---|")?;
    for g in lives {
        let (first, ratio) = match (g.first_mib, g.ratio()) {
            (Some(first), Some(ratio)) => {
                let note = match (g.judged(), g.violated()) {
                    (false, _) => " (not judged)",
                    (true, true) => " GREW",
                    (true, false) => "",
                };
                (format!("{first:.1}"), format!("{ratio:.2}{note}"))
            }
            _ => ("-".to_owned(), "(short life)".to_owned()),
        };
        writeln!(
            out,
            "| {} | {} | {:.0} | {first} | {:.1} | {ratio} | {:.1} |",
            g.name,
            g.pid,
            g.lived.as_secs_f64(),
            g.last_mib,
            g.peak_mib
        )?;
    }
    Ok(())
}
