//! Connections out of rotation, waiting for their requests in flight to finish.
//!
//! A connection's request counts join those of the connections out of rotation when it
//! is retired (it is in no published table by then), and whatever its last requests add
//! joins them when it closes: `BalanceStats` counts every request once, whether its
//! connection is open, draining or closed. (Failed calls are counted by the balancer as
//! they fail, not here.)

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::route::endpoint::Endpoint;
use crate::route::table::{Counters, Shared};

/// Retired connections by connection id, until their last request finishes.
pub(super) struct Draining<S> {
    endpoints: HashMap<u64, (Arc<Endpoint<S>>, Folded)>,
}

/// A connection's counts already added to the counters of retired connections.
#[derive(Clone, Copy, Default)]
struct Folded {
    requests: u64,
    keyed: u64,
}

impl Folded {
    /// Adds what `endpoint` counted since `self` to the shared counters; returns the new
    /// totals.
    fn fold<S>(self, endpoint: &Endpoint<S>, counters: &Counters) -> Self {
        let now = Folded {
            requests: endpoint.calls.requests.load(Ordering::Relaxed),
            keyed: endpoint.calls.keyed.load(Ordering::Relaxed),
        };
        Counters::add(&counters.closed_requests, now.requests - self.requests);
        Counters::add(&counters.closed_keyed, now.keyed - self.keyed);
        now
    }
}

impl<S> Draining<S> {
    pub(super) fn new() -> Self {
        Self { endpoints: HashMap::new() }
    }

    /// Takes a connection out of rotation (no published table may name it any more); it
    /// closes once its requests have finished (at once when none is in flight).
    pub(super) fn retire(&mut self, endpoint: Arc<Endpoint<S>>, why: &'static str, shared: &Shared<S>) {
        tracing::debug!(
            task = endpoint.task,
            in_flight = endpoint.calls.in_flight.load(Ordering::Relaxed),
            why,
            "draining"
        );
        let idle = endpoint.start_draining();
        let folded = Folded::default().fold(&endpoint, &shared.counters);
        if idle {
            close(&endpoint, shared);
        } else {
            self.endpoints.insert(endpoint.id, (endpoint, folded));
        }
    }

    /// Connection `id` reported its last request done: close it if it is still idle.
    pub(super) fn drained(&mut self, id: u64, shared: &Shared<S>) {
        if self.endpoints.get(&id).is_some_and(|(e, _)| e.calls.in_flight.load(Ordering::SeqCst) == 0) {
            if let Some((endpoint, folded)) = self.endpoints.remove(&id) {
                folded.fold(&endpoint, &shared.counters);
                close(&endpoint, shared);
            }
        }
    }
}

/// Closes a connection (its counts were folded already).
fn close<S>(endpoint: &Endpoint<S>, shared: &Shared<S>) {
    Counters::add(&shared.counters.closed, 1);
    shared.open.fetch_sub(1, Ordering::Relaxed);
    tracing::debug!(task = endpoint.task, "connection closed");
}
