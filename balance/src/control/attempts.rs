//! Connection attempts, from waiting for the connector's readiness to the connection
//! or its error, as one source of outcomes the control task selects on.
//!
//! Nothing here makes the control task wait: an attempt queues until the connector is
//! ready, then connects, and either way its outcome arrives within the connect timeout
//! (one budget for readiness and connecting). A connector that errs, never becomes
//! ready, hangs or panics (with `panic = "unwind"`) fails that attempt, and its
//! backend backs off like after any failed connection. An attempt whose task left the
//! subset while it waited is dropped before it reaches the connector.

use std::collections::VecDeque;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
use tokio::time::{sleep_until, Instant, Sleep};

use crate::connector::{Address, Connector};
use crate::error::BoxError;

/// What an attempt comes to: the backend task, the attempt's id, the connection.
pub(super) type Outcome<S> = (usize, u64, Result<S, BoxError>);

type UnderWay<S> = Pin<Box<dyn Future<Output = Outcome<S>> + Send>>;

/// An attempt waiting for the connector to be ready.
struct Waiting<T> {
    task: usize,
    attempt: u64,
    address: T,
    deadline: Instant,
}

/// The connector and every attempt not yet come to an outcome.
pub(super) struct Attempts<T, C, S> {
    connector: C,
    timeout: Duration,
    /// Waiting for the connector's readiness, oldest (and so earliest deadline) first.
    waiting: VecDeque<Waiting<T>>,
    /// Wakes the control task when the oldest waiting attempt runs out of time.
    expiry: Option<Pin<Box<Sleep>>>,
    /// Connecting, or already failed and about to be reported.
    under_way: FuturesUnordered<UnderWay<S>>,
}

impl<T, C, S> Attempts<T, C, S>
where
    T: Address,
    C: Connector<T, S>,
    S: Send + 'static,
{
    pub(super) fn new(connector: C, timeout: Duration) -> Self {
        Self {
            connector,
            timeout,
            waiting: VecDeque::new(),
            expiry: None,
            under_way: FuturesUnordered::new(),
        }
    }

    /// Queues an attempt; its outcome comes out of [`Self::poll_outcome`] within the
    /// connect timeout.
    pub(super) fn start(&mut self, task: usize, attempt: u64, address: T) {
        let deadline = Instant::now() + self.timeout;
        self.waiting.push_back(Waiting { task, attempt, address, deadline });
    }

    /// Whether no attempt is waiting or under way (nothing to poll for).
    pub(super) fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.under_way.is_empty()
    }

    /// Starts the waiting attempts the connector is ready for, fails those out of
    /// time, and returns the next outcome. Waiting attempts that `current(task,
    /// attempt)` says are stale (their task left the subset, or a newer attempt
    /// replaced them) are dropped without an outcome, so they take no connector time.
    pub(super) fn poll_outcome(
        &mut self,
        cx: &mut Context<'_>,
        current: impl Fn(usize, u64) -> bool,
    ) -> Poll<Outcome<S>> {
        while let Some(front) = self.waiting.front() {
            if !current(front.task, front.attempt) {
                self.waiting.pop_front();
                continue;
            }
            let deadline = front.deadline;
            if deadline <= Instant::now() {
                let timeout = self.timeout;
                self.fail_front(format!("the connector was not ready within {timeout:?}").into());
                continue;
            }
            match catch_unwind(AssertUnwindSafe(|| self.connector.poll_ready(cx))) {
                Ok(Poll::Ready(Ok(()))) => self.call_front(),
                Ok(Poll::Ready(Err(e))) => self.fail_front(e.into()),
                Err(panic) => self.fail_front(connector_panicked(panic)),
                Ok(Poll::Pending) => {
                    // The connector wakes us when ready; the sleep, when out of time.
                    let expiry = self.expiry.get_or_insert_with(|| Box::pin(sleep_until(deadline)));
                    if expiry.deadline() != deadline {
                        expiry.as_mut().reset(deadline);
                    }
                    if expiry.as_mut().poll(cx).is_pending() {
                        break;
                    }
                }
            }
        }
        match self.under_way.poll_next_unpin(cx) {
            Poll::Ready(Some(outcome)) => Poll::Ready(outcome),
            // Nothing under way: whatever waits has registered for a wake-up above.
            Poll::Ready(None) | Poll::Pending => Poll::Pending,
        }
    }

    /// The connector is ready: connects the oldest waiting attempt.
    fn call_front(&mut self) {
        let Some(Waiting { task, attempt, address, deadline }) = self.waiting.pop_front() else { return };
        let call = catch_unwind(AssertUnwindSafe(|| self.connector.call(address)));
        let timeout = self.timeout;
        self.under_way.push(Box::pin(async move {
            let result = match call {
                Ok(connecting) => {
                    match tokio::time::timeout_at(deadline, AssertUnwindSafe(connecting).catch_unwind()).await
                    {
                        Ok(Ok(result)) => result.map_err(Into::into),
                        Ok(Err(panic)) => Err(connector_panicked(panic)),
                        Err(_) => Err(format!("connection attempt timed out after {timeout:?}").into()),
                    }
                }
                Err(panic) => Err(connector_panicked(panic)),
            };
            (task, attempt, result)
        }));
    }

    /// Fails the oldest waiting attempt with `error`.
    fn fail_front(&mut self, error: BoxError) {
        let Some(Waiting { task, attempt, .. }) = self.waiting.pop_front() else { return };
        self.under_way.push(Box::pin(async move { (task, attempt, Err(error)) }));
    }
}

/// A connector's panic as a connection error (its message, when it has one).
fn connector_panicked(payload: Box<dyn std::any::Any + Send>) -> BoxError {
    let message = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".to_string());
    format!("the connector panicked: {message}").into()
}
