//! [`JobConfig`]: everything that configures one job in the control plane, and the one
//! place its validation lives.

use std::collections::BTreeSet;
use std::time::Duration;

use steady_assigner::{
    by_name, profile_tasks, Assigner, Infeasible, JobSpec, ReplicaLimits, RunInput, Tasks, WeightedMove,
    WeightedMoveConfig, NAMES,
};
use steady_core::{valid_job_name, MAX_JOB_NAME_LEN};
use steady_slice::guard::Consistency;
use steady_slice::MAX_TASK;

use super::{JobConfigError, FLEET_SEGMENT, MAX_DRAINED, MAX_SPEC_BYTES, SPECS_SEGMENT};
use crate::assigner_service::{estimate, AssignerConfig, MIN_CADENCE};
use crate::store::MAX_ASSIGNMENT_BYTES;

/// The algorithm unless a spec names one (as `steady-slicer --algorithm`).
pub const DEFAULT_ALGORITHM: &str = "weighted-move";
/// The cadence unless a spec gives one (as `steady-slicer --cadence-ms`).
pub const DEFAULT_CADENCE: Duration = Duration::from_secs(10);
/// The longest cadence [`JobConfig::validate`] accepts: a day.
pub const MAX_CADENCE: Duration = Duration::from_secs(24 * 3600);
/// The election's lease unless a spec gives one (as `steady-slicer --lease-ttl-secs`).
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(5);
/// The most registry endpoints a [`TaskSource::Registry`] may list.
pub const MAX_REGISTRY_ENDPOINTS: usize = 16;
/// The longest registry endpoint, in bytes.
const MAX_ENDPOINT_LEN: usize = 512;
/// The longest DNS name (with its trailing dot), in bytes.
const MAX_DNS_NAME_LEN: usize = 254;

/// Where a job's tasks come from: the three ways `steady-slicer` takes (`--tasks`,
/// `--registry`, `--dns`). Only the source is named here; following it (steady-discovery)
/// is the program's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskSource {
    /// Tasks `0..N`, all serving, for good (`--tasks N`): 1 to 16,777,216.
    Count(u32),
    /// The job's tasks in the etcd registry at these endpoints (`--registry URLS`):
    /// 1 to [`MAX_REGISTRY_ENDPOINTS`] `http://` or `https://` URLs, reached with the
    /// program's etcd access settings.
    Registry {
        /// The registry's etcd endpoints.
        endpoints: Vec<String>,
    },
    /// A DNS name re-resolved on a period, task indices from StatefulSet-style ordinals
    /// (`--dns NAME`): 1 to 254 bytes, no whitespace or control characters.
    Dns(String),
}

/// Everything that configures one job in the control plane: what `steady-slicer` takes
/// today as per-job flags, as one value that can be stored (see the module documentation
/// for its JSON form).
///
/// Build one with [`JobConfig::new`] (the defaults of `steady-slicer`'s flags) and set
/// fields; [`JobConfig::validate`] says whether it can run. Durations are kept in the
/// document's units (`cadence_ms`, `lease_ttl_secs`, `handover_ms`), so
/// `validate` refuses fractions of them.
#[derive(Debug, Clone, PartialEq)]
pub struct JobConfig {
    /// The job's name (`--job`): 1 to 256 bytes, not `.specs` nor under `.specs/` (the
    /// etcd spec store's own keys sit there).
    pub job: String,
    /// The algorithm by name (`--algorithm`): one of [`steady_assigner::NAMES`]
    /// (default [`DEFAULT_ALGORITHM`]). With `weighted-move` the spec's goals configure
    /// it.
    pub algorithm: String,
    /// Time between runs (`--cadence-ms`): whole milliseconds, 10 ms to a day (default
    /// [`DEFAULT_CADENCE`]).
    pub cadence: Duration,
    /// Replicas, placement constraints, goals and task profiles (`--spec FILE`, or
    /// `--max-replicas N` alone: [`JobConfig::max_replicas`]). Default: one replica,
    /// no constraint.
    pub spec: JobSpec,
    /// The consistency mode (`--consistency`, default eventual). Exclusive needs at most
    /// one replica per slice, no handover, and a store with leases (etcd; the program
    /// checks that part).
    pub consistency: Consistency,
    /// The lease of the job's election (`--lease-ttl-secs`): whole seconds, 1 s to an
    /// hour (default [`DEFAULT_LEASE_TTL`]). A store without leases ignores it.
    pub lease_ttl: Duration,
    /// Moves in two steps, the warming step lasting this long
    /// (`AssignerConfig::handover`): whole milliseconds, 1 ms to an hour; `None` (the
    /// default) moves in one step. Not in exclusive mode.
    pub handover: Option<Duration>,
    /// Where the job's tasks come from.
    pub tasks: TaskSource,
    /// Tasks an operator drained (`steadyctl drain`): the Assigner treats each as
    /// draining, whatever its source says (its slices move away; it gets none), until
    /// undrained. At most [`MAX_DRAINED`] tasks, each at most `MAX_TASK`. Default: none.
    pub drained: BTreeSet<u32>,
}

impl JobConfig {
    /// Job `job` on `tasks`, with `steady-slicer`'s defaults for the rest: weighted-move
    /// every 10 s, one replica per slice, no constraint, eventual, a 5 s lease, no
    /// handover.
    pub fn new(job: impl Into<String>, tasks: TaskSource) -> Self {
        Self {
            job: job.into(),
            algorithm: DEFAULT_ALGORITHM.to_owned(),
            cadence: DEFAULT_CADENCE,
            spec: JobSpec::default(),
            consistency: Consistency::Eventual,
            lease_ttl: DEFAULT_LEASE_TTL,
            handover: None,
            tasks,
            drained: BTreeSet::new(),
        }
    }

    /// With a spec of only `1..=max` replicas per slice (`steady-slicer --max-replicas`
    /// without `--spec`).
    ///
    /// # Errors
    ///
    /// `spec.replicas` unless `1 <= max <= 1024`.
    pub fn max_replicas(mut self, max: usize) -> Result<Self, JobConfigError> {
        let replicas = ReplicaLimits::new(1, max)
            .map_err(|_| JobConfigError::new("spec.replicas", "1 to 1024 replicas per slice"))?;
        self.spec = JobSpec { replicas, ..JobSpec::default() };
        Ok(self)
    }

    /// Checks every field; cheap (no assigner runs: see
    /// [`JobConfig::check_first_run`] for what costs one).
    ///
    /// # Errors
    ///
    /// [`JobConfigError`] naming the first bad field as the JSON document names it:
    /// `job`, `algorithm`, `cadence_ms`, `lease_ttl_secs`, `handover_ms`,
    /// `tasks.count`, `tasks.registry.endpoints`, `tasks.dns`, `spec.<field>` (the
    /// assigner's own checks, and exclusive mode's one replica per slice), or
    /// `document` when its JSON form is above [`MAX_SPEC_BYTES`].
    pub fn validate(&self) -> Result<(), JobConfigError> {
        let bad = |field: &str, expected: &str| Err(JobConfigError::new(field, expected));
        if !valid_job_name(&self.job) {
            return bad("job", &format!("1 to {MAX_JOB_NAME_LEN} bytes"));
        }
        if reserved_job_name(&self.job) {
            return bad(
                "job",
                "a name other than .specs and .fleet and those under them (the control plane's own keys)",
            );
        }
        if !NAMES.contains(&self.algorithm.as_str()) {
            return bad("algorithm", &format!("one of {}", NAMES.join(", ")));
        }
        if !whole_millis(self.cadence) || !(MIN_CADENCE..=MAX_CADENCE).contains(&self.cadence) {
            return bad("cadence_ms", "whole milliseconds, 10 to 86,400,000");
        }
        let ttl = self.lease_ttl;
        if ttl.subsec_nanos() != 0 || !(1..=3600).contains(&ttl.as_secs()) {
            return bad("lease_ttl_secs", "whole seconds, 1 to 3,600");
        }
        if let Some(warm_up) = self.handover {
            if !whole_millis(warm_up)
                || !(Duration::from_millis(1)..=Duration::from_secs(3600)).contains(&warm_up)
            {
                return bad("handover_ms", "whole milliseconds, 1 to 3,600,000 (omit it for none)");
            }
        }
        self.validate_tasks()?;
        if self.drained.len() > MAX_DRAINED {
            return bad("drained", &format!("at most {MAX_DRAINED} tasks"));
        }
        if self.drained.last().is_some_and(|&task| task > MAX_TASK) {
            return bad("drained", &format!("task indices 0 to {MAX_TASK}"));
        }
        if let Err(error) = self.spec.validate() {
            return Err(JobConfigError::new(format!("spec.{}", error.field), error.expected));
        }
        if self.algorithm == "weighted-move" {
            if let Err(error) = WeightedMove::new(self.spec.weighted_move(WeightedMoveConfig::default())) {
                return bad("spec.goals", &error.to_string());
            }
        }
        // The Assigner service's own checks, where they reach the spec: exclusive mode's
        // one replica per slice and no handover, the zones and task rules.
        if let Err(error) = self.assigner_config().validate() {
            let field = match error.field {
                "cadence" => "cadence_ms",
                "replicas" => "spec.replicas",
                "handover" => "handover_ms",
                "placement.zones" => "spec.constraints.zones",
                "task_rules" => "spec.tasks",
                other => other,
            };
            return bad(field, error.expected);
        }
        let bytes = super::document::to_json(self).len();
        if bytes > MAX_SPEC_BYTES {
            return bad(
                "document",
                &format!("at most {MAX_SPEC_BYTES} bytes of JSON, not {bytes} (fewer task rules)"),
            );
        }
        Ok(())
    }

    fn validate_tasks(&self) -> Result<(), JobConfigError> {
        let bad = |field: &str, expected: &str| Err(JobConfigError::new(field, expected));
        match &self.tasks {
            TaskSource::Count(n) => {
                if *n == 0 || *n > MAX_TASK + 1 {
                    return bad("tasks.count", &format!("1 to {} (tasks 0..count)", MAX_TASK + 1));
                }
            }
            TaskSource::Registry { endpoints } => {
                if endpoints.is_empty() || endpoints.len() > MAX_REGISTRY_ENDPOINTS {
                    return bad("tasks.registry.endpoints", "1 to 16 etcd endpoints");
                }
                for (i, endpoint) in endpoints.iter().enumerate() {
                    let url = endpoint.starts_with("http://") || endpoint.starts_with("https://");
                    if !url || endpoint.len() > MAX_ENDPOINT_LEN || endpoint.chars().any(char::is_whitespace)
                    {
                        return bad(
                            &format!("tasks.registry.endpoints[{i}]"),
                            "an http:// or https:// URL of at most 512 bytes",
                        );
                    }
                }
            }
            TaskSource::Dns(name) => {
                let printable = name.chars().all(|c| !c.is_whitespace() && !c.is_control());
                if name.is_empty() || name.len() > MAX_DNS_NAME_LEN || !printable {
                    return bad(
                        "tasks.dns",
                        "a DNS name of 1 to 254 bytes, e.g. users.prod.svc.cluster.local.",
                    );
                }
            }
        }
        Ok(())
    }

    /// The Assigner service's configuration: the cadence, the spec's replicas,
    /// constraints and task rules, the handover and the consistency mode; the rest at
    /// [`AssignerConfig::default`].
    pub fn assigner_config(&self) -> AssignerConfig {
        AssignerConfig {
            cadence: self.cadence,
            handover: self.handover,
            consistency: self.consistency,
            ..AssignerConfig::default()
        }
        .with_spec(&self.spec)
    }

    /// The algorithm, configured: weighted-move with the spec's goals (its imbalance
    /// threshold and churn budget), the others at their defaults.
    ///
    /// # Errors
    ///
    /// `algorithm` for a name [`steady_assigner::by_name`] does not know; `spec.goals`
    /// for goals weighted-move refuses (a validated config has neither).
    pub fn assigner(&self) -> Result<Box<dyn Assigner + Send + Sync>, JobConfigError> {
        if self.algorithm == "weighted-move" {
            let wm = WeightedMove::new(self.spec.weighted_move(WeightedMoveConfig::default()))
                .map_err(|e| JobConfigError::new("spec.goals", e.to_string()))?;
            return Ok(Box::new(wm));
        }
        by_name(&self.algorithm)
            .ok_or_else(|| JobConfigError::new("algorithm", format!("one of {}", NAMES.join(", "))))
    }

    /// What `steady-slicer` checks of a fixed task count before it starts: the first
    /// run's assignment (every task serving, no load reported yet) must fit in an
    /// assignment store, or every write would be refused (the slices grow with the
    /// tasks). Costs one run of the algorithm over the tasks (for a million tasks,
    /// seconds); nothing for a job whose tasks come from discovery, which are not known
    /// yet (a store refuses an assignment too large and the Assigner counts the error).
    ///
    /// Returns why the spec's placement cannot be met by these tasks, if it cannot: not
    /// a refusal (the tasks that would meet it may come; the Assigner publishes the best
    /// assignment they allow), a warning to give.
    ///
    /// # Errors
    ///
    /// `tasks.count` when the first assignment is too large to store, `algorithm` when
    /// its first run fails, or the first field [`JobConfig::validate`] refuses.
    pub fn check_first_run(&self) -> Result<Option<Infeasible>, JobConfigError> {
        self.validate()?;
        let TaskSource::Count(n) = self.tasks else { return Ok(None) };
        let failed = |e: &dyn std::fmt::Display| {
            JobConfigError::new("algorithm", format!("an algorithm whose first run succeeds ({e})"))
        };
        let tasks = Tasks::serving(0..n).map_err(|e| failed(&e))?;
        let load = estimate(&[], &[], None, &tasks.serving_ids());
        let config = self.assigner_config();
        let profiled = profile_tasks(&config.task_rules, tasks).map_err(|e| failed(&e))?;
        let first = self
            .assigner()?
            .assign(&RunInput {
                previous: None,
                tasks: &profiled,
                load: &load,
                replicas: config.replicas,
                placement: &config.placement,
            })
            .map_err(|e| failed(&e))?;
        let bytes = first.assignment.encode().len();
        if bytes > MAX_ASSIGNMENT_BYTES {
            return Err(JobConfigError::new(
                "tasks.count",
                format!(
                    "a count whose first assignment fits a store ({MAX_ASSIGNMENT_BYTES} bytes): with {} it has {} slices, \
                     {bytes} bytes encoded; use fewer tasks or another algorithm",
                    self.algorithm,
                    first.assignment.slices().len()
                ),
            ));
        }
        Ok(first.report.infeasible)
    }
}

/// Whether `job` would put its keys among the etcd spec store's (`<prefix>.specs/...`):
/// `.specs` itself and every name under `.specs/`.
pub(super) fn reserved_job_name(job: &str) -> bool {
    [SPECS_SEGMENT, FLEET_SEGMENT]
        .into_iter()
        .any(|segment| job.strip_prefix(segment).is_some_and(|rest| rest.is_empty() || rest.starts_with('/')))
}

fn whole_millis(duration: Duration) -> bool {
    duration.subsec_nanos() % 1_000_000 == 0
}
