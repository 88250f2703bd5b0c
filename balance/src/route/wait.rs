//! The slow path: a request that found no ready member waits for one, within the one
//! deadline that bounds all of its waits.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use steady_slice::SliceKey;
use steady_subset::prng::SplitMix64;
use tokio::time::Instant;

use super::endpoint::{Endpoint, Picked};
use super::pick::fresh_rng;
use super::table::{Counters, RoutingTable, Shared};
use crate::config::{NoReplicaPolicy, Waits};
use crate::error::BalanceError;

/// How long a request may wait in all, from the moment it first had to.
///
/// A request waits when no member is ready (the slow path of a call), and when the
/// member it was sent to is not ready (its readiness in the response future); it may
/// move to other members a few times. All of that counts against one budget, armed the
/// first time it waits (never on the fast path, which reads no clock): unkeyed requests
/// get `no_backend_wait`; keyed ones `affinity_wait` for a replica, plus
/// `no_backend_wait` when the policy falls back to the subset.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WaitBudget {
    started: Instant,
    deadline: Instant,
}

impl WaitBudget {
    /// A budget starting now, for a keyed request or not.
    pub(crate) fn start(waits: &Waits, keyed: bool) -> Self {
        let budget = match (keyed, waits.no_replica) {
            (false, _) => waits.no_backend,
            (true, NoReplicaPolicy::FallBackToSubset) => waits.affinity.saturating_add(waits.no_backend),
            (true, NoReplicaPolicy::Fail) => waits.affinity,
        };
        Self::lasting(budget)
    }

    /// A budget starting now for a request on `endpoint`, from its balancer's waits; one
    /// that has run out already when the balancer is gone.
    pub(crate) fn for_endpoint<S>(endpoint: &Endpoint<S>, keyed: bool) -> Self {
        match endpoint.rotation() {
            Some(rotation) => Self::start(&rotation.waits(), keyed),
            None => Self::lasting(Duration::ZERO),
        }
    }

    fn lasting(budget: Duration) -> Self {
        let started = Instant::now();
        // Waits are validated to at most an hour; an unbounded one is a year.
        let deadline =
            started.checked_add(budget).unwrap_or_else(|| started + Duration::from_secs(365 * 86_400));
        Self { started, deadline }
    }

    /// When waiting must end.
    pub(crate) fn deadline(&self) -> Instant {
        self.deadline
    }

    /// How long the request has waited so far.
    pub(crate) fn waited(&self) -> Duration {
        self.started.elapsed()
    }

    /// The error of a request whose budget ran out with no ready member.
    pub(crate) fn exhausted(&self) -> BalanceError {
        BalanceError::NoReadyBackends { waited: self.waited() }
    }
}

/// The slow path's wait for a ready endpoint.
pub(crate) type Wait<S> = Pin<Box<dyn Future<Output = Result<Picked<S>, BalanceError>> + Send>>;

/// The unkeyed slow path: no ready member now. Waits for a table with one, until the
/// budget's deadline.
pub(crate) fn wait_for_endpoint<S: Send + Sync + 'static>(
    shared: Arc<Shared<S>>,
    budget: WaitBudget,
) -> Wait<S> {
    Box::pin(async move {
        let found = first_pick(&shared, budget.deadline(), |table, rng| table.pick(rng).cloned()).await;
        match found {
            Some(endpoint) => Ok(Picked { endpoint, keyed: false }),
            None => {
                Counters::add(&shared.counters.no_backend, 1);
                Err(budget.exhausted())
            }
        }
    })
}

/// The keyed slow path: none of the slice's chosen replicas is connected, and at least one
/// can be (the control task has been asked to connect them). Waits for one up to the
/// affinity wait; then follows the policy: the subset, or `NoReplica`.
pub(crate) fn wait_for_replica<S: Send + Sync + 'static>(
    shared: Arc<Shared<S>>,
    key: SliceKey,
    budget: WaitBudget,
) -> Wait<S> {
    Box::pin(async move {
        let replica_deadline = Instant::now()
            .checked_add(shared.waits.affinity)
            .map_or(budget.deadline(), |t| t.min(budget.deadline()));
        let found = first_pick(&shared, replica_deadline, |table, rng| {
            let slices = table.slices.as_ref()?;
            slices.pick(slices.index(key), rng).cloned()
        })
        .await;
        if let Some(endpoint) = found {
            return Ok(Picked { endpoint, keyed: true });
        }
        no_replica(shared, key, budget).await
    })
}

/// A keyed request with no usable replica: to the subset (counted as a fallback, and no
/// longer keyed), or `NoReplica`, as the policy says.
pub(crate) async fn no_replica<S: Send + Sync + 'static>(
    shared: Arc<Shared<S>>,
    key: SliceKey,
    budget: WaitBudget,
) -> Result<Picked<S>, BalanceError> {
    match shared.waits.no_replica {
        NoReplicaPolicy::FallBackToSubset => {
            Counters::add(&shared.counters.keyed_fallbacks, 1);
            wait_for_endpoint(shared, budget).await
        }
        NoReplicaPolicy::Fail => {
            Counters::add(&shared.counters.no_replica, 1);
            let generation = shared.table.load().slices.as_ref().map_or(0, |s| s.generation);
            Err(BalanceError::NoReplica { key, generation })
        }
    }
}

/// The first endpoint `pick` finds in the current table or in one published before
/// `deadline`; `None` when the deadline passes.
async fn first_pick<S>(
    shared: &Shared<S>,
    deadline: Instant,
    mut pick: impl FnMut(&RoutingTable<S>, &mut SplitMix64) -> Option<Arc<Endpoint<S>>>,
) -> Option<Arc<Endpoint<S>>> {
    let mut versions = shared.versions.subscribe();
    let mut rng = fresh_rng();
    let search = async {
        loop {
            if let Some(endpoint) = pick(&shared.table.load(), &mut rng) {
                return endpoint;
            }
            // The sender lives in `shared`, which the caller holds: this only returns
            // once a new table is published.
            let _ = versions.changed().await;
        }
    };
    tokio::time::timeout_at(deadline, search).await.ok()
}
