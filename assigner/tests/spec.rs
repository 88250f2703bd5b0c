//! The job spec document: what it reads, what it refuses (by field), and how its task
//! rules profile a task set.

use steady_assigner::{
    JobSpec, Placement, ReplicaLimits, Spread, TaskProfile, TaskState, Tasks, WeightedMoveConfig,
};

fn read(json: &str) -> Result<JobSpec, String> {
    serde_json::from_str(json).map_err(|e| e.to_string())
}

#[test]
fn an_empty_document_is_the_default_spec() {
    let spec = read("{}").unwrap();
    assert_eq!(spec, JobSpec::default());
    assert_eq!(spec.placement, *Placement::none());
    assert_eq!(spec.weighted_move(WeightedMoveConfig::default()), WeightedMoveConfig::default());
}

#[test]
fn a_full_document_reads_into_every_part() {
    let spec = read(
        r#"{
          "replicas": { "min": 2, "max": 3 },
          "constraints": { "spread": "racks", "replica_per_zone": true, "zones": ["a", "b", "c"] },
          "goals": { "max_imbalance": 1.1, "churn_budget": 0.05 },
          "tasks": [ { "range": [0, 5], "capacity": 2 }, { "index": 9, "zone": "c", "rack": "r2" } ]
        }"#,
    )
    .unwrap();
    assert_eq!(spec.replicas, ReplicaLimits::new(2, 3).unwrap());
    assert_eq!(spec.placement.spread, Spread::Racks);
    assert!(spec.placement.replica_per_zone);
    assert_eq!(spec.placement.zones, ["a", "b", "c"]);
    let wm = spec.weighted_move(WeightedMoveConfig::default());
    assert_eq!((wm.suppress_below, wm.move_budget), (1.1, 0.05));
    assert_eq!(spec.tasks.len(), 2);
    // It writes back to a document that reads to the same spec.
    let again: JobSpec = serde_json::from_str(&serde_json::to_string(&spec).unwrap()).unwrap();
    assert_eq!(again, spec);
}

#[test]
fn a_bad_document_is_refused_naming_the_field() {
    let cases = [
        (r#"{"replicas": {"min": 0}}"#, "replicas"),
        (r#"{"replicas": {"min": 3, "max": 2}}"#, "replicas"),
        (r#"{"constraints": {"spread": "regions"}}"#, "constraints.spread"),
        (r#"{"constraints": {"zones": ["a", "a"]}}"#, "constraints.zones"),
        (r#"{"constraints": {"zones": ["a b"]}}"#, "constraints.zones"),
        (r#"{"goals": {"max_imbalance": 0.9}}"#, "goals.max_imbalance"),
        (r#"{"goals": {"churn_budget": 1.5}}"#, "goals.churn_budget"),
        (r#"{"tasks": [{"index": 1, "capacity": 0}]}"#, "tasks[0].capacity"),
        (r#"{"tasks": [{"index": 1}, {"index": 2, "range": [2, 3]}]}"#, "tasks[1]"),
        (r#"{"tasks": [{"range": [5, 2]}]}"#, "tasks[0].range"),
        (r#"{"tasks": [{"index": 1, "rack": ""}]}"#, "tasks[0].rack"),
        (r#"{"tasks": [{"index": 1, "zone": "x/y"}]}"#, "tasks[0].zone"),
    ];
    for (json, field) in cases {
        let error = read(json).unwrap_err();
        assert!(error.contains(&format!("job spec: {field} must be")), "{json}: {error}");
    }
    // A typo is not silently ignored.
    let error = read(r#"{"constraints": {"spred": "zones"}}"#).unwrap_err();
    assert!(error.contains("unknown field"), "{error}");
}

#[test]
fn task_rules_profile_tasks_and_a_zone_from_discovery_wins() {
    let spec = read(
        r#"{"tasks": [ {"range": [0, 3], "zone": "a", "capacity": 2},
                       {"index": 3, "rack": "r1", "capacity": 4} ]}"#,
    )
    .unwrap();
    let tasks = Tasks::new((0..5).map(|t| (t, TaskState::Serving)))
        .unwrap()
        .with_profile(1, TaskProfile::in_zone("b"))
        .unwrap();
    let tasks = spec.profile(tasks).unwrap();
    assert_eq!(*tasks.profile(0), TaskProfile::in_zone("a").capacity(2.0));
    // Discovery said zone b: it stays.
    assert_eq!(*tasks.profile(1), TaskProfile::in_zone("b").capacity(2.0));
    // The later rule overrides the capacity.
    assert_eq!(*tasks.profile(3), TaskProfile::in_zone("a").rack("r1").capacity(4.0));
    assert_eq!(*tasks.profile(4), TaskProfile::default());
}
