//! Claiming indices race-free: the lowest free job index (and, in a zone, zone index),
//! or a member's own back, each in one etcd transaction, retried from what the losing
//! transaction read.

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};
use steady_core::{Locality, TaskState, Zone};
use steady_etcd::HeldLease;

use super::record::TaskRecord;
use super::{bounded, indices_in, keys_only, Registry, RegistryError, MAX_TASKS};

/// Where a claim puts a task: its job index and, in a zone, its locality.
#[derive(Debug, Clone)]
pub(super) struct Spot {
    pub(super) index: usize,
    pub(super) locality: Option<Locality>,
}

/// The indices held, as one transaction read them: the job's, and (for a claim in a
/// zone) the zone's.
#[derive(Debug, Default)]
pub(super) struct Held {
    pub(super) tasks: Vec<usize>,
    pub(super) zone: Vec<usize>,
}

/// One claim under way: who claims what, under which lease.
pub(super) struct Claim<'a> {
    pub(super) registry: &'a Registry,
    pub(super) job: &'a str,
    pub(super) member: &'a str,
    pub(super) state: TaskState,
    pub(super) zone: Option<&'a Zone>,
    pub(super) lease: &'a HeldLease,
    pub(super) tasks_prefix: String,
    pub(super) zone_prefix: Option<String>,
}

impl Claim<'_> {
    /// The keys `spot` is made of and the value each gets: the task key with the record,
    /// and in a zone the zone key with the job index.
    pub(super) fn keys(&self, spot: &Spot) -> Vec<(String, String)> {
        let record = TaskRecord::new(self.member, self.state).in_zone(spot.locality.clone()).encode();
        let mut keys = vec![(self.registry.task_key(self.job, spot.index), record)];
        if let Some(locality) = &spot.locality {
            let zone_key = self.registry.zone_key(self.job, &locality.zone, locality.index);
            keys.push((zone_key, spot.index.to_string()));
        }
        keys
    }

    /// The puts of `keys` under the claim's lease.
    pub(super) fn puts(&self, keys: &[(String, String)]) -> Vec<TxnOp> {
        let lease = self.lease.id();
        keys.iter()
            .map(|(key, value)| {
                TxnOp::put(key.as_str(), value.as_str(), Some(PutOptions::new().with_lease(lease)))
            })
            .collect()
    }

    /// The reads of the held indices: the job's task keys and (in a zone) the zone's keys.
    pub(super) fn reads(&self) -> Vec<TxnOp> {
        let mut reads = vec![TxnOp::get(self.tasks_prefix.as_str(), Some(keys_only(MAX_TASKS)))];
        if let Some(zone_prefix) = &self.zone_prefix {
            reads.push(TxnOp::get(zone_prefix.as_str(), Some(keys_only(MAX_TASKS))));
        }
        reads
    }

    /// The held indices in the answers to [`Claim::reads`] (in their order).
    pub(super) fn held_in(&self, gets: &[etcd_client::GetResponse]) -> Held {
        let indices = |prefix: &str, get: Option<&etcd_client::GetResponse>| {
            get.map(|get| indices_in(prefix.len(), get.kvs().iter().map(|kv| kv.key()))).unwrap_or_default()
        };
        Held {
            tasks: indices(&self.tasks_prefix, gets.first()),
            zone: self.zone_prefix.as_deref().map(|p| indices(p, gets.get(1))).unwrap_or_default(),
        }
    }

    /// The held indices, read in one transaction (one snapshot).
    pub(super) async fn read_held(&self) -> Result<Held, RegistryError> {
        let mut kv = self.registry.client.kv_client();
        let txn = Txn::new().and_then(self.reads());
        let response = bounded(self.registry.timeout(), "claim read", kv.txn(txn)).await?;
        Ok(self.held_in(&gets_of(&response)))
    }

    /// One transaction: puts `spot`'s keys when each is free or already holds exactly
    /// what this claim writes (the member's own, under whatever lease). `Ok` when it
    /// did; else the held indices, read in the same transaction.
    ///
    /// etcd compares are conjunctions, so "each ours or free" is one alternative per
    /// combination, nested in the else branches: still one round trip and one atomic
    /// step. Without a zone: `If(value == record) Then(put) Else(If(version == 0)
    /// Then(put) Else(read))`; in a zone the four combinations of the two keys.
    pub(super) async fn take_own(&self, spot: &Spot) -> Result<Result<(), Held>, RegistryError> {
        let keys = self.keys(spot);
        let choices: Vec<[Compare; 2]> = keys
            .iter()
            .map(|(key, value)| {
                [
                    Compare::value(key.as_str(), CompareOp::Equal, value.as_str()),
                    Compare::version(key.as_str(), CompareOp::Equal, 0),
                ]
            })
            .collect();
        // Every combination of one choice per key: ours before free, the task key's
        // choice varying slowest.
        let mut alternatives: Vec<Vec<Compare>> = vec![Vec::new()];
        for choice in &choices {
            alternatives = alternatives
                .into_iter()
                .flat_map(|prefix| {
                    choice.iter().map(move |compare| {
                        let mut alternative = prefix.clone();
                        alternative.push(compare.clone());
                        alternative
                    })
                })
                .collect();
        }
        let txn = nested(&alternatives, &self.puts(&keys), self.reads());
        let mut kv = self.registry.client.kv_client();
        let response = bounded(self.registry.timeout(), "re-claim transaction", kv.txn(txn)).await?;
        match outcome(&response) {
            Ok(()) => Ok(Ok(())),
            Err(gets) if gets.is_empty() => {
                // Not what etcd answers; read the held indices as a plain claim would.
                self.read_held().await.map(Err)
            }
            Err(gets) => {
                let mut held = self.held_in(&gets);
                held.mark_taken(spot);
                Ok(Err(held))
            }
        }
    }

    /// The lowest free index (and zone index), by create-if-absent transactions,
    /// starting from the indices `held`.
    pub(super) async fn lowest_free(&self, mut held: Held) -> Result<Spot, RegistryError> {
        let mut kv = self.registry.client.kv_client();
        let attempts = self.registry.config.max_claim_attempts;
        for attempt in 1..=attempts {
            let index = lowest_free(&held.tasks);
            let locality = self.zone.map(|zone| Locality::new(zone.clone(), lowest_free(&held.zone)));
            if index >= MAX_TASKS || locality.as_ref().is_some_and(|l| l.index >= MAX_TASKS) {
                return Err(RegistryError::JobFull { job: self.job.to_owned() });
            }
            let spot = Spot { index, locality };
            let keys = self.keys(&spot);
            let free: Vec<Compare> =
                keys.iter().map(|(key, _)| Compare::version(key.as_str(), CompareOp::Equal, 0)).collect();
            let txn = nested(&[free], &self.puts(&keys), self.reads());
            let response = bounded(self.registry.timeout(), "claim transaction", kv.txn(txn)).await?;
            let key = &keys[0].0;
            match outcome(&response) {
                Ok(()) => {
                    let zone_key = keys.get(1).map(|(key, _)| key.as_str());
                    tracing::info!(%key, zone_key, member = self.member, attempt, lease = self.lease.id(), "registry: claimed");
                    return Ok(spot);
                }
                Err(gets) => {
                    // Someone created a key of ours since our read: take the keys this
                    // transaction read (atomically with the failed comparison) and try
                    // the lowest free ones. (Without a read, which is not what etcd
                    // answers, assume only that ours are taken.)
                    if !gets.is_empty() {
                        held = self.held_in(&gets);
                    }
                    held.mark_taken(&spot);
                    tracing::debug!(%key, attempt, "registry: index taken meanwhile; trying the next free one");
                }
            }
        }
        Err(RegistryError::Contended { job: self.job.to_owned(), attempts })
    }
}

impl Held {
    /// After a failed comparison on `spot`'s keys, one of them is held even if the read
    /// was cut short: when the read shows neither, both count as held (so the next
    /// attempt moves on).
    pub(super) fn mark_taken(&mut self, spot: &Spot) {
        let task_held = self.tasks.binary_search(&spot.index).is_ok();
        let zone_held = spot.locality.as_ref().is_some_and(|l| self.zone.binary_search(&l.index).is_ok());
        if task_held || zone_held {
            return;
        }
        insert_sorted(&mut self.tasks, spot.index);
        if let Some(locality) = &spot.locality {
            insert_sorted(&mut self.zone, locality.index);
        }
    }
}

pub(super) fn insert_sorted(indices: &mut Vec<usize>, index: usize) {
    if let Err(position) = indices.binary_search(&index) {
        indices.insert(position, index);
    }
}

/// A transaction trying `alternatives` in order (each a conjunction of compares): the
/// first that holds runs `puts`; when none does, `reads` run. Each alternative after
/// the first is a transaction nested in the previous one's else branch.
pub(super) fn nested(alternatives: &[Vec<Compare>], puts: &[TxnOp], reads: Vec<TxnOp>) -> Txn {
    let Some((first, rest)) = alternatives.split_first() else {
        return Txn::new().and_then(reads);
    };
    let otherwise = if rest.is_empty() { reads } else { vec![TxnOp::txn(nested(rest, puts, reads))] };
    Txn::new().when(first.clone()).and_then(puts.to_vec()).or_else(otherwise)
}

/// Whether some alternative of a [`nested`] transaction held (`Ok`), else the answers
/// to its reads.
pub(super) fn outcome(response: &etcd_client::TxnResponse) -> Result<(), Vec<etcd_client::GetResponse>> {
    if response.succeeded() {
        return Ok(());
    }
    let ops = response.op_responses();
    if let Some(inner) = ops.iter().find_map(|op| match op {
        TxnOpResponse::Txn(inner) => Some(inner),
        _ => None,
    }) {
        return outcome(inner);
    }
    Err(gets_of(response))
}

/// The get answers of a transaction's branch, in order.
pub(super) fn gets_of(response: &etcd_client::TxnResponse) -> Vec<etcd_client::GetResponse> {
    response
        .op_responses()
        .into_iter()
        .filter_map(|op| match op {
            TxnOpResponse::Get(get) => Some(get),
            _ => None,
        })
        .collect()
}

/// The smallest index not in `held` (ascending, without duplicates).
pub(super) fn lowest_free(held: &[usize]) -> usize {
    held.iter().enumerate().find(|&(position, &index)| position != index).map_or(held.len(), |(p, _)| p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lowest_free_index_fills_holes_first() {
        assert_eq!(lowest_free(&[]), 0);
        assert_eq!(lowest_free(&[0, 1, 2]), 3);
        assert_eq!(lowest_free(&[1, 2]), 0);
        assert_eq!(lowest_free(&[0, 1, 3, 4, 7]), 2);
    }
}
