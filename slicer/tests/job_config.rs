//! `JobConfig`: every refusal names its field (built in code, and read from a document);
//! any valid config reads back from its JSON exactly; the JSON form is frozen (golden
//! files, which must still read).

use std::path::PathBuf;
use std::time::Duration;

use proptest::prelude::*;
use steady_assigner::{Goals, JobSpec, Placement, ReplicaLimits, Spread, TaskRule, NAMES};
use steady_slice::guard::Consistency;
use steady_slice::MAX_TASK;
use steady_slicer::specs::{DocumentError, JobConfig, TaskSource, MAX_SPEC_BYTES};
use steady_testing::check_golden_file;

fn users() -> JobConfig {
    JobConfig::new("users", TaskSource::Count(8))
}

/// The field `config`'s validation refuses.
fn refused_field(config: &JobConfig) -> String {
    match config.validate() {
        Err(error) => error.field,
        Ok(()) => panic!("accepted: {config:?}"),
    }
}

#[test]
fn the_defaults_are_the_binarys_and_valid() {
    let config = users();
    config.validate().unwrap();
    assert_eq!(config.algorithm, "weighted-move");
    assert_eq!(config.cadence, Duration::from_secs(10));
    assert_eq!(config.lease_ttl, Duration::from_secs(5));
    assert_eq!(config.consistency, Consistency::Eventual);
    assert_eq!(config.spec, JobSpec::default());
    let assigner = config.assigner_config();
    assert_eq!(assigner.cadence, Duration::from_secs(10));
    assert_eq!(assigner.replicas, ReplicaLimits::default());
    assert_eq!(config.assigner().unwrap().name(), "weighted-move");
}

#[test]
fn each_refusal_names_its_field() {
    let with = |change: &dyn Fn(&mut JobConfig)| {
        let mut config = users();
        change(&mut config);
        refused_field(&config)
    };
    assert_eq!(with(&|c| c.job = String::new()), "job");
    assert_eq!(with(&|c| c.job = "x".repeat(257)), "job");
    // The etcd spec store's own keys.
    assert_eq!(with(&|c| c.job = ".specs".into()), "job");
    assert_eq!(with(&|c| c.job = ".specs/users".into()), "job");
    assert_eq!(with(&|c| c.algorithm = "best-fit".into()), "algorithm");
    assert_eq!(with(&|c| c.cadence = Duration::from_millis(9)), "cadence_ms");
    assert_eq!(with(&|c| c.cadence = Duration::from_micros(10_500)), "cadence_ms");
    assert_eq!(with(&|c| c.cadence = Duration::from_secs(86_401)), "cadence_ms");
    assert_eq!(with(&|c| c.lease_ttl = Duration::ZERO), "lease_ttl_secs");
    assert_eq!(with(&|c| c.lease_ttl = Duration::from_millis(1500)), "lease_ttl_secs");
    assert_eq!(with(&|c| c.lease_ttl = Duration::from_secs(3601)), "lease_ttl_secs");
    assert_eq!(with(&|c| c.handover = Some(Duration::ZERO)), "handover_ms");
    assert_eq!(with(&|c| c.handover = Some(Duration::from_secs(3601))), "handover_ms");
    assert_eq!(with(&|c| c.tasks = TaskSource::Count(0)), "tasks.count");
    assert_eq!(with(&|c| c.tasks = TaskSource::Count(MAX_TASK + 2)), "tasks.count");
    assert_eq!(with(&|c| c.tasks = TaskSource::Registry { endpoints: vec![] }), "tasks.registry.endpoints");
    let many = vec!["http://etcd:2379".to_owned(); 17];
    assert_eq!(
        with(&|c| c.tasks = TaskSource::Registry { endpoints: many.clone() }),
        "tasks.registry.endpoints"
    );
    let endpoints = vec!["http://etcd-0:2379".to_owned(), "etcd-1:2379".to_owned()];
    assert_eq!(
        with(&|c| c.tasks = TaskSource::Registry { endpoints: endpoints.clone() }),
        "tasks.registry.endpoints[1]"
    );
    assert_eq!(with(&|c| c.tasks = TaskSource::Dns(String::new())), "tasks.dns");
    assert_eq!(with(&|c| c.tasks = TaskSource::Dns("users .svc".into())), "tasks.dns");
    // The assigner's spec, by its own field names under `spec.`.
    assert_eq!(
        with(&|c| c.spec.goals = Goals { max_imbalance: 0.5, ..Goals::default() }),
        "spec.goals.max_imbalance"
    );
    assert_eq!(
        with(&|c| c.spec.goals = Goals { churn_budget: f64::NAN, ..Goals::default() }),
        "spec.goals.churn_budget"
    );
    assert_eq!(
        with(
            &|c| c.spec.placement = Placement { zones: vec!["a".into(), "a".into()], ..Placement::default() }
        ),
        "spec.constraints.zones"
    );
    let rule = TaskRule { first: 3, last: 2, zone: None, rack: None, capacity: None };
    assert_eq!(with(&|c| c.spec.tasks = vec![rule.clone()]), "spec.tasks[0].range");
    // Exclusive mode: one replica per slice, no handover.
    let exclusive = |c: &mut JobConfig| c.consistency = Consistency::Exclusive;
    assert_eq!(
        with(&|c| {
            exclusive(c);
            c.spec.replicas = ReplicaLimits::new(1, 2).unwrap();
        }),
        "spec.replicas"
    );
    assert_eq!(
        with(&|c| {
            exclusive(c);
            c.handover = Some(Duration::from_secs(1));
        }),
        "handover_ms"
    );
    // A document past the bound (task rules are the only field that grows it).
    let rules: Vec<TaskRule> = (0..3000)
        .map(|i| TaskRule {
            first: i,
            last: i,
            zone: Some(format!("zone-{i}")),
            rack: None,
            capacity: Some(2.0),
        })
        .collect();
    assert_eq!(with(&|c| c.spec.tasks = rules.clone()), "document");
}

#[test]
fn exclusive_mode_with_one_replica_and_every_source_are_accepted() {
    let mut config = users();
    config.consistency = Consistency::Exclusive;
    config.validate().unwrap();
    config.tasks =
        TaskSource::Registry { endpoints: vec!["https://etcd-0:2379".into(), "http://etcd-1:2379".into()] };
    config.validate().unwrap();
    config.tasks = TaskSource::Dns("users.prod.svc.cluster.local.".into());
    config.validate().unwrap();
    // `--max-replicas` alone.
    let two = users().max_replicas(2).unwrap();
    assert_eq!(two.spec.replicas, ReplicaLimits::new(1, 2).unwrap());
    assert_eq!(users().max_replicas(0).unwrap_err().field, "spec.replicas");
}

#[test]
fn a_first_assignment_too_large_to_store_is_refused_by_the_task_count() {
    // As `steady-slicer --tasks 1024` finds: weighted-move starts with many slices per
    // task, past a store's 1 MiB for 1,024 tasks.
    let mut config = JobConfig::new("big", TaskSource::Count(1024));
    config.validate().unwrap();
    assert_eq!(config.check_first_run().unwrap_err().field, "tasks.count");
    // A job's tasks from discovery are not known yet: nothing to run.
    config.tasks = TaskSource::Dns("big.svc.".into());
    assert_eq!(config.check_first_run(), Ok(None));
    // A placement the tasks cannot meet is a warning, not a refusal.
    let mut spread = JobConfig::new("spread", TaskSource::Count(4));
    spread.spec.replicas = ReplicaLimits::new(2, 2).unwrap();
    spread.spec.placement.spread = Spread::Zones;
    assert!(spread.check_first_run().unwrap().is_some(), "two zones wanted, the tasks are in none");
}

/// The error reading `json` gives, and the field it names.
fn read_error(json: &str) -> (DocumentError, String) {
    let error = JobConfig::from_json(json.as_bytes()).unwrap_err();
    let field = error.field().to_owned();
    (error, field)
}

#[test]
fn a_document_is_refused_by_field() {
    let base = r#""version": 1, "job": "users", "tasks": {"count": 8}"#;
    let with = |extra: &str| format!("{{{base}{extra}}}");
    assert_eq!(JobConfig::from_json(with("").as_bytes()).unwrap(), users());
    assert_eq!(read_error(&with(r#", "cadence_ms": "fast""#)).1, "cadence_ms");
    assert_eq!(read_error(&with(r#", "cadence_ms": -1"#)).1, "cadence_ms");
    assert_eq!(read_error(&with(r#", "cadence_ms": 5"#)).1, "cadence_ms");
    assert_eq!(read_error(&with(r#", "consistency": "strong""#)).1, "consistency");
    assert_eq!(read_error(&with(r#", "algoritm": "lpt""#)).1, "algoritm");
    assert_eq!(read_error(&with(r#", "algorithm": "best-fit""#)).1, "algorithm");
    assert_eq!(read_error(&with(r#", "handover_ms": 0"#)).1, "handover_ms");
    assert_eq!(read_error(&with(r#", "lease_ttl_secs": 0"#)).1, "lease_ttl_secs");
    // Inside `spec`: the assigner's document names the inner field.
    let (error, field) = read_error(&with(r#", "spec": {"goals": {"churn_budget": 2}}"#));
    assert_eq!(field, "spec");
    assert!(error.to_string().contains("goals.churn_budget"), "{error}");
    let (error, field) = read_error(&with(r#", "spec": {"replicas": {"min": 1, "max": 2}, "colour": 1}"#));
    assert_eq!(field, "spec");
    assert!(error.to_string().contains("colour"), "{error}");
    // Inside `tasks`.
    let tasks = |tasks: &str| format!(r#"{{"version": 1, "job": "users", "tasks": {tasks}}}"#);
    assert_eq!(read_error(&tasks(r#"{"count": 0}"#)).1, "tasks.count");
    assert_eq!(read_error(&tasks(r#"{"pods": 3}"#)).1, "tasks");
    assert_eq!(
        read_error(&tasks(r#"{"registry": {"endpoints": ["http://e:2379"], "user": "x"}}"#)).1,
        "tasks"
    );
    assert_eq!(read_error(&tasks(r#"{"count": 3, "dns": "x."}"#)).1, "tasks");
    // Required fields, the version, the bound, the shape.
    assert_eq!(read_error(r#"{"version": 1, "tasks": {"count": 8}}"#).1, "job");
    assert_eq!(read_error(r#"{"version": 1, "job": "users"}"#).1, "tasks");
    let (error, field) = read_error(r#"{"job": "users", "tasks": {"count": 8}}"#);
    assert_eq!((field.as_str(), error), ("version", DocumentError::Version { found: None }));
    let (error, _) = read_error(r#"{"version": 2, "job": "users", "tasks": {"count": 8}, "shards": 3}"#);
    assert_eq!(error, DocumentError::Version { found: Some("2".into()) });
    assert!(matches!(read_error("[1, 2]").0, DocumentError::Malformed { .. }));
    assert!(matches!(read_error(r#"{"version": 1, "job": "#).0, DocumentError::Malformed { .. }));
    let padded = format!("{}{}", with(""), " ".repeat(MAX_SPEC_BYTES));
    assert!(matches!(read_error(&padded).0, DocumentError::TooLarge { .. }));
}

#[test]
fn serde_reads_and_writes_the_document_form() {
    let config = users();
    let text = serde_json::to_string(&config).unwrap();
    assert_eq!(serde_json::from_str::<JobConfig>(&text).unwrap(), config);
    assert_eq!(JobConfig::from_json(text.as_bytes()).unwrap(), config);
    // Deserialize validates as from_json does.
    assert!(serde_json::from_str::<JobConfig>(r#"{"version": 1, "job": "", "tasks": {"count": 8}}"#).is_err());
}

fn golden_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests").join("golden").join(name)
}

/// The configs the golden files pin: the defaults, every field set, exclusive on DNS.
fn golden_configs() -> Vec<(&'static str, JobConfig)> {
    let mut full = JobConfig::new(
        "users",
        TaskSource::Registry { endpoints: vec!["https://etcd-0:2379".into(), "https://etcd-1:2379".into()] },
    );
    full.algorithm = "weighted-move".into();
    full.cadence = Duration::from_millis(2500);
    full.lease_ttl = Duration::from_secs(3);
    full.handover = Some(Duration::from_millis(1500));
    full.spec = JobSpec {
        replicas: ReplicaLimits::new(2, 3).unwrap(),
        placement: Placement {
            spread: Spread::Zones,
            replica_per_zone: true,
            zones: vec!["a".into(), "b".into()],
        },
        goals: Goals { max_imbalance: 1.2, churn_budget: 0.05 },
        tasks: vec![
            TaskRule { first: 0, last: 5, zone: None, rack: None, capacity: Some(2.0) },
            TaskRule { first: 9, last: 9, zone: Some("b".into()), rack: Some("r2".into()), capacity: None },
        ],
    };
    let mut exclusive =
        JobConfig::new("payments/ledger", TaskSource::Dns("ledger.prod.svc.cluster.local.".into()));
    exclusive.algorithm = "lpt".into();
    exclusive.consistency = Consistency::Exclusive;
    vec![
        ("job-config-defaults.json", users()),
        ("job-config-full.json", full),
        ("job-config-exclusive.json", exclusive),
    ]
}

#[test]
fn the_json_form_is_frozen_and_still_reads() {
    for (name, config) in golden_configs() {
        config.validate().unwrap();
        check_golden_file(&golden_path(name), &config.to_json());
        let recorded = std::fs::read(golden_path(name)).unwrap();
        assert_eq!(JobConfig::from_json(&recorded).unwrap(), config, "{name}");
    }
}

fn label() -> impl Strategy<Value = String> {
    "[a-z0-9][a-z0-9._-]{0,8}"
}

fn task_rule() -> impl Strategy<Value = TaskRule> {
    (
        0..=MAX_TASK,
        0u32..100,
        proptest::option::of(label()),
        proptest::option::of(label()),
        proptest::option::of(0.01f64..1000.0),
    )
        .prop_map(|(first, span, zone, rack, capacity)| TaskRule {
            first,
            last: first.saturating_add(span).min(MAX_TASK),
            zone,
            rack,
            capacity,
        })
}

fn spec(exclusive: bool) -> impl Strategy<Value = JobSpec> {
    let max_replicas: usize = if exclusive { 1 } else { 4 };
    (
        (1..=max_replicas, 0..=max_replicas),
        prop_oneof![Just(Spread::None), Just(Spread::Zones), Just(Spread::Racks)],
        any::<bool>(),
        proptest::sample::subsequence(vec!["a", "b", "c", "us-east-1a"], 0..=4),
        (1.0f64..4.0, 0.0f64..=1.0),
        proptest::collection::vec(task_rule(), 0..4),
    )
        .prop_map(
            move |((min, extra), spread, replica_per_zone, zones, (max_imbalance, churn_budget), tasks)| {
                JobSpec {
                    replicas: ReplicaLimits::new(min, (min + extra).min(max_replicas)).unwrap(),
                    placement: Placement {
                        spread,
                        replica_per_zone,
                        zones: zones.into_iter().map(String::from).collect(),
                    },
                    goals: Goals { max_imbalance, churn_budget },
                    tasks,
                }
            },
        )
}

fn task_source() -> impl Strategy<Value = TaskSource> {
    prop_oneof![
        (1..=MAX_TASK + 1).prop_map(TaskSource::Count),
        proptest::collection::vec("https?://[a-z0-9.-]{1,20}:[0-9]{1,5}", 1..=16)
            .prop_map(|endpoints| TaskSource::Registry { endpoints }),
        "[a-z0-9-]{1,20}(\\.[a-z0-9-]{1,20}){0,4}\\.?".prop_map(TaskSource::Dns),
    ]
}

fn valid_config() -> impl Strategy<Value = JobConfig> {
    any::<bool>().prop_flat_map(|exclusive| {
        (
            "[a-zA-Z0-9][a-zA-Z0-9/_.:-]{0,40}",
            proptest::sample::select(NAMES.to_vec()),
            10u64..=86_400_000,
            1u64..=3600,
            if exclusive { Just(None).boxed() } else { proptest::option::of(1u64..=3_600_000).boxed() },
            task_source(),
            spec(exclusive),
        )
            .prop_map(move |(job, algorithm, cadence_ms, lease, handover_ms, tasks, spec)| {
                let mut config = JobConfig::new(job, tasks);
                config.algorithm = algorithm.to_owned();
                config.cadence = Duration::from_millis(cadence_ms);
                config.lease_ttl = Duration::from_secs(lease);
                config.handover = handover_ms.map(Duration::from_millis);
                config.consistency = if exclusive { Consistency::Exclusive } else { Consistency::Eventual };
                config.spec = spec;
                config
            })
    })
}

proptest! {
    #[test]
    fn any_valid_config_reads_back_from_its_json(config in valid_config()) {
        prop_assert_eq!(config.validate(), Ok(()));
        let json = config.to_json();
        prop_assert!(json.len() <= MAX_SPEC_BYTES);
        prop_assert_eq!(JobConfig::from_json(json.as_bytes()).unwrap(), config);
    }
}
