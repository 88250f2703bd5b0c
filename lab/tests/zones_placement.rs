//! `steady-lab zones --placement --quick`: keyed traffic through zone a's outage on real
//! servers, following assignments the Assigner's weighted-move makes under three
//! placements, run as a user runs it. It asserts facts of state only (what the
//! assignments name against which servers run, which replicas a frontend's zone holds),
//! never when something happened on a machine whose load it does not know:
//!
//! * two replicas spread over zones: no slice of any assignment in force is without a
//!   live replica, in any phase, nor after any run;
//! * two replicas with no constraint: a quarter of the slices lose both replicas when zone
//!   a dies (weighted-move's initial assignment pairs tasks k and k + 1, numbered zone by
//!   zone), and the spread fails fewer keyed requests through the outage;
//! * a replica per zone: keyed requests of a zone whose replicas cover its demand never
//!   leave it (frontends 6/3/3: zones b and c; 4/4/4: every zone, so nothing crosses);
//!   zone a's outage is named as the constraint the task set cannot meet, and repaired
//!   when it returns.

#[allow(dead_code)] // This binary uses `run_quick_with` only.
mod support;

use std::process::Command;

use serde_json::Value;
use support::run_quick_with;

fn row<'a>(rows: &'a [Value], phase: &str, source: &str) -> &'a Value {
    rows.iter()
        .find(|r| r["phase"] == phase && r["source"] == source)
        .unwrap_or_else(|| panic!("no row for {phase} / {source}"))
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

fn lost(v: &Value) -> u64 {
    v["slices"].as_u64().unwrap()
}

/// What holds whatever the frontends: the assignments' state, and the failures' order.
fn common(rows: &[Value], text: &str) {
    assert_eq!(rows.len(), 3 * 3, "three phases, three sources:\n{text}");
    for r in rows {
        // (How many depends on the machine's load; the facts below do not.)
        assert!(r["requests"].as_u64().unwrap() > 0, "nothing answered: {r}\n{text}");
        assert_eq!(r["slices"].as_u64().unwrap(), 12 * 20, "a quick run's 20 slices per task: {r}");
        // Every assignment at every phase's end has a live replica for every slice.
        assert_eq!(lost(&r["without_live_replica_at_end"]), 0, "{r}\n{text}");
    }
    for phase in ["steady", "zone-down", "zone-back"] {
        let spread = row(rows, phase, "spread-zones");
        assert_eq!(lost(&spread["without_live_replica_at_change"]), 0, "{spread}\n{text}");
        for run in spread["runs"].as_array().unwrap() {
            assert_eq!(lost(&run["without_live_replica"]), 0, "{run}\n{text}");
            assert_eq!(run["violations"], Value::Array(vec![]), "{run}\n{text}");
        }
    }
    // The kill: a quarter of the unconstrained slices had both replicas in zone a.
    let free = row(rows, "zone-down", "unconstrained");
    let at_kill = &free["without_live_replica_at_change"];
    assert!(lost(at_kill) > 0, "{free}\n{text}");
    assert!((f(&at_kill["key_share"]) - 0.25).abs() < 0.01, "{free}\n{text}");
    // Its requests for those slices fail until the Assigner's run moves them (1 s of a
    // quarter of the keys); the spread loses only requests in flight to zone a.
    let spread = row(rows, "zone-down", "spread-zones");
    assert!(
        spread["failed"].as_u64().unwrap() < free["failed"].as_u64().unwrap(),
        "{spread}\n{free}\n{text}"
    );
    // A replica per zone: zone a's outage is named, and repaired when it returns.
    let down = row(rows, "zone-down", "replica-per-zone");
    assert_eq!(lost(&down["without_live_replica_at_change"]), 0, "{down}\n{text}");
    let named =
        down["runs"].as_array().unwrap().iter().any(|run| {
            run["infeasible"].as_str().is_some_and(|why| why.contains("zone a has no serving task"))
        });
    assert!(named, "{down}\n{text}");
    let back = row(rows, "zone-back", "replica-per-zone");
    let first = &back["runs"][0];
    assert_eq!(first["trigger"], "tasks");
    assert_eq!(first["violations"], Value::Array(vec![]), "{back}\n{text}");
    assert!(f(&first["forced_churn"]) > 0.3, "every slice got its zone-a replica back: {back}");
}

#[test]
fn a_spread_placement_keeps_every_slice_through_a_zone_s_outage() {
    let (text, rows, dir) = run_quick_with("zones", &["--placement"], "placement");
    common(&rows, &text);
    let steady = row(&rows, "steady", "replica-per-zone");
    let by_zone: Vec<f64> = steady["cross_zone_by_zone"].as_array().unwrap().iter().map(f).collect();
    // Zones b and c have a quarter of the demand each and a third of every slice's
    // replicas: their frontends keep every keyed request, exactly (they hold no connection
    // to another zone). Zone a has half of the demand and a third of the replicas: the
    // zone-aware rule keeps each replica's load even, so a third of zone a's requests
    // cross, and the share is the lowest possible (a sixth).
    assert_eq!((by_zone[1], by_zone[2]), (0.0, 0.0), "{steady}\n{text}");
    assert!((by_zone[0] - 1.0 / 3.0).abs() < 0.15, "{steady}\n{text}");
    assert!((f(&steady["lowest"]) - 1.0 / 6.0).abs() < 1e-9, "{steady}");
    let svg = std::fs::read_to_string(dir.join("zones-placement.svg")).unwrap_or_default();
    assert!(svg.contains("<svg") && svg.contains("spread over zones"), "the figure was not drawn");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn with_a_replica_per_zone_and_demand_even_across_zones_no_keyed_request_crosses() {
    let (text, rows, dir) = run_quick_with("zones", &["--placement", "--frontends", "4/4/4"], "even");
    common(&rows, &text);
    let steady = row(&rows, "steady", "replica-per-zone");
    assert_eq!(f(&steady["lowest"]), 0.0, "{steady}");
    assert_eq!(f(&steady["cross_zone"]), 0.0, "{steady}\n{text}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn settings_it_cannot_run_with_are_refused_in_one_line() {
    let refused: [&[&str]; 6] = [
        &["--frontends", "6/3/3"],
        &["--detection-ms", "500"],
        &["--placement", "--frontends", "6/3"],
        &["--placement", "--frontends", "0/3/3"],
        &["--placement", "--frontends", "6/3/x"],
        &["--placement", "--detection-ms", "10000"],
    ];
    for args in refused {
        let out = Command::new(env!("CARGO_BIN_EXE_steady-lab")).arg("zones").args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?} printed a table");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("steady-lab: --"), "{args:?}: {err}");
    }
}
