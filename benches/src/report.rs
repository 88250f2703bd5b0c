//! Reads criterion's saved estimates and prints each benchmark as a ratio to its baseline.
//!
//! Criterion writes `target/criterion/<group>/<function>/<parameter>/new/estimates.json`.
//! A benchmark group here names its baseline function; every other function of the
//! group at the same parameter is reported as `baseline time / its time` (how many
//! times faster than the baseline).

use std::fs;
use std::path::{Path, PathBuf};

/// One measured benchmark: its group, function, parameter and mean time in nanoseconds.
#[derive(Debug, Clone, PartialEq)]
pub struct Estimate {
    /// Criterion group, e.g. `subset_k20`.
    pub group: String,
    /// Function within the group, e.g. `rocksteadier`.
    pub function: String,
    /// Parameter, e.g. `100000`.
    pub parameter: String,
    /// Mean time per iteration, nanoseconds.
    pub mean_ns: f64,
}

/// Pulls `"mean":{..."point_estimate":X` out of an estimates.json without a JSON crate.
pub fn parse_mean(json: &str) -> Option<f64> {
    let after_mean = &json[json.find("\"mean\"")?..];
    let after_key = &after_mean[after_mean.find("\"point_estimate\"")? + "\"point_estimate\"".len()..];
    let value = after_key.trim_start().strip_prefix(':')?.trim_start();
    let end = value.find(|c: char| !(c.is_ascii_digit() || "+-.eE".contains(c))).unwrap_or(value.len());
    value[..end].parse().ok()
}

fn subdirs(dir: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir() && p.file_name().is_some_and(|n| n != "report"))
        .collect();
    dirs.sort();
    dirs
}

fn name(p: &Path) -> String {
    p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

/// Every estimate under `criterion_dir` whose group starts with `group_prefix`.
pub fn load(criterion_dir: &Path, group_prefix: &str) -> Vec<Estimate> {
    let mut out = Vec::new();
    for group in subdirs(criterion_dir).into_iter().filter(|g| name(g).starts_with(group_prefix)) {
        for function in subdirs(&group) {
            for parameter in subdirs(&function) {
                let file = parameter.join("new").join("estimates.json");
                if let Some(mean_ns) = fs::read_to_string(&file).ok().as_deref().and_then(parse_mean) {
                    out.push(Estimate {
                        group: name(&group),
                        function: name(&function),
                        parameter: name(&parameter),
                        mean_ns,
                    });
                }
            }
        }
    }
    out
}

/// Formats a table: per group and parameter, each function's mean and its speed-up over `baseline`.
pub fn ratio_table(estimates: &[Estimate], baseline: &str) -> String {
    let mut out =
        format!("{:<20} {:>10} {:<24} {:>14} {:>12}\n", "group", "param", "function", "mean", "vs baseline");
    let mut keys: Vec<(&str, &str)> =
        estimates.iter().map(|e| (e.group.as_str(), e.parameter.as_str())).collect();
    keys.sort_by(|a, b| a.0.cmp(b.0).then(a.1.parse::<u64>().ok().cmp(&b.1.parse::<u64>().ok())));
    keys.dedup();
    for (group, parameter) in keys {
        let here: Vec<&Estimate> =
            estimates.iter().filter(|e| e.group == group && e.parameter == parameter).collect();
        let base = here.iter().find(|e| e.function == baseline).map(|e| e.mean_ns);
        for e in here {
            let ratio = base.map_or("-".to_owned(), |b| format_ratio(b / e.mean_ns));
            out.push_str(&format!(
                "{:<20} {:>10} {:<24} {:>14} {:>12}\n",
                group,
                parameter,
                e.function,
                format_ns(e.mean_ns),
                ratio
            ));
        }
    }
    out
}

fn format_ratio(r: f64) -> String {
    if r >= 100.0 {
        format!("{r:.0}x")
    } else {
        format!("{r:.1}x")
    }
}

fn format_ns(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.2} µs", ns / 1e3)
    } else {
        format!("{ns:.1} ns")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_criterions_mean() {
        let json = r#"{"mean":{"confidence_interval":{"confidence_level":0.95,"lower_bound":1.0,"upper_bound":2.0},"point_estimate":123.5e1,"standard_error":0.1},"median":{"point_estimate":9.0}}"#;
        assert_eq!(parse_mean(json), Some(1235.0));
        assert_eq!(parse_mean("{}"), None);
    }

    #[test]
    fn ratios_are_baseline_over_candidate() {
        let e = |f: &str, ns| Estimate {
            group: "g".into(),
            function: f.into(),
            parameter: "10".into(),
            mean_ns: ns,
        };
        let table = ratio_table(&[e("naive", 1000.0), e("fast", 10.0)], "naive");
        assert!(table.contains(" 100x"), "{table}");
        assert!(table.contains("1.0x"), "{table}");
    }
}
