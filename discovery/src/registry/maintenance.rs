//! Safe maintenance: a drain that waits its turn. At most a given number of a job's tasks
//! drain at once, whoever asks and however many ask together: the admission reads the
//! job's records and a maintenance key in one snapshot, and the drain is written only if
//! the maintenance key is unchanged since (every admitted drain rewrites it), so two
//! tasks that read the same free slot cannot both take it.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};
use steady_core::TaskState;
use tokio::time::Instant;

use super::record::{index_of, TaskRecord};
use super::{bounded, Registration, RegistryError, MAX_TASKS};

/// How often a waiting drain looks again.
const RECHECK: Duration = Duration::from_millis(50);

impl Registration {
    /// Drains this task (as [`Registration::drain`]) once fewer than `max_draining` other
    /// tasks of its job are draining, waiting at most `wait` for its turn: the drain a
    /// task makes on shutdown, so that a maintenance storm (many tasks restarted at once)
    /// takes a bounded bite of the job at a time. Tasks that have left (released, or
    /// crashed and expired) do not count; a task that restarts and registers again
    /// serves.
    ///
    /// Draining an already-draining registration returns at once.
    ///
    /// # Errors
    ///
    /// [`RegistryError::DrainRefused`] naming the tasks draining when `wait` ran out (the
    /// task is left serving: stop anyway, or wait again); [`RegistryError::InvalidArgument`]
    /// for `max_draining` 0; [`RegistryError::Lost`] when the key is no longer ours;
    /// [`RegistryError::Unavailable`] when etcd does not answer.
    pub async fn drain_within_budget(
        &self,
        max_draining: usize,
        wait: Duration,
    ) -> Result<(), RegistryError> {
        if max_draining == 0 {
            return Err(RegistryError::InvalidArgument { what: "max_draining", reason: "at least 1" });
        }
        if self.state() == TaskState::Draining {
            return Ok(());
        }
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
            let others: Vec<usize> = draining.into_iter().filter(|&i| i != self.index()).collect();
            if others.len() < max_draining {
                if self.admit_drain(revision).await? {
                    tracing::info!(key = %self.key(), draining = others.len() + 1, max_draining, "registry: draining within the budget");
                    return Ok(());
                }
                // Another drain was admitted since the read (or the key is gone): look again.
                refused_at = Some(revision);
                continue;
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(RegistryError::DrainRefused {
                    job: self.job().to_owned(),
                    draining: others,
                    max: max_draining,
                });
            }
            tokio::time::sleep(RECHECK.min(deadline - now)).await;
        }
    }

    /// The job's draining tasks and the maintenance key's revision (0: never written),
    /// read at one revision.
    async fn maintenance_snapshot(&self) -> Result<(Vec<usize>, i64), RegistryError> {
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
        let draining = tasks
            .iter()
            .flat_map(|get| get.kvs())
            .filter_map(|kv| {
                let index = index_of(kv.key().get(prefix.len()..)?, MAX_TASKS)?;
                let record = TaskRecord::decode(kv.value()).ok()?;
                (record.state == TaskState::Draining).then_some(index)
            })
            .collect();
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
            self.mark_draining();
            return Ok(true);
        }
        if !self.is_held() {
            return Err(RegistryError::Lost);
        }
        Ok(false)
    }
}
