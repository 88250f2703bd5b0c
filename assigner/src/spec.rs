//! [`JobSpec`]: a job's placement as one declarative document: replicas, constraints,
//! goals and task profiles.
//!
//! With the `serde` feature, a `JobSpec` reads from (and writes to) a small document,
//! JSON for instance; unknown fields are refused (a typo must not pass unnoticed) and the
//! document is validated as it is read:
//!
//! ```json
//! {
//!   "replicas": { "min": 2, "max": 2 },
//!   "constraints": { "spread": "zones", "replica_per_zone": false, "zones": ["a", "b", "c"] },
//!   "goals": { "max_imbalance": 1.10, "churn_budget": 0.09 },
//!   "tasks": [
//!     { "range": [0, 5], "capacity": 2 },
//!     { "index": 9, "zone": "c", "rack": "r2" }
//!   ]
//! }
//! ```
//!
//! Every section and field is optional; the defaults are one replica, no constraint,
//! weighted-move's default goals, and every task in the zone its discovery source gives,
//! in no rack, with capacity 1.

use std::fmt;

use crate::error::AssignError;
use crate::load::ReplicaLimits;
use crate::placement::{Placement, TaskProfile};
use crate::tasks::Tasks;
use crate::weighted_move::WeightedMoveConfig;

/// What a job's placement aims for besides its constraints.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Goals {
    /// The imbalance (the busiest task's load over capacity against the job's) a run aims
    /// to stay under: weighted-move moves nothing below it and moves load above it, within
    /// the churn budget (default 1.05, weighted-move's suppression threshold).
    pub max_imbalance: f64,
    /// The share of the key space load moves may change owners per run (default 0.09,
    /// Slicer's). Repairs of constraints and moves off leaving tasks are not charged.
    pub churn_budget: f64,
}

impl Default for Goals {
    fn default() -> Self {
        let wm = WeightedMoveConfig::default();
        Self { max_imbalance: wm.suppress_below, churn_budget: wm.move_budget }
    }
}

/// Profile fields for the tasks `first..=last`; fields left `None` keep what the task
/// has (a zone from discovery, capacity 1).
#[derive(Debug, Clone, PartialEq)]
pub struct TaskRule {
    /// The first task index the rule applies to.
    pub first: u32,
    /// The last (inclusive).
    pub last: u32,
    /// The zone, for tasks whose discovery source gives none (a static list, a task
    /// count). A zone from discovery wins: it is where the task runs.
    pub zone: Option<String>,
    /// The rack (within the zone).
    pub rack: Option<String>,
    /// The capacity (finite, above zero).
    pub capacity: Option<f64>,
}

/// A job's placement, declared: see the module documentation.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct JobSpec {
    /// Replicas per slice.
    pub replicas: ReplicaLimits,
    /// The constraints.
    pub placement: Placement,
    /// The goals.
    pub goals: Goals,
    /// Task profiles, by index; a later rule overrides an earlier one's fields.
    pub tasks: Vec<TaskRule>,
}

/// A bad job spec: the field (a path such as `tasks[2].capacity`) and what it must be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecError {
    /// Where.
    pub field: String,
    /// What it must be.
    pub expected: String,
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "job spec: {} must be {}", self.field, self.expected)
    }
}

impl std::error::Error for SpecError {}

/// The most task rules a spec may have (a spec is configuration, not a fleet database).
pub const MAX_TASK_RULES: usize = 100_000;

impl JobSpec {
    /// Checks every field.
    ///
    /// # Errors
    ///
    /// [`SpecError`] naming the first bad field.
    pub fn validate(&self) -> Result<(), SpecError> {
        let bad = |field: String, expected: &str| Err(SpecError { field, expected: expected.to_owned() });
        if let Err(AssignError::BadConfig { field, expected }) = self.placement.validate() {
            return bad(format!("constraints.{field}"), expected);
        }
        let g = &self.goals;
        if !(g.max_imbalance.is_finite() && g.max_imbalance >= 1.0) {
            return bad("goals.max_imbalance".into(), "a finite number at least 1");
        }
        if !(g.churn_budget.is_finite() && (0.0..=1.0).contains(&g.churn_budget)) {
            return bad("goals.churn_budget".into(), "a share of the key space in [0, 1]");
        }
        if self.tasks.len() > MAX_TASK_RULES {
            return bad("tasks".into(), "at most 100000 rules");
        }
        for (i, rule) in self.tasks.iter().enumerate() {
            if rule.first > rule.last || rule.last > steady_slice::MAX_TASK {
                return bad(format!("tasks[{i}].range"), "first <= last <= 16777215");
            }
            let profile = TaskProfile {
                zone: rule.zone.clone(),
                rack: rule.rack.clone(),
                capacity: rule.capacity.unwrap_or(1.0),
            };
            if let Err(AssignError::BadProfile { field, .. }) = profile.validate(rule.first) {
                let expected = if field == "capacity" {
                    "finite and above zero"
                } else {
                    "1 to 63 bytes of [A-Za-z0-9._-]"
                };
                return bad(format!("tasks[{i}].{field}"), expected);
            }
        }
        Ok(())
    }

    /// Weighted-move's configuration for this spec's goals, from `base`.
    pub fn weighted_move(&self, base: WeightedMoveConfig) -> WeightedMoveConfig {
        WeightedMoveConfig {
            suppress_below: self.goals.max_imbalance,
            move_budget: self.goals.churn_budget,
            ..base
        }
    }

    /// `tasks` with the profiles the rules give (as [`profile_tasks`]).
    ///
    /// # Errors
    ///
    /// As [`profile_tasks`].
    pub fn profile(&self, tasks: Tasks) -> Result<Tasks, AssignError> {
        profile_tasks(&self.tasks, tasks)
    }
}

/// `tasks` with the profiles `rules` give: each listed task's profile with the fields of
/// every rule covering it applied in order (a later rule overrides an earlier one); a
/// zone the task already has (from discovery) wins over the rules'.
///
/// # Errors
///
/// [`AssignError::BadProfile`] for a rule's bad field (a validated spec has none).
pub fn profile_tasks(rules: &[TaskRule], mut tasks: Tasks) -> Result<Tasks, AssignError> {
    if rules.is_empty() {
        return Ok(tasks);
    }
    let listed: Vec<u32> = tasks.iter().map(|(t, _)| t).collect();
    for t in listed {
        let mut profile = tasks.profile(t).clone();
        let known_zone = profile.zone.is_some();
        let mut touched = false;
        for rule in rules.iter().filter(|r| (r.first..=r.last).contains(&t)) {
            touched = true;
            if !known_zone && rule.zone.is_some() {
                profile.zone.clone_from(&rule.zone);
            }
            if rule.rack.is_some() {
                profile.rack.clone_from(&rule.rack);
            }
            if let Some(c) = rule.capacity {
                profile.capacity = c;
            }
        }
        if touched {
            tasks.set_profile(t, profile)?;
        }
    }
    Ok(tasks)
}

#[cfg(feature = "serde")]
mod document {
    //! The document form of a [`JobSpec`].

    use serde::{Deserialize, Serialize};

    use super::{Goals, JobSpec, SpecError, TaskRule};
    use crate::load::ReplicaLimits;
    use crate::placement::{Placement, Spread};

    #[derive(Debug, Default, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    pub(super) struct Document {
        replicas: Option<Replicas>,
        constraints: Option<Constraints>,
        goals: Option<GoalsDoc>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tasks: Vec<Rule>,
    }

    #[derive(Debug, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Replicas {
        #[serde(default = "one")]
        min: usize,
        max: Option<usize>,
    }

    fn one() -> usize {
        1
    }

    #[derive(Debug, Default, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    struct Constraints {
        spread: Option<String>,
        replica_per_zone: bool,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        zones: Vec<String>,
    }

    #[derive(Debug, Default, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    struct GoalsDoc {
        max_imbalance: Option<f64>,
        churn_budget: Option<f64>,
    }

    #[derive(Debug, Default, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    struct Rule {
        #[serde(skip_serializing_if = "Option::is_none")]
        index: Option<u32>,
        #[serde(skip_serializing_if = "Option::is_none")]
        range: Option<[u32; 2]>,
        #[serde(skip_serializing_if = "Option::is_none")]
        zone: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        rack: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        capacity: Option<f64>,
    }

    impl TryFrom<Document> for JobSpec {
        type Error = SpecError;

        fn try_from(d: Document) -> Result<Self, SpecError> {
            let bad = |field: String, expected: &str| SpecError { field, expected: expected.to_owned() };
            let replicas = match d.replicas {
                None => ReplicaLimits::default(),
                Some(r) => ReplicaLimits::new(r.min, r.max.unwrap_or(r.min))
                    .map_err(|_| bad("replicas".into(), "1 <= min <= max <= 1024"))?,
            };
            let c = d.constraints.unwrap_or_default();
            let spread = match c.spread.as_deref() {
                None => Spread::None,
                Some(name) => Spread::from_name(name)
                    .ok_or_else(|| bad("constraints.spread".into(), "one of none, zones, racks"))?,
            };
            let placement = Placement { spread, replica_per_zone: c.replica_per_zone, zones: c.zones };
            let defaults = Goals::default();
            let g = d.goals.unwrap_or_default();
            let goals = Goals {
                max_imbalance: g.max_imbalance.unwrap_or(defaults.max_imbalance),
                churn_budget: g.churn_budget.unwrap_or(defaults.churn_budget),
            };
            let mut tasks = Vec::with_capacity(d.tasks.len().min(super::MAX_TASK_RULES));
            for (i, rule) in d.tasks.into_iter().enumerate() {
                let (first, last) = match (rule.index, rule.range) {
                    (Some(t), None) => (t, t),
                    (None, Some([a, b])) => (a, b),
                    _ => return Err(bad(format!("tasks[{i}]"), "given exactly one of index and range")),
                };
                tasks.push(TaskRule {
                    first,
                    last,
                    zone: rule.zone,
                    rack: rule.rack,
                    capacity: rule.capacity,
                });
            }
            let spec = JobSpec { replicas, placement, goals, tasks };
            spec.validate()?;
            Ok(spec)
        }
    }

    impl From<&JobSpec> for Document {
        fn from(s: &JobSpec) -> Self {
            Document {
                replicas: Some(Replicas { min: s.replicas.min(), max: Some(s.replicas.max()) }),
                constraints: Some(Constraints {
                    spread: Some(s.placement.spread.name().to_owned()),
                    replica_per_zone: s.placement.replica_per_zone,
                    zones: s.placement.zones.clone(),
                }),
                goals: Some(GoalsDoc {
                    max_imbalance: Some(s.goals.max_imbalance),
                    churn_budget: Some(s.goals.churn_budget),
                }),
                tasks: s
                    .tasks
                    .iter()
                    .map(|r| Rule {
                        index: (r.first == r.last).then_some(r.first),
                        range: (r.first != r.last).then_some([r.first, r.last]),
                        zone: r.zone.clone(),
                        rack: r.rack.clone(),
                        capacity: r.capacity,
                    })
                    .collect(),
            }
        }
    }

    impl<'de> Deserialize<'de> for JobSpec {
        fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            let document = Document::deserialize(deserializer)?;
            JobSpec::try_from(document).map_err(serde::de::Error::custom)
        }
    }

    impl Serialize for JobSpec {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            Document::from(self).serialize(serializer)
        }
    }
}
