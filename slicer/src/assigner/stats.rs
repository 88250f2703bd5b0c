//! [`AssignerStats`]: what an Assigner service has done.

use std::sync::atomic::{AtomicU64, Ordering};

/// What an Assigner service has done, for tests, logs and the demo.
#[derive(Debug, Default)]
pub struct AssignerStats {
    pub(super) terms: AtomicU64,
    pub(super) runs: AtomicU64,
    pub(super) published: AtomicU64,
    pub(super) conflicts: AtomicU64,
    pub(super) errors: AtomicU64,
    pub(super) generation: AtomicU64,
}

impl AssignerStats {
    /// Times this service became the job's leader.
    pub fn terms(&self) -> u64 {
        self.terms.load(Ordering::Relaxed)
    }
    /// Assigner runs.
    pub fn runs(&self) -> u64 {
        self.runs.load(Ordering::Relaxed)
    }
    /// Generations written and handed to the Distributor.
    pub fn published(&self) -> u64 {
        self.published.load(Ordering::Relaxed)
    }
    /// Writes that lost a race (then re-read and retried).
    pub fn conflicts(&self) -> u64 {
        self.conflicts.load(Ordering::Relaxed)
    }
    /// Store errors, runs the assigner refused or panicked in, and failed campaigns
    /// (each retried after a backoff, or at the next cadence).
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }
    /// The last generation this service published (0: none).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }
}
