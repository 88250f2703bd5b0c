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

/// Without `--algorithm`, `subsets` prints the library's default, decimal Rocksteadier;
/// `--algorithm rocksteadier` still prints Rocksteadier's subsets, and they differ.
#[test]
fn subsets_defaults_to_the_librarys_default_and_rocksteadier_can_be_named() {
    let scenario = ["--frontends", "12", "--backends", "55", "--subset-size", "10"];
    let run = |algorithm: &[&str]| stdout(&lab(&[&["subsets"], algorithm, &scenario[..]].concat()));
    let lines = |algorithm: &Algorithm| -> String {
        (0..12)
            .map(|m| {
                let members: String =
                    algorithm.subset(m, 55, 10).unwrap().iter().map(|b| format!(" {b}")).collect();
                format!("{m}:{members}\n")
            })
            .collect()
    };
    let default = run(&[]);
    assert_eq!(Algorithm::default().to_string(), "rocksteadier-decimal");
    assert_eq!(default, lines(&Algorithm::default()));
    assert_eq!(default, run(&["--algorithm", "rocksteadier-decimal"]));
    let pinned = run(&["--algorithm", "rocksteadier"]);
    assert_eq!(pinned, lines(&"rocksteadier".parse().unwrap()));
    assert_ne!(pinned, default);
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
        // The first fleet runs the library's default, and says so.
        assert_eq!(row[0], ["rocksteadier-decimal", "deterministic"][i % 2]);
        assert_eq!(row[1], ["4", "5", "3"][i / 2]);
        // A planned resize loses no request.
        assert_eq!(row[4], "0", "{out}");
    }
    let svg_text = std::fs::read_to_string(&svg).unwrap();
    assert!(svg_text.contains("<svg") && svg_text.contains("rocksteadier"));
    let _ = std::fs::remove_file(svg);
}

/// A file in the temporary directory, unique to this test process.
fn temp_file(name: &str, contents: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("steady-assign-{}-{name}", std::process::id()));
    std::fs::write(&path, contents).unwrap();
    path
}

#[test]
fn assign_prints_a_valid_assignment_and_a_newer_generation_from_a_previous_one() {
    // A hot key with half of the load, and 200 keys with the rest.
    let mut keys: Vec<String> =
        (0..200u64).map(|k| format!("[{}, 1.0]", k.wrapping_mul(0x9E37_79B9_7F4A_7C15))).collect();
    keys.push("[18446744073709551615, 200.0]".to_string());
    let load = temp_file("load.json", &format!("{{\"keys\": [{}]}}", keys.join(", ")));
    let load = load.to_str().unwrap();
    for name in ["weighted-move", "rotation", "lpt", "static", "consistent", "consistent-load-aware"] {
        let first =
            lab(&["assign", "--algorithm", name, "--tasks", "6", "--load", load, "--max-replicas", "3"]);
        let text = stdout(&first);
        assert_eq!(text.lines().count(), 1, "{name}: {text}");
        assert!(String::from_utf8_lossy(&first.stderr).contains("generation=1"), "{name}");
        let a: steady_slice::Assignment = serde_json::from_str(&text).expect("a valid assignment");
        assert_eq!(a.generation(), 1);
        assert!(a.slices().iter().all(|s| s.replicas().iter().all(|&t| t < 6) && s.replicas().len() <= 3));
        // One task fewer: the next run must move slices off task 5, so a newer generation.
        let previous = temp_file(&format!("{name}-previous.json"), &text);
        let second = lab(&[
            "assign",
            "--algorithm",
            name,
            "--tasks",
            "5",
            "--load",
            load,
            "--previous",
            previous.to_str().unwrap(),
            "--max-replicas",
            "3",
        ]);
        let b: steady_slice::Assignment = serde_json::from_str(&stdout(&second)).unwrap();
        assert!(b.generation() > a.generation(), "{name}");
        assert!(b.slices().iter().all(|s| s.replicas().iter().all(|&t| t < 5)), "{name}");
        let _ = std::fs::remove_file(previous);
    }
}

#[test]
fn assign_refuses_bad_input_with_one_line() {
    let good = temp_file("good.json", r#"{"keys": [[1, 2.0]]}"#);
    let negative = temp_file("negative.json", r#"{"keys": [[1, -2.0]]}"#);
    let malformed = temp_file("malformed.json", r#"{"keys": [[1, 2.0]"#);
    let invalid =
        temp_file("invalid.json", r#"{"generation": 3, "slices": [{"start": 5, "replicas": [0]}]}"#);
    let zero = temp_file("zero.json", r#"{"generation": 0, "slices": [{"start": 0, "replicas": [0]}]}"#);
    let p = |f: &std::path::PathBuf| f.to_str().unwrap().to_string();
    // `assign --algorithm A --tasks T --load L` and any further arguments.
    let case = |algorithm: &str, tasks: &str, load: String, more: &[String]| -> Vec<String> {
        let head = ["--algorithm", algorithm, "--tasks", tasks, "--load"].map(String::from);
        head.into_iter().chain([load]).chain(more.iter().cloned()).collect()
    };
    let cases: Vec<Vec<String>> = vec![
        case("slicer", "3", p(&good), &[]),
        case("lpt", "0", p(&good), &[]),
        case("lpt", "3", p(&negative), &[]),
        case("lpt", "3", p(&malformed), &[]),
        case("lpt", "3", "/nonexistent".into(), &[]),
        case("weighted-move", "3", p(&good), &["--previous".into(), p(&invalid)]),
        case("weighted-move", "3", p(&good), &["--previous".into(), p(&zero)]),
        case("static", "3", p(&good), &["--max-replicas".into(), "0".into()]),
    ];
    for case in cases {
        let mut args = vec!["assign"];
        args.extend(case.iter().map(String::as_str));
        let o = lab(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{case:?} succeeded");
        assert!(o.stdout.is_empty(), "{case:?}");
        assert_eq!(err.lines().count(), 1, "{case:?}: {err}");
        assert!(err.starts_with("steady-lab: ") && !err.contains("panicked"), "{case:?}: {err}");
    }
    for f in [good, negative, malformed, invalid, zero] {
        let _ = std::fs::remove_file(f);
    }
}

/// What clap refuses is one line (before: 3 to 6 lines of usage, where the `assign`
/// contract promises one), naming the argument and pointing at the command's `--help`,
/// with clap's exit code 2; help and the version still print as usual.
#[test]
fn arguments_clap_refuses_are_one_line_naming_the_argument() {
    let load = temp_file("clap.json", r#"{"keys": [[1, 2.0]]}"#);
    let load = load.to_str().unwrap();
    let assign = |more: &[&'static str]| -> Vec<String> {
        ["assign", "--algorithm", "lpt"].iter().chain(more).map(|s| s.to_string()).collect()
    };
    let cases: Vec<(Vec<String>, &str, &str)> = vec![
        (assign(&["--tasks", "3"]), "--load", "steady-lab assign --help"),
        (assign(&["--tasks", "-1", "--load", "x"]), "--tasks", "steady-lab assign --help"),
        (assign(&["--tasks", "abc", "--load", "x"]), "--tasks", "steady-lab assign --help"),
        (assign(&["--tasks", "3", "--load"]), "--load", "steady-lab assign --help"),
        (
            [assign(&["--tasks", "3", "--frob", "--load"]), vec![load.to_string()]].concat(),
            "--frob",
            "steady-lab assign --help",
        ),
        (
            ["subsets", "--frontends", "-3", "--backends", "5", "--subset-size", "2"]
                .map(String::from)
                .to_vec(),
            "--frontends",
            "steady-lab subsets --help",
        ),
        (vec!["frob".to_string()], "frob", "steady-lab --help"),
    ];
    for (args, named, help) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = lab(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(o.stdout.is_empty(), "{args:?}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("steady-lab: "), "{args:?}: {err}");
        assert!(err.contains(named), "{args:?} should name {named}: {err}");
        assert!(err.contains(&format!("'{help}'")), "{args:?}: {err}");
    }
    let help = lab(&["assign", "--help"]);
    assert!(help.status.success() && stdout(&help).contains("--load <LOAD>"));
    let version = lab(&["--version"]);
    assert!(stdout(&version).starts_with("steady-lab "));
    let _ = std::fs::remove_file(load);
}

#[test]
fn a_run_that_names_no_output_writes_into_the_lab_s_folder_and_leaves_its_working_directory_alone() {
    let base = std::env::temp_dir().join(format!("steady-lab-out-{}", std::process::id()));
    let (cwd, folder) = (base.join("cwd"), base.join("out"));
    std::fs::create_dir_all(&cwd).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_steady-lab"))
        .current_dir(&cwd)
        .env("STEADY_LAB_OUT", &folder)
        .args(["resize", "--frontends", "2", "--subset-size", "1", "--steps", "2,3", "--step-ms", "200"])
        .output()
        .expect("steady-lab runs");
    let text = stdout(&out);
    let svg = folder.join("resize.svg");
    assert!(text.contains(&format!("# wrote {}", svg.display())), "{text}");
    assert!(std::fs::read_to_string(&svg).unwrap().contains("<svg"));
    let left: Vec<_> = std::fs::read_dir(&cwd).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.is_empty(), "the run left {left:?} in its working directory");
    std::fs::remove_dir_all(&base).unwrap();
}
