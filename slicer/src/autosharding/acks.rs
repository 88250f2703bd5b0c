//! What becomes of clients' acks: which generations a stream may ack, and the last
//! rejections per job, kept for the status page.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::SystemTime;

use steady_proto::autosharding::reassembly::bounded;

/// How many generations sent on one stream may still be acked: a client acks each one
/// as it has it, so only a client far behind (or lying) acks one older than this.
const ACKABLE: usize = 16;

/// The generations sent on one stream and not acked yet (the last [`ACKABLE`]).
#[derive(Debug, Default)]
pub(crate) struct Unacked(VecDeque<i64>);

impl Unacked {
    /// `generation` was sent.
    pub(crate) fn sent(&mut self, generation: i64) {
        if self.0.len() == ACKABLE {
            self.0.pop_front();
        }
        self.0.push_back(generation);
    }

    /// Takes an ack for `generation`: whether it was sent and not acked before.
    pub(crate) fn ack(&mut self, generation: i64) -> bool {
        match self.0.iter().position(|&g| g == generation) {
            Some(i) => {
                self.0.remove(i);
                true
            }
            None => false,
        }
    }
}

/// How many rejections are kept per job ([`Rejections`]).
pub const KEPT_REJECTIONS: usize = 8;

/// The most jobs whose rejections are kept; rejections of further jobs are counted only.
const MAX_REJECTING_JOBS: usize = 4096;

/// A client's refusal of an assignment it was sent: it keeps the one it had.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckRejection {
    /// The client's `client_uuid`.
    pub client: String,
    /// The generation it refused.
    pub generation: i64,
    /// Why, as it said (at most the protocol's 512 characters).
    pub message: String,
    /// When it said so.
    pub at: SystemTime,
}

/// The last [`KEPT_REJECTIONS`] rejections of each job (of at most 4,096 jobs; only jobs
/// that may be watched have any).
#[derive(Debug, Default)]
pub(crate) struct Rejections(Mutex<HashMap<String, VecDeque<AckRejection>>>);

impl Rejections {
    pub(crate) fn note(&self, job: &str, rejection: AckRejection) {
        let mut jobs = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if !jobs.contains_key(job) && jobs.len() >= MAX_REJECTING_JOBS {
            return;
        }
        let kept = jobs.entry(job.to_owned()).or_default();
        if kept.len() == KEPT_REJECTIONS {
            kept.pop_front();
        }
        kept.push_back(AckRejection { message: bounded(rejection.message.clone()), ..rejection });
    }

    /// `job`'s last rejections, oldest first.
    pub(crate) fn of(&self, job: &str) -> Vec<AckRejection> {
        let jobs = self.0.lock().unwrap_or_else(|p| p.into_inner());
        jobs.get(job).map(|kept| kept.iter().cloned().collect()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_generation_sent_and_not_yet_acked_may_be_acked() {
        let mut unacked = Unacked::default();
        assert!(!unacked.ack(1), "nothing sent");
        unacked.sent(4);
        unacked.sent(5);
        assert!(unacked.ack(4), "a late ack of an older one");
        assert!(!unacked.ack(4), "twice");
        assert!(!unacked.ack(6), "never sent");
        for generation in 6..6 + ACKABLE as i64 {
            unacked.sent(generation);
        }
        assert!(!unacked.ack(5), "fell out of the window");
        assert!(unacked.ack(6 + ACKABLE as i64 - 1));
    }

    #[test]
    fn a_job_keeps_its_last_rejections() {
        let rejections = Rejections::default();
        for generation in 0..10 {
            rejections.note(
                "users",
                AckRejection {
                    client: "c".to_owned(),
                    generation,
                    message: "m".repeat(1000),
                    at: SystemTime::UNIX_EPOCH,
                },
            );
        }
        let kept = rejections.of("users");
        assert_eq!(kept.iter().map(|r| r.generation).collect::<Vec<_>>(), (2..10).collect::<Vec<_>>());
        assert!(kept.iter().all(|r| r.message.chars().count() == 512));
        assert!(rejections.of("other").is_empty());
    }
}
