//! Safe maintenance: a drain that waits its turn. At most a given number of a job's tasks
//! drain at once, and (optionally) at most a given number in each zone, whoever asks and
//! however many ask together: the admission reads the job's records and a maintenance
//! key in one snapshot, and the drain is written only if the maintenance key is
//! unchanged since (every admitted drain rewrites it), so two tasks that read the same
//! free slot cannot both take it.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};
use steady_core::{TaskState, Zone};
use tokio::time::Instant;

use super::record::{index_of, TaskRecord};
use super::{bounded, Registration, RegistryError, MAX_TASKS};

/// How often a waiting drain looks again.
const RECHECK: Duration = Duration::from_millis(50);

/// How many of a job's tasks may drain at once: a budget for the whole job and,
/// optionally, one for each zone ([`Registration::drain_within`]).
///
/// ```
/// use steady_discovery::registry::DrainBudget;
///
/// // At most 2 of the job's tasks draining, and at most 1 in any one zone: taking a
/// // whole zone down is then a deliberate act, never two overlapping drains.
/// let budget = DrainBudget::job(2).per_zone(1);
/// assert_eq!((budget.max_draining(), budget.max_draining_per_zone()), (2, Some(1)));
/// ```
///
/// * The **job's** budget counts every draining task of the job, in a zone or not.
/// * The **zone's** budget counts the draining tasks whose record is in the same zone as
///   the task asking (the ` zone=<zone>/<zone-index>` field of
///   [`TaskRecord`](super::TaskRecord)); tasks in no zone never count toward it. For a
///   task in no zone the zone's budget does not apply: only the job's does.
///
/// A zone's budget above the job's is allowed and never binds. Neither may be 0:
/// the drain then fails with [`RegistryError::InvalidArgument`] naming the budget
/// (`max_draining` or `max_draining_per_zone`) before anything is read or written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrainBudget {
    job: usize,
    per_zone: Option<usize>,
}

impl DrainBudget {
    /// At most `max_draining` of the job's tasks draining at once (counting the one
    /// asking), and no budget per zone.
    pub fn job(max_draining: usize) -> Self {
        Self { job: max_draining, per_zone: None }
    }

    /// The same budget, and at most `max_draining` draining at once in each zone
    /// (counting the one asking).
    pub fn per_zone(mut self, max_draining: usize) -> Self {
        self.per_zone = Some(max_draining);
        self
    }

    /// The job's budget.
    pub fn max_draining(&self) -> usize {
        self.job
    }

    /// The budget of each zone, if one was set.
    pub fn max_draining_per_zone(&self) -> Option<usize> {
        self.per_zone
    }

    fn validate(&self) -> Result<(), RegistryError> {
        if self.job == 0 {
            return Err(RegistryError::InvalidArgument { what: "max_draining", reason: "at least 1" });
        }
        if self.per_zone == Some(0) {
            return Err(RegistryError::InvalidArgument {
                what: "max_draining_per_zone",
                reason: "at least 1",
            });
        }
        Ok(())
    }

    /// Whether a task at `index` (in `zone`, if any) may drain when `draining` (each
    /// draining task's index and zone) are: the budget that refuses it, the tasks that
    /// count toward that budget and its limit when one does (the job's first: when both
    /// are spent, freeing the zone alone would not help).
    fn refusal(
        &self,
        index: usize,
        zone: Option<&Zone>,
        draining: &[(usize, Option<Zone>)],
    ) -> Option<Refusal> {
        let others = draining.iter().filter(|(i, _)| *i != index);
        let job: Vec<usize> = others.clone().map(|(i, _)| *i).collect();
        if job.len() >= self.job {
            return Some(Refusal { scope: DrainScope::Job, draining: job, max: self.job });
        }
        let (Some(max), Some(zone)) = (self.per_zone, zone) else { return None };
        let in_zone: Vec<usize> = others.filter(|(_, z)| z.as_ref() == Some(zone)).map(|(i, _)| *i).collect();
        (in_zone.len() >= max).then(|| Refusal {
            scope: DrainScope::Zone(zone.clone()),
            draining: in_zone,
            max,
        })
    }
}

/// Which budget refused a drain ([`RegistryError::DrainRefused`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DrainScope {
    /// The job's: [`DrainBudget::max_draining`] of its tasks were draining.
    Job,
    /// This zone's: [`DrainBudget::max_draining_per_zone`] of its tasks were draining.
    Zone(Zone),
}

/// A budget that has no room: which, who counts toward it, and its limit.
#[derive(Debug, PartialEq, Eq)]
struct Refusal {
    scope: DrainScope,
    draining: Vec<usize>,
    max: usize,
}

impl Registration {
    /// Drains this task (as [`Registration::drain`]) once fewer than `max_draining` other
    /// tasks of its job are draining, waiting at most `wait` for its turn: the drain a
    /// task makes on shutdown, so that a maintenance storm (many tasks restarted at once)
    /// takes a bounded bite of the job at a time. Tasks that have left (released, or
    /// crashed and expired) do not count; a task that restarts and registers again
    /// serves.
    ///
    /// The same as [`Registration::drain_within`] with [`DrainBudget::job`]`(max_draining)`;
    /// see there for a budget per zone too.
    ///
    /// # Errors
    ///
    /// As [`Registration::drain_within`]: [`RegistryError::InvalidArgument`] (`max_draining`)
    /// for `max_draining` 0.
    pub async fn drain_within_budget(
        &self,
        max_draining: usize,
        wait: Duration,
    ) -> Result<(), RegistryError> {
        self.drain_within(DrainBudget::job(max_draining), wait).await
    }

    /// Drains this task (as [`Registration::drain`]) once the `budget` has room for it,
    /// waiting at most `wait` for its turn: fewer than [`DrainBudget::max_draining`] other
    /// tasks of the job draining and, with a budget per zone and this task in a zone,
    /// fewer than [`DrainBudget::max_draining_per_zone`] other tasks of **its** zone
    /// draining (by their records' zone field; tasks in no zone or in other zones do not
    /// count toward it). For a task in no zone only the job's budget applies. Tasks that
    /// have left (released, or crashed and expired) do not count, nor do tasks that went
    /// back to serving ([`Registration::undrain`]).
    ///
    /// Admission is atomic across the job: the records and the maintenance key
    /// ([`Registry::maintenance_key`](super::Registry::maintenance_key)) are read at one
    /// revision, and the drain is written in a transaction conditioned on the maintenance
    /// key being unchanged (every admitted drain, in any zone, rewrites it). So two tasks
    /// that read the same free slot, of the job or of a zone, cannot both take it: the
    /// second reads again, and waits.
    ///
    /// Draining an already-draining registration returns at once.
    ///
    /// # Errors
    ///
    /// [`RegistryError::DrainRefused`] when `wait` ran out, naming the budget that
    /// refused ([`DrainScope::Job`], or [`DrainScope::Zone`] with the zone: the job's
    /// when both had no room), the tasks counted toward it and its limit; the task is
    /// left serving (stop anyway, or wait again). [`RegistryError::InvalidArgument`] for
    /// a budget of 0 (`max_draining` or `max_draining_per_zone`), before anything is
    /// read; [`RegistryError::Lost`] when the key is no longer ours;
    /// [`RegistryError::Unavailable`] when etcd does not answer.
    pub async fn drain_within(&self, budget: DrainBudget, wait: Duration) -> Result<(), RegistryError> {
        budget.validate()?;
        if self.state() == TaskState::Draining {
            return Ok(());
        }
        let zone = self.locality().map(|l| &l.zone);
        let deadline = Instant::now() + wait;
        // The maintenance revision of the last admission that failed.
        let mut refused_at: Option<i64> = None;
        loop {
            if !self.is_held() {
                return Err(RegistryError::Lost);
            }
            let (draining, revision) = self.maintenance_snapshot().await?;
            if refused_at == Some(revision) {
                // Nobody else was admitted, so it was our key that failed the comparison.
                return Err(RegistryError::Lost);
            }
            let Some(refusal) = budget.refusal(self.index(), zone, &draining) else {
                if self.admit_drain(revision).await? {
                    let others = draining.iter().filter(|(i, _)| *i != self.index()).count();
                    tracing::info!(
                        key = %self.key(),
                        zone = zone.map(Zone::as_str),
                        draining = others + 1,
                        max_draining = budget.max_draining(),
                        max_draining_per_zone = budget.max_draining_per_zone(),
                        "registry: draining within the budget"
                    );
                    return Ok(());
                }
                // Another drain was admitted since the read (or the key is gone): look again.
                refused_at = Some(revision);
                continue;
            };
            let now = Instant::now();
            if now >= deadline {
                let Refusal { scope, draining, max } = refusal;
                return Err(RegistryError::DrainRefused { job: self.job().to_owned(), scope, draining, max });
            }
            tokio::time::sleep(RECHECK.min(deadline - now)).await;
        }
    }

    /// Marks a draining task serving again (its maintenance is over, or was called off):
    /// rewrites its value as `serving <address>` (keeping its zone field), on condition
    /// that the key is still attached to this registration's lease. It no longer counts
    /// toward any drain budget, so a drain waiting its turn may be admitted. Undraining a
    /// serving registration rewrites the same value.
    ///
    /// # Errors
    ///
    /// [`RegistryError::Lost`] when the key is no longer ours; [`RegistryError::Unavailable`]
    /// when etcd does not answer (the state is then unknown: retry).
    pub async fn undrain(&self) -> Result<(), RegistryError> {
        self.write_state(TaskState::Serving).await?;
        tracing::info!(key = %self.key(), "registry: serving again");
        Ok(())
    }

    /// The job's draining tasks (each one's index and zone, by index) and the maintenance
    /// key's revision (0: never written), read at one revision.
    async fn maintenance_snapshot(&self) -> Result<(Vec<(usize, Option<Zone>)>, i64), RegistryError> {
        let registry = self.registry();
        let prefix = registry.tasks_prefix(self.job());
        let read = Txn::new().and_then([
            TxnOp::get(prefix.as_str(), Some(GetOptions::new().with_prefix().with_limit(MAX_TASKS as i64))),
            TxnOp::get(registry.maintenance_key(self.job()), None),
        ]);
        let mut kv = registry.client.kv_client();
        let response = bounded(registry.timeout(), "maintenance read", kv.txn(read)).await?;
        let mut gets = response.op_responses().into_iter().filter_map(|op| match op {
            TxnOpResponse::Get(get) => Some(get),
            _ => None,
        });
        let (tasks, maintenance) = (gets.next(), gets.next());
        let mut draining: Vec<(usize, Option<Zone>)> = tasks
            .iter()
            .flat_map(|get| get.kvs())
            .filter_map(|kv| {
                let index = index_of(kv.key().get(prefix.len()..)?, MAX_TASKS)?;
                let record = TaskRecord::decode(kv.value()).ok()?;
                (record.state == TaskState::Draining).then(|| (index, record.locality.map(|l| l.zone)))
            })
            .collect();
        // etcd orders keys as bytes ("10" before "2"): by index, for the error's list.
        draining.sort_unstable_by_key(|(index, _)| *index);
        let revision = maintenance.and_then(|get| get.kvs().first().map(|kv| kv.mod_revision())).unwrap_or(0);
        Ok((draining, revision))
    }

    /// Writes this task draining and bumps the maintenance key, if the maintenance key is
    /// still at `revision` and the task key still ours; whether it was.
    async fn admit_drain(&self, revision: i64) -> Result<bool, RegistryError> {
        let registry = self.registry();
        let maintenance = registry.maintenance_key(self.job());
        let value = self.record(TaskState::Draining);
        let lease = self.lease_id();
        let txn = Txn::new()
            .when([
                Compare::mod_revision(maintenance.as_str(), CompareOp::Equal, revision),
                Compare::lease(self.key(), CompareOp::Equal, lease),
            ])
            .and_then([
                TxnOp::put(maintenance.as_str(), format!("drain {}", self.index()), None),
                TxnOp::put(self.key(), value, Some(PutOptions::new().with_lease(lease))),
            ]);
        let mut kv = registry.client.kv_client();
        let response = bounded(registry.timeout(), "drain admission", kv.txn(txn)).await?;
        if response.succeeded() {
            self.mark_state(TaskState::Draining);
            return Ok(true);
        }
        if !self.is_held() {
            return Err(RegistryError::Lost);
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zone(label: &str) -> Zone {
        Zone::new(label).unwrap()
    }

    #[test]
    fn budgets_of_zero_are_refused_by_name() {
        let what = |budget: DrainBudget| match budget.validate() {
            Err(RegistryError::InvalidArgument { what, .. }) => what,
            other => panic!("{other:?}"),
        };
        assert_eq!(what(DrainBudget::job(0)), "max_draining");
        assert_eq!(what(DrainBudget::job(0).per_zone(1)), "max_draining");
        assert_eq!(what(DrainBudget::job(2).per_zone(0)), "max_draining_per_zone");
        assert_eq!(
            DrainBudget::job(1).per_zone(5).validate(),
            Ok(()),
            "a zone budget above the job's never binds"
        );
    }

    #[test]
    fn each_budget_counts_its_own_tasks() {
        let (a, b) = (zone("a"), zone("b"));
        let budget = DrainBudget::job(2).per_zone(1);
        let refused = |index, at: Option<&Zone>, draining: &[(usize, Option<Zone>)]| {
            budget.refusal(index, at, draining).map(|r| (r.scope, r.draining, r.max))
        };
        // Nothing draining; the asking task itself never counts.
        assert_eq!(refused(0, Some(&a), &[]), None);
        assert_eq!(refused(0, Some(&a), &[(0, Some(a.clone()))]), None);
        // One in zone a: a second in a is refused by a's budget, one in b is not.
        let one_in_a = [(0, Some(a.clone()))];
        assert_eq!(refused(1, Some(&a), &one_in_a), Some((DrainScope::Zone(a.clone()), vec![0], 1)));
        assert_eq!(refused(2, Some(&b), &one_in_a), None);
        // Tasks in no zone count toward the job's budget only.
        let none = [(5, None)];
        assert_eq!(refused(1, Some(&a), &none), None);
        assert_eq!(refused(1, Some(&a), &[(5, None), (6, None)]), Some((DrainScope::Job, vec![5, 6], 2)));
        // A task in no zone: the zone budget does not apply.
        assert_eq!(refused(7, None, &one_in_a), None);
        assert_eq!(
            refused(7, None, &[(0, Some(a.clone())), (2, Some(b.clone()))]).map(|r| r.0),
            Some(DrainScope::Job)
        );
        // Both spent: the job's is named.
        let both = [(0, Some(a.clone())), (2, Some(b.clone()))];
        assert_eq!(refused(1, Some(&a), &both), Some((DrainScope::Job, vec![0, 2], 2)));
        // Without a zone budget, a zone holds as many as the job allows.
        assert_eq!(DrainBudget::job(2).refusal(1, Some(&a), &one_in_a), None);
    }
}
