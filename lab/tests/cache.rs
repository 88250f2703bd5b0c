//! `steady-lab cache --quick`, the cache experiment shortened, run as a user runs it: every
//! keyed strategy hits its caches more often than unkeyed p2c, in the reshuffled phase and
//! through the rolling restart, and no request fails in any of them. (The margins are wide:
//! p2c spreads each key over every backend, so it caches each hot key four times over.)
//! With handover, the moves of the rolling restart warm their new owners from the old ones.

mod support;

use std::process::Command;

use serde_json::Value;
use support::run_quick;

#[test]
fn keyed_routing_hits_more_than_p2c_and_no_request_fails_even_through_restarts() {
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
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_steady-lab")).arg("cache").args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?} printed a table");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("steady-lab: --"), "{args:?}: {err}");
    }
}
