//! [`Gate`]: what a task publishes under, so that once it is closed nothing more is.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Closed once, for good. A task publishes (synchronously) while holding
/// [`Gate::enter`]'s guard; [`Gate::close`] waits for a publication under way, so nothing
/// is published after it returns. (Aborting the task is not enough: an abort lands only
/// at its next await, and a publication in hand would still go out.)
#[derive(Debug, Clone, Default)]
pub(super) struct Gate(Arc<Mutex<bool>>);

impl Gate {
    /// Closes it: waits for a publication under way, and lets none through after.
    pub(super) fn close(&self) {
        *self.lock() = true;
    }

    /// A guard to publish under (never held across an await), unless it is closed.
    pub(super) fn enter(&self) -> Option<MutexGuard<'_, bool>> {
        Some(self.lock()).filter(|closed| !**closed)
    }

    fn lock(&self) -> MutexGuard<'_, bool> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
