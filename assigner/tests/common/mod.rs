//! Checks shared by the integration tests.

#![allow(dead_code)]

use steady_assigner::{Assignment, ReplicaLimits, TaskState, Tasks};

/// Every slice on serving tasks only, with a replica count within the limits.
pub fn check_placement(a: &Assignment, tasks: &Tasks, limits: ReplicaLimits) {
    let serving = tasks.serving_ids().len();
    let (min, max) = (limits.min().min(serving), limits.max().min(serving));
    for (i, s) in a.slices().iter().enumerate() {
        for &t in s.replicas() {
            assert_eq!(tasks.state(t), TaskState::Serving, "slice {i} on task {t}");
        }
        assert!(
            s.replicas().len() >= min && s.replicas().len() <= max,
            "slice {i} has {} replicas, limits {min}..={max}",
            s.replicas().len()
        );
    }
    // Valid by steady-slice's rules (the constructor already checked; this re-checks).
    assert!(Assignment::new(a.generation(), a.slices().to_vec()).is_ok());
}

/// Every slice on serving tasks only, with at least one replica.
pub fn check_serving(a: &Assignment, tasks: &Tasks) {
    for (i, s) in a.slices().iter().enumerate() {
        assert!(!s.replicas().is_empty(), "slice {i} has no replica");
        for &t in s.replicas() {
            assert_eq!(tasks.state(t), TaskState::Serving, "slice {i} on task {t}");
        }
    }
}
