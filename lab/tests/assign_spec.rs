//! `steady-lab assign --spec`: a job spec gives the replicas, the constraints, the goals and
//! the task profiles, and stdout reports every constraint the assignment misses; without
//! `--spec` stdout stays exactly the assignment (the contract from before specs).

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;
use steady_slice::Assignment;

fn lab(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_steady-lab")).args(args).output().expect("steady-lab runs")
}

fn stdout(o: &Output) -> String {
    assert!(o.status.success(), "steady-lab failed: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout.clone()).unwrap()
}

/// A file in the temporary directory, unique to this test process.
fn temp_file(name: &str, contents: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("steady-assign-spec-{}-{name}", std::process::id()));
    std::fs::write(&path, contents).unwrap();
    path
}

/// 2,000 keys spread over the key space with load 1, and a hot key with 100.
fn load_file(name: &str) -> PathBuf {
    let mut keys: Vec<String> =
        (0..2_000u64).map(|k| format!("[{}, 1.0]", k.wrapping_mul(0x9E37_79B9_7F4A_7C15))).collect();
    keys.push("[12345678901234567, 100.0]".to_string());
    temp_file(name, &format!("{{\"keys\": [{}]}}", keys.join(", ")))
}

/// Six tasks, two per zone (tasks 0-1 in a, 2-3 in b, 4-5 in c).
const SIX_IN_THREE_ZONES: &str = r#"[
    { "range": [0, 1], "zone": "a" },
    { "range": [2, 3], "zone": "b" },
    { "range": [4, 5], "zone": "c" }
]"#;

fn zone_of(task: u32) -> u32 {
    task / 2
}

/// `assign` with a spec over tasks 0..6, and more arguments.
fn assign_with_spec(algorithm: &str, load: &str, spec: &str, more: &[&str]) -> Value {
    let mut args = vec!["assign", "--algorithm", algorithm, "--tasks", "6", "--load", load, "--spec", spec];
    args.extend(more);
    let text = stdout(&lab(&args));
    assert_eq!(text.lines().count(), 1, "{text}");
    serde_json::from_str(&text).expect("one line of JSON")
}

#[test]
fn a_spread_over_zones_spec_over_six_tasks_in_three_zones_has_no_violation() {
    let load = load_file("spread-load.json");
    let spec = temp_file(
        "spread.json",
        &format!(
            r#"{{"replicas": {{"min": 2, "max": 2}}, "constraints": {{"spread": "zones"}}, "tasks": {SIX_IN_THREE_ZONES}}}"#
        ),
    );
    let (load, spec) = (load.to_str().unwrap(), spec.to_str().unwrap());
    for algorithm in ["weighted-move", "lpt"] {
        let first = assign_with_spec(algorithm, load, spec, &[]);
        let keys: Vec<&str> = first.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys.len(), 4, "{algorithm}: {first}");
        assert_eq!(first["violations"], serde_json::json!([]), "{algorithm}: {first}");
        assert_eq!(first["infeasible"], Value::Null, "{algorithm}");
        assert!(first["imbalance"].as_f64().is_some_and(|i| i >= 1.0), "{algorithm}: {first}");
        // Checked here too, not only by the run's own report: two replicas in two zones.
        let a: Assignment = serde_json::from_value(first["assignment"].clone()).unwrap();
        assert_eq!(a.generation(), 1);
        for s in a.slices() {
            assert_eq!(s.replicas().len(), 2, "{algorithm}: {s:?}");
            assert_ne!(zone_of(s.replicas()[0]), zone_of(s.replicas()[1]), "{algorithm}: {s:?}");
        }
        // The next run from it, the assignment field read back as --previous, stays so.
        let previous = temp_file(&format!("{algorithm}-previous.json"), &first["assignment"].to_string());
        let next = assign_with_spec(algorithm, load, spec, &["--previous", previous.to_str().unwrap()]);
        assert_eq!(next["violations"], serde_json::json!([]), "{algorithm}: {next}");
        let b: Assignment = serde_json::from_value(next["assignment"].clone()).unwrap();
        assert!(b.generation() >= a.generation());
        let _ = std::fs::remove_file(previous);
    }
    let _ = std::fs::remove_file(load);
    let _ = std::fs::remove_file(spec);
}

#[test]
fn a_spec_naming_a_zone_with_no_task_is_infeasible_and_names_the_zone() {
    let load = load_file("infeasible-load.json");
    let spec = temp_file(
        "infeasible.json",
        &format!(
            r#"{{"replicas": {{"min": 1, "max": 4}},
                 "constraints": {{"replica_per_zone": true, "zones": ["a", "b", "c", "d"]}},
                 "tasks": {SIX_IN_THREE_ZONES}}}"#
        ),
    );
    let out = assign_with_spec("weighted-move", load.to_str().unwrap(), spec.to_str().unwrap(), &[]);
    let infeasible = out["infeasible"].as_str().expect("infeasible is named");
    assert!(infeasible.contains("replica-per-zone") && infeasible.contains("zone d"), "{infeasible}");
    // The best assignment it can: a replica in each of a, b and c; every slice misses d.
    let a: Assignment = serde_json::from_value(out["assignment"].clone()).unwrap();
    assert!(!a.slices().is_empty());
    for s in a.slices() {
        let mut zones: Vec<u32> = s.replicas().iter().map(|&t| zone_of(t)).collect();
        zones.sort_unstable();
        zones.dedup();
        assert_eq!(zones, [0, 1, 2], "{s:?}");
    }
    let violations = out["violations"].as_array().unwrap();
    let per_zone =
        violations.iter().find(|v| v["constraint"] == "replica-per-zone").unwrap_or_else(|| panic!("{out}"));
    assert_eq!(per_zone["slices"].as_u64(), Some(a.slices().len() as u64), "{out}");
    assert!((per_zone["key_share"].as_f64().unwrap() - 1.0).abs() < 1e-9, "{out}");
    assert_eq!(per_zone["first"].as_u64(), Some(a.slices()[0].start.get()), "{out}");
    let _ = std::fs::remove_file(load);
    let _ = std::fs::remove_file(spec);
}

#[test]
fn capacities_and_goals_come_from_the_spec() {
    let load = load_file("goals-load.json");
    let load = load.to_str().unwrap();
    // Tasks 0-2 have capacity 3: after a few runs they carry about three times the load
    // of tasks 3-5.
    let spec = temp_file("capacity.json", r#"{"tasks": [{"range": [0, 2], "capacity": 3}]}"#);
    let mut out = assign_with_spec("weighted-move", load, spec.to_str().unwrap(), &[]);
    let previous = temp_file("capacity-previous.json", "");
    for _ in 0..20 {
        std::fs::write(&previous, out["assignment"].to_string()).unwrap();
        out = assign_with_spec(
            "weighted-move",
            load,
            spec.to_str().unwrap(),
            &["--previous", previous.to_str().unwrap()],
        );
    }
    let imbalance = out["imbalance"].as_f64().unwrap();
    assert!(imbalance <= 1.10, "{imbalance}");
    let a: Assignment = serde_json::from_value(out["assignment"].clone()).unwrap();
    let loads = task_loads(&a, load);
    let (big, small) = (loads[..3].iter().sum::<f64>(), loads[3..].iter().sum::<f64>());
    assert!(big > 2.5 * small, "{loads:?}");

    // The goals configure weighted-move: with an imbalance threshold of 100 the run moves
    // nothing; with the default it does.
    let lax = temp_file("lax.json", r#"{"goals": {"max_imbalance": 100}}"#);
    let strict = temp_file("strict.json", r#"{}"#);
    std::fs::write(&previous, out["assignment"].to_string()).unwrap();
    for (spec, suppressed) in [(&lax, true), (&strict, false)] {
        let o = lab(&[
            "assign",
            "--algorithm",
            "weighted-move",
            "--tasks",
            "6",
            "--load",
            load,
            "--spec",
            spec.to_str().unwrap(),
            "--previous",
            previous.to_str().unwrap(),
        ]);
        stdout(&o);
        let report = String::from_utf8_lossy(&o.stderr);
        assert!(report.contains(&format!("suppressed={suppressed}")), "{report}");
    }
    for f in [spec, lax, strict, previous] {
        let _ = std::fs::remove_file(f);
    }
}

/// Each task's load under `a` for the load file at `path` (a replica carries its slice's
/// load over its replicas).
fn task_loads(a: &Assignment, path: &str) -> Vec<f64> {
    let file: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut loads = vec![0.0; 6];
    for point in file["keys"].as_array().unwrap() {
        let (key, load) = (point[0].as_u64().unwrap(), point[1].as_f64().unwrap());
        let slice = a.slices().iter().rev().find(|s| s.start.get() <= key).unwrap();
        for &t in slice.replicas() {
            loads[t as usize] += load / slice.replicas().len() as f64;
        }
    }
    loads
}

#[test]
fn a_bad_spec_is_one_line_naming_the_field() {
    let load = temp_file("bad-load.json", r#"{"keys": [[1, 2.0]]}"#);
    let cases = [
        (r#"{"tasks": [{"index": 0, "capacity": 0}]}"#, "tasks[0].capacity"),
        (r#"{"tasks": [{"index": 0}, {"range": [3, 1]}]}"#, "tasks[1].range"),
        (r#"{"constraints": {"spread": "regions"}}"#, "constraints.spread"),
        (r#"{"constraints": {"sprad": "zones"}}"#, "sprad"),
        (r#"{"replicas": {"min": 3, "max": 2}}"#, "replicas"),
        (r#"{"goals": {"max_imbalance": 0.5}}"#, "goals.max_imbalance"),
        (r#"{"tasks": [{"index": 0, "zone": "a b"}]}"#, "tasks[0].zone"),
        (r#"{"replicas": "#, "spec"),
    ];
    for (i, (text, field)) in cases.into_iter().enumerate() {
        let spec = temp_file(&format!("bad-{i}.json"), text);
        let o = lab(&[
            "assign",
            "--algorithm",
            "weighted-move",
            "--tasks",
            "3",
            "--load",
            load.to_str().unwrap(),
            "--spec",
            spec.to_str().unwrap(),
        ]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{text} was accepted");
        assert!(o.stdout.is_empty(), "{text}");
        assert_eq!(err.lines().count(), 1, "{text}: {err}");
        assert!(err.starts_with("steady-lab: ") && !err.contains("panicked"), "{text}: {err}");
        assert!(err.contains(field), "{text} should name {field}: {err}");
        let _ = std::fs::remove_file(spec);
    }
    // The spec gives the replicas: --max-replicas beside it is refused, in one line.
    let spec = temp_file("good.json", "{}");
    let o = lab(&[
        "assign",
        "--algorithm",
        "lpt",
        "--tasks",
        "3",
        "--load",
        load.to_str().unwrap(),
        "--spec",
        spec.to_str().unwrap(),
        "--max-replicas",
        "2",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && o.stdout.is_empty());
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("--max-replicas") && err.contains("--spec"), "{err}");
    let _ = std::fs::remove_file(spec);
    let _ = std::fs::remove_file(load);
}

/// Without `--spec`, stdout is the assignment alone, byte for byte as before specs: a
/// golden line for an assigner whose output depends on nothing but T, and the shape for
/// weighted-move.
#[test]
fn without_a_spec_stdout_is_the_assignment_alone_as_before() {
    let load = temp_file("old-load.json", r#"{"keys": [[1, 2.0], [9223372036854775808, 1.0]]}"#);
    let load = load.to_str().unwrap();
    let o = lab(&["assign", "--algorithm", "static", "--tasks", "3", "--load", load]);
    assert_eq!(
        stdout(&o),
        concat!(
            r#"{"generation":1,"slices":[{"start":0,"replicas":[0]},"#,
            r#"{"start":6148914691236517205,"replicas":[1]},"#,
            r#"{"start":12297829382473034410,"replicas":[2]}]}"#,
            "\n"
        )
    );
    let o = lab(&[
        "assign",
        "--algorithm",
        "weighted-move",
        "--tasks",
        "3",
        "--load",
        load,
        "--max-replicas",
        "2",
    ]);
    let text = stdout(&o);
    assert_eq!(text.lines().count(), 1);
    let value: Value = serde_json::from_str(&text).unwrap();
    let keys: Vec<&str> = value.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(keys, ["generation", "slices"], "{text}");
    let a: Assignment = serde_json::from_str(&text).unwrap();
    assert_eq!(format!("{}\n", serde_json::to_string(&a).unwrap()), text);
    let _ = std::fs::remove_file(load);
}
