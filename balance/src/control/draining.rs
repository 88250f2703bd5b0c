//! Connections out of rotation, waiting for their requests in flight to finish.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::route::endpoint::Endpoint;
use crate::route::table::{Counters, Shared};

/// Retired connections by connection id, until their last request finishes.
pub(super) struct Draining<S> {
    endpoints: HashMap<u64, Arc<Endpoint<S>>>,
}

impl<S> Draining<S> {
    pub(super) fn new() -> Self {
        Self { endpoints: HashMap::new() }
    }

    /// Takes a connection out of rotation; it closes once its requests have finished
    /// (at once when none is in flight).
    pub(super) fn retire(&mut self, endpoint: Arc<Endpoint<S>>, why: &'static str, shared: &Shared<S>) {
        tracing::debug!(
            task = endpoint.task,
            in_flight = endpoint.in_flight.load(Ordering::Relaxed),
            why,
            "draining"
        );
        if endpoint.start_draining() {
            close(&endpoint, shared);
        } else {
            self.endpoints.insert(endpoint.id, endpoint);
        }
    }

    /// Connection `id` reported its last request done: close it if it is still idle.
    pub(super) fn drained(&mut self, id: u64, shared: &Shared<S>) {
        if self.endpoints.get(&id).is_some_and(|e| e.in_flight.load(Ordering::SeqCst) == 0) {
            if let Some(endpoint) = self.endpoints.remove(&id) {
                close(&endpoint, shared);
            }
        }
    }
}

/// Closes a connection: its counters join those of closed connections.
fn close<S>(endpoint: &Endpoint<S>, shared: &Shared<S>) {
    let c = &shared.counters;
    Counters::add(&c.closed, 1);
    Counters::add(&c.closed_requests, endpoint.requests.load(Ordering::Relaxed));
    Counters::add(&c.closed_failures, endpoint.failures.load(Ordering::Relaxed));
    Counters::add(&c.closed_keyed, endpoint.keyed.load(Ordering::Relaxed));
    shared.open.fetch_sub(1, Ordering::Relaxed);
    tracing::debug!(task = endpoint.task, "connection closed");
}
