//! The report and figures on a tiny configuration: structure, and values recomputed
//! here independently of the lab's code.

use std::path::PathBuf;

use steady_lab::experiments::{self, LabConfig};
use steady_lab::sweep::Sweep;
use steady_lab::{figures, report};
use steady_subset::{Algorithm, Subsetting};

fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("steady-lab-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The cells of `algorithm`'s row in the table under the heading starting with `heading`.
fn row<'a>(report: &'a str, heading: &str, algorithm: &str) -> Vec<&'a str> {
    let section =
        report.split("\n## ").find(|s| s.starts_with(heading)).unwrap_or_else(|| panic!("no {heading}"));
    let line = section
        .lines()
        .find(|l| l.starts_with(&format!("| `{algorithm}` |")))
        .unwrap_or_else(|| panic!("no row for {algorithm} under {heading}"));
    line.trim_matches('|').split('|').map(str::trim).skip(1).collect()
}

/// Normalised utilisation, computed from scratch: ceil(M k / N) / busiest backend.
fn utilisation(algorithm: &Algorithm, m: usize, n: usize, k: usize) -> f64 {
    let mut counts = vec![0usize; n];
    for frontend in 0..m {
        for b in algorithm.subset(frontend, n, k).unwrap() {
            counts[b] += 1;
        }
    }
    (m * k.min(n)).div_ceil(n) as f64 / *counts.iter().max().unwrap() as f64
}

#[test]
fn tiny_report_has_every_family_and_figure_and_the_right_numbers() {
    let config = LabConfig::tiny();
    let algorithms = Algorithm::all();
    let results = experiments::run(&config, &algorithms, &Sweep::new(Some(2)).quiet()).unwrap();
    let dir = scratch_dir("report");
    let drawn = figures::draw_all(&results, &dir.join("figures")).unwrap();
    let text = report::render(&results, &drawn, "figures");

    // Five figures, each an SVG on disk, each linked from the report.
    assert_eq!(drawn.len(), 5);
    for f in &drawn {
        let svg = std::fs::read_to_string(dir.join("figures").join(&f.file)).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("</svg>"), "{}", f.file);
        assert!(text.contains(&format!("](figures/{})", f.file)), "{} not linked", f.file);
    }
    // Every family, with a row per algorithm.
    for heading in [
        "The article's grid",
        "Production-like",
        "Rolling restart",
        "Resizing the backend job",
        "Subset-size and frontend churn",
        "Diversity",
    ] {
        for a in &algorithms {
            row(&text, heading, &a.to_string());
        }
    }

    // Production-like utilisation of Rocksteadier: mean, p10 (the lower of two) and worst.
    // Named, not `Algorithm::default()`: the default is now the decimal variant.
    let rocksteadier = Algorithm::from_name("rocksteadier").unwrap();
    let u: Vec<f64> = config
        .production
        .iter()
        .map(|s| utilisation(&rocksteadier, s.frontends, s.backends, s.size))
        .collect();
    let (lo, mean) = (u[0].min(u[1]), (u[0] + u[1]) / 2.0);
    let fmt = |x: f64| if x.fract() == 0.0 { format!("{x:.0}") } else { format!("{x:.3}") };
    assert_eq!(
        row(&text, "Production-like", "rocksteadier")[0],
        format!("{} · {} · {}", fmt(mean), fmt(lo), fmt(lo))
    );

    // Round-robin is perfectly balanced and its subsets are consecutive: a window of
    // k = 5 consecutive restarts takes a whole subset down.
    assert_eq!(row(&text, "Production-like", "round-robin")[0], "1 · 1 · 1");
    assert_eq!(row(&text, "Rolling restart", "round-robin")[0], "1 · 1 · 1");

    // Rocksteadier never opens more than one connection per frontend when N changes by one,
    // and frontend churn is zero for everyone.
    let grid = row(&text, "The article's grid", "rocksteadier");
    assert!(grid[2].ends_with("· 1 · 1") && grid[3].ends_with("· 1 · 1"), "{grid:?}");
    for a in &algorithms {
        assert_eq!(row(&text, "Subset-size and frontend churn", &a.to_string())[1], "0 · 0 · 0");
    }

    // The resize sweep's total, recomputed: connections opened over N = 10..=14 -> N + 1.
    let (m, k, ref ns) = config.resize;
    let mut total = 0;
    for n in ns.clone() {
        for f in 0..m {
            let before = rocksteadier.subset(f, n, k).unwrap();
            total += rocksteadier.subset(f, n + 1, k).unwrap().iter().filter(|b| !before.contains(b)).count();
        }
    }
    assert_eq!(row(&text, "Resizing the backend job", "rocksteadier")[2], total.to_string());
    let _ = std::fs::remove_dir_all(&dir);
}
