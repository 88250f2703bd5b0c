//! [`AssignmentWatch`]: a job's assignments as a store sees them change.

use std::fmt;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::Stream;
use steady_slice::Assignment;

use super::{Revision, ValueError};

/// A stored value a watch rejected: where it was, and why it is not an assignment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RejectedValue {
    /// The key's revision that held it.
    pub revision: Revision,
    /// Why it was rejected.
    pub error: ValueError,
}

impl fmt::Display for RejectedValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} rejected: {}", self.revision, self.error)
    }
}

impl std::error::Error for RejectedValue {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// The stream [`super::AssignmentStore::watch`] returns: each newer generation of a job's
/// assignment, and an error for each stored value that is not one. It never ends on its
/// own; dropping it stops the watch.
pub struct AssignmentWatch {
    inner: Pin<Box<dyn Stream<Item = Result<Assignment, RejectedValue>> + Send>>,
    rejected: Arc<AtomicU64>,
}

impl fmt::Debug for AssignmentWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AssignmentWatch").field("rejected", &self.rejected()).finish_non_exhaustive()
    }
}

impl AssignmentWatch {
    /// Wraps a store's stream, counting the values it rejects.
    pub(crate) fn new(inner: impl Stream<Item = Result<Assignment, RejectedValue>> + Send + 'static) -> Self {
        Self { inner: Box::pin(inner), rejected: Arc::default() }
    }

    /// How many stored values this watch has rejected so far (each also came through as
    /// an error item).
    pub fn rejected(&self) -> u64 {
        self.rejected.load(Ordering::Relaxed)
    }
}

impl Stream for AssignmentWatch {
    type Item = Result<Assignment, RejectedValue>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let item = self.inner.as_mut().poll_next(cx);
        if let Poll::Ready(Some(Err(rejected))) = &item {
            self.rejected.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(error = %rejected, "store watch: stored value rejected, the last good assignment stays");
        }
        item
    }
}
