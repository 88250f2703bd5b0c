//! `steady-lab cache --quick`, the cache experiment shortened, run as a user runs it: every
//! keyed strategy hits its caches more often than unkeyed p2c, in the reshuffled phase and
//! through the rolling restart, and no request fails in any of them. (The margins are wide:
//! p2c spreads each key over every backend, so it caches each hot key four times over.)
//! With handover, the moves of the rolling restart warm their new owners from the old ones.
//! With one ranking (nothing newly hot), the Slicer strategies' load bound spills next
//! to nothing and keeps their hit rate.

mod support;

use std::process::Command;

use serde_json::Value;
use support::{run_quick, run_quick_with};

/// Held by the tests that run fleets, so that they run one at a time: two fleets at once
/// on a small machine measure each other.
static FLEETS: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn keyed_routing_hits_more_than_p2c_and_no_request_fails_even_through_restarts() {
    let _one_at_a_time = FLEETS.lock().unwrap_or_else(|e| e.into_inner());
    let (text, outcomes, dir) = run_quick("cache");
    for phase in ["reshuffled", "restart"] {
        let rows: Vec<&Value> = outcomes.iter().filter(|o| o["phase"] == phase).collect();
        assert_eq!(rows.len(), 7, "every strategy ran the {phase} phase:\n{text}");
        let hit = |o: &Value| o["hit_rate"].as_f64().unwrap();
        let p2c = rows.iter().find(|o| o["strategy"] == "p2c (unkeyed)").map(|o| hit(o)).unwrap();
        for o in &rows {
            assert_eq!(o["failed"], 0, "{phase}: {} failed requests\n{text}", o["strategy"]);
            assert!(o["answered"].as_u64().unwrap() > 500, "{phase}: {} hardly ran\n{text}", o["strategy"]);
            if o["strategy"] != "p2c (unkeyed)" {
                assert!(hit(o) > p2c, "{phase}: {} hit {} <= p2c's {p2c}\n{text}", o["strategy"], hit(o));
            }
        }
        let handover = rows.iter().find(|o| o["strategy"] == "Slicer, 1 replica, handover").unwrap();
        let warmed = handover["warmed"].as_u64().unwrap();
        if phase == "restart" {
            // Each drain moved slices in two steps, and their new owners loaded the old
            // owners' entries: the warming step went from the Assigner through the
            // Distributor to the Slicelets and the application.
            assert!(warmed > 0, "restart: nothing was warmed\n{text}");
        }
        for o in rows.iter().filter(|o| o["strategy"] != "Slicer, 1 replica, handover") {
            assert_eq!(o["warmed"], 0, "{phase}: {} warmed without a handover", o["strategy"]);
        }
    }
    for figure in [
        "cache-hit-rate-vs-p99.svg",
        "cache-backend-p95.svg",
        "cache-hit-rate-over-time.svg",
        "cache-restart.svg",
    ] {
        let svg = std::fs::read_to_string(dir.join(figure)).unwrap_or_default();
        assert!(svg.contains("<svg") && svg.contains("Rudolph"), "{figure} was not drawn");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_load_bound_spills_next_to_nothing_and_keeps_the_hit_rate_when_nothing_is_hot() {
    let _one_at_a_time = FLEETS.lock().unwrap_or_else(|e| e.into_inner());
    let args = |bound: &'static str| {
        ["--phases", "steady", "--strategies", "p2c,slicer,slicer-replicated", "--keyed-bound", bound]
    };
    let (text_on, on, dir_on) = run_quick_with("cache", &args("1.5:2"), "bound-on");
    let (text_off, off, dir_off) = run_quick_with("cache", &args("off"), "bound-off");
    let text = format!("{text_on}\n{text_off}");
    let row =
        |rows: &[Value], strategy: &str| rows.iter().find(|o| o["strategy"] == strategy).cloned().unwrap();
    let hit = |o: &Value| o["hit_rate"].as_f64().unwrap();
    for strategy in ["Slicer, 1 replica", "Slicer, <=3 replicas"] {
        let (bounded, unbounded) = (row(&on, strategy), row(&off, strategy));
        let answered = bounded["answered"].as_u64().unwrap();
        let spilled = bounded["spilled"].as_u64().unwrap();
        assert!(answered > 500, "{strategy} hardly ran\n{text}");
        // The Assigner has spread the load: a replica is over 1.5 x the mean + 2 in
        // flight only in a rare burst.
        assert!(spilled * 100 <= answered, "{strategy}: {spilled} of {answered} spilled\n{text}");
        assert_eq!(unbounded["spilled"], 0, "{strategy} spilled without a bound\n{text}");
        assert_eq!(bounded["failed"], 0, "{strategy}\n{text}");
        // The same hit rate within noise, and far above p2c's.
        assert!(hit(&bounded) >= hit(&unbounded) - 0.03, "{strategy}: hit rate fell\n{text}");
        assert!(hit(&bounded) > hit(&row(&on, "p2c (unkeyed)")) + 0.1, "{strategy}\n{text}");
    }
    assert!(text_on.contains("keyed load bound: 1.5 x mean in flight + 2"), "{text_on}");
    assert!(text_off.contains("keyed load bound: off"), "{text_off}");
    let _ = std::fs::remove_dir_all(dir_on);
    let _ = std::fs::remove_dir_all(dir_off);
}

#[test]
fn settings_it_cannot_run_with_are_refused_in_one_line() {
    for args in [
        &["--backends", "1"][..],
        &["--keys", "0"],
        &["--zipf", "-1"],
        &["--zipf", "NaN"],
        &["--rate", "0"],
        &["--rate", "inf"],
        &["--workers", "0"],
        &["--frontends", "0"],
        &["--keyed-bound", "0.5:2"],
        &["--keyed-bound", "1.5"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_steady-lab")).arg("cache").args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?} printed a table");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("steady-lab: --"), "{args:?}: {err}");
    }
}
