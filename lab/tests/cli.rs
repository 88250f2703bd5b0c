//! The `steady-lab` command line, run as a user runs it.

use std::process::{Command, Output};

use steady_subset::{Algorithm, Subsetting};

fn lab(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_steady-lab")).args(args).output().expect("steady-lab runs")
}

fn stdout(o: &Output) -> String {
    assert!(o.status.success(), "steady-lab failed: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout.clone()).unwrap()
}

#[test]
fn subsets_prints_one_contract_line_per_frontend() {
    for name in Algorithm::NAMES {
        let out = stdout(&lab(&[
            "subsets",
            "--algorithm",
            name,
            "--frontends",
            "12",
            "--backends",
            "55",
            "--subset-size",
            "10",
        ]));
        let algorithm: Algorithm = name.parse().unwrap();
        let expected: String = (0..12)
            .map(|m| {
                let members: String =
                    algorithm.subset(m, 55, 10).unwrap().iter().map(|b| format!(" {b}")).collect();
                format!("{m}:{members}\n")
            })
            .collect();
        assert_eq!(out, expected, "{name}");
    }
}

#[test]
fn unknown_algorithm_is_a_clear_error() {
    let o = lab(&[
        "subsets",
        "--algorithm",
        "ringsteadier",
        "--frontends",
        "1",
        "--backends",
        "5",
        "--subset-size",
        "2",
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("ringsteadier") && err.contains("rocksteadier"), "{err}");
}

#[test]
fn too_many_backends_is_a_clear_error() {
    let o = lab(&["subsets", "--frontends", "1", "--backends", "99999999", "--subset-size", "2"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("exceeds the limit"));
}

#[test]
fn quality_prints_a_row_per_algorithm() {
    let out = stdout(&lab(&["quality", "--frontends", "40", "--backends", "30", "--subset-size", "5"]));
    for name in Algorithm::NAMES {
        assert!(out.lines().any(|l| l.split_whitespace().next() == Some(name)), "{name} missing:\n{out}");
    }
    // Round-robin is perfectly balanced: utilisation 1.000, busiest 7 of ideal 7.
    let rr = out.lines().find(|l| l.starts_with("round-robin ")).unwrap();
    let fields: Vec<&str> = rr.split_whitespace().collect();
    assert_eq!(&fields[1..3], ["1.000", "7/7"], "{rr}");
}

#[test]
fn grid_summarises_every_algorithm() {
    let out = stdout(&lab(&["grid", "--step", "64", "--algorithm", "rocksteadier", "--threads", "2"]));
    let row = out.lines().find(|l| l.starts_with("rocksteadier ")).expect(&out);
    let fields: Vec<&str> = row.split_whitespace().collect();
    let mean: f64 = fields[1].parse().unwrap();
    assert!((0.8..=1.0).contains(&mean), "{row}");
    // Rocksteadier's worst backend churn, growing and shrinking, is one connection.
    assert_eq!(&fields[4..6], ["1", "1"], "{row}");
}

#[test]
fn resize_reports_each_step_for_both_algorithms_and_writes_the_svg() {
    let svg = std::env::temp_dir().join(format!("steady-resize-{}.svg", std::process::id()));
    let out = stdout(&lab(&[
        "resize",
        "--frontends",
        "3",
        "--subset-size",
        "2",
        "--steps",
        "4,5,3",
        "--step-ms",
        "300",
        "--svg",
        svg.to_str().unwrap(),
    ]));
    let rows: Vec<Vec<&str>> =
        out.lines().skip(1).filter(|l| !l.starts_with('#')).map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(rows.len(), 6, "{out}");
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(row[0], ["rocksteadier", "deterministic"][i % 2]);
        assert_eq!(row[1], ["4", "5", "3"][i / 2]);
        // A planned resize loses no request.
        assert_eq!(row[4], "0", "{out}");
    }
    let svg_text = std::fs::read_to_string(&svg).unwrap();
    assert!(svg_text.contains("<svg") && svg_text.contains("rocksteadier"));
    let _ = std::fs::remove_file(svg);
}
