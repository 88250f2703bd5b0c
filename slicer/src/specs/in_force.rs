//! [`InForce`]: the specs a watch holds in force, and the changes each stored value it
//! sees makes to them. Both backends' watches run on it, so that they agree on what a
//! bad value, a removal and the job bound do.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::{document, JobConfig, RejectedSpec, SpecChange, SpecStoreError, MAX_JOBS};

/// One item of a [`super::SpecWatch`].
pub(super) type SpecItem = Result<SpecChange, SpecStoreError>;

/// The specs in force, by job, and a fingerprint of the last value seen for each stored
/// name (an etcd revision, a hash of a file's bytes), so a value seen again is neither
/// parsed nor reported again.
///
/// Bounded: at most [`MAX_JOBS`] specs in force and about twice as many fingerprints
/// (one per stored name, good or bad, up to that bound; past it a name is parsed every
/// time it is seen).
#[derive(Debug, Default)]
pub(super) struct InForce {
    specs: BTreeMap<String, JobConfig>,
    seen: HashMap<String, u64>,
}

impl InForce {
    /// The stored value `bytes` of `job` (the name its key or file gives), with
    /// `fingerprint`: a change to the job's spec, a refusal, or nothing (seen already, or
    /// the spec in force again).
    pub(super) fn offer(&mut self, job: &str, fingerprint: u64, bytes: &[u8]) -> Option<SpecItem> {
        if self.seen.get(job) == Some(&fingerprint) {
            return None;
        }
        self.remember(job, fingerprint);
        let config = match document::from_json_for(job, bytes) {
            Ok(config) => config,
            Err(error) => {
                let rejected = RejectedSpec { job: job.to_owned(), error };
                return Some(Err(SpecStoreError::Rejected(rejected)));
            }
        };
        self.put(config)
    }

    /// A stored name that cannot be a job's (not UTF-8), with `fingerprint`: a refusal
    /// unless seen already.
    pub(super) fn offer_refused(
        &mut self,
        name: &str,
        fingerprint: u64,
        error: super::DocumentError,
    ) -> Option<SpecItem> {
        if self.seen.get(name) == Some(&fingerprint) {
            return None;
        }
        self.remember(name, fingerprint);
        Some(Err(SpecStoreError::Rejected(RejectedSpec { job: name.to_owned(), error })))
    }

    /// `config` in force for its job: `Put` when it changes the job's spec.
    fn put(&mut self, config: JobConfig) -> Option<SpecItem> {
        if self.specs.get(&config.job) == Some(&config) {
            return None;
        }
        if !self.specs.contains_key(&config.job) && self.specs.len() >= MAX_JOBS {
            // Seen again next time (so taken once there is room).
            self.seen.remove(&config.job);
            return Some(Err(SpecStoreError::too_many_jobs(&config.job)));
        }
        self.specs.insert(config.job.clone(), config.clone());
        Some(Ok(SpecChange::Put(config)))
    }

    fn remember(&mut self, name: &str, fingerprint: u64) {
        if let Some(seen) = self.seen.get_mut(name) {
            *seen = fingerprint;
        } else if self.seen.len() < 2 * MAX_JOBS {
            self.seen.insert(name.to_owned(), fingerprint);
        }
    }

    /// Whether `job` has a spec in force.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    pub(super) fn has(&self, job: &str) -> bool {
        self.specs.contains_key(job)
    }

    /// `config`, an older value of its job's key (the last good one behind a bad value),
    /// in force if the job has none: `Put` then.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    pub(super) fn recover(&mut self, config: JobConfig) -> Option<SpecItem> {
        if self.has(&config.job) {
            return None;
        }
        self.put(config)
    }

    /// `job`'s value removed from the store: `Removed` if it had a spec in force.
    pub(super) fn remove(&mut self, job: &str) -> Option<SpecItem> {
        self.seen.remove(job);
        self.specs.remove(job).map(|_| Ok(SpecChange::Removed(job.to_owned())))
    }

    /// A listing of every stored value begins: see [`Listing`].
    pub(super) fn listing(&mut self) -> Listing<'_> {
        Listing { in_force: self, present: BTreeSet::new(), deferred: Vec::new(), items: Vec::new() }
    }

    /// After a listing of every stored name, `present` (bad values included): the jobs
    /// whose values are gone are removed.
    fn retain(&mut self, present: &BTreeSet<String>) -> Vec<SpecItem> {
        self.seen.retain(|name, _| present.contains(name));
        let gone: Vec<String> = self.specs.keys().filter(|job| !present.contains(*job)).cloned().collect();
        gone.iter().filter_map(|job| self.remove(job)).collect()
    }

    /// Every spec in force, by job name.
    pub(super) fn current(&self) -> SpecChange {
        SpecChange::Current(self.specs.values().cloned().collect())
    }
}

/// A listing of every stored value, applied to the specs in force: each value offered,
/// then (at [`Listing::finish`]) the jobs whose values are gone removed, and the new
/// jobs the bound refused while they were still there offered again, so a listing that
/// replaces some jobs by others at the bound takes the new ones.
pub(super) struct Listing<'a> {
    in_force: &'a mut InForce,
    present: BTreeSet<String>,
    /// New jobs refused at the bound: (job, fingerprint, value), at most [`MAX_JOBS`]
    /// values of at most [`super::MAX_SPEC_BYTES`] (a listing has no more).
    deferred: Vec<(String, u64, Vec<u8>)>,
    items: Vec<SpecItem>,
}

impl Listing<'_> {
    /// `job`'s stored value.
    pub(super) fn offer(&mut self, job: &str, fingerprint: u64, bytes: &[u8]) {
        self.present.insert(job.to_owned());
        match self.in_force.offer(job, fingerprint, bytes) {
            Some(Err(SpecStoreError::TooManyJobs { .. })) => {
                self.deferred.push((job.to_owned(), fingerprint, bytes.to_vec()));
            }
            item => self.items.extend(item),
        }
    }

    /// A stored value refused unread (`error`): see [`InForce::offer_refused`].
    pub(super) fn offer_refused(&mut self, name: &str, fingerprint: u64, error: super::DocumentError) {
        self.present.insert(name.to_owned());
        self.items.extend(self.in_force.offer_refused(name, fingerprint, error));
    }

    /// `job`'s value is stored but could not be read now (`error`): its spec in force
    /// stays.
    pub(super) fn unreadable(&mut self, job: &str, error: SpecStoreError) {
        self.present.insert(job.to_owned());
        self.items.push(Err(error));
    }

    /// The listing failed part way: the changes it made so far, without removals (a
    /// value not read yet is not gone). A first listing's are dropped with the specs
    /// they put in force, so that `Current` still comes first, from the next listing.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    pub(super) fn abandon(self, first: bool) -> Vec<SpecItem> {
        if first {
            *self.in_force = InForce::default();
            return Vec::new();
        }
        // Jobs refused at the bound were not remembered: the next listing offers them
        // again.
        self.items
    }

    /// The listing's items: the changes it made (for the first listing, `Current`
    /// first, then its refusals).
    pub(super) fn finish(mut self, first: bool) -> Vec<SpecItem> {
        let mut items = std::mem::take(&mut self.items);
        items.extend(self.in_force.retain(&self.present));
        for (job, fingerprint, bytes) in std::mem::take(&mut self.deferred) {
            items.extend(self.in_force.offer(&job, fingerprint, &bytes));
        }
        if !first {
            return items;
        }
        let mut first_items = vec![Ok(self.in_force.current())];
        first_items.extend(items.into_iter().filter(Result::is_err));
        first_items
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::specs::TaskSource;

    fn json(job: &str, cadence_ms: u64) -> Vec<u8> {
        let mut config = JobConfig::new(job, TaskSource::Count(4));
        config.cadence = std::time::Duration::from_millis(cadence_ms);
        config.to_json().into_bytes()
    }

    #[test]
    fn a_bad_value_is_refused_once_and_the_last_good_spec_stays() {
        let mut in_force = InForce::default();
        assert!(matches!(in_force.offer("a", 1, &json("a", 100)), Some(Ok(SpecChange::Put(_)))));
        let refused = in_force.offer("a", 2, b"{not json");
        assert!(matches!(refused, Some(Err(SpecStoreError::Rejected(ref r))) if r.job == "a"), "{refused:?}");
        // The same value seen again: nothing; the spec in force is the good one.
        assert!(in_force.offer("a", 2, b"{not json").is_none());
        let SpecChange::Current(specs) = in_force.current() else { unreachable!() };
        assert_eq!(specs[0].cadence.as_millis(), 100);
        // The good value back (a new fingerprint, the same spec): no change.
        assert!(in_force.offer("a", 3, &json("a", 100)).is_none());
        assert!(matches!(in_force.offer("a", 4, &json("a", 200)), Some(Ok(SpecChange::Put(_)))));
    }

    #[test]
    fn a_value_naming_another_job_is_refused() {
        let mut in_force = InForce::default();
        let refused = in_force.offer("a", 1, &json("b", 100));
        let Some(Err(SpecStoreError::Rejected(rejected))) = refused else { panic!("{refused:?}") };
        assert_eq!(rejected.error.field(), "job");
    }

    #[test]
    fn a_removed_value_removes_its_job_and_a_listing_removes_the_missing_ones() {
        let mut in_force = InForce::default();
        in_force.offer("a", 1, &json("a", 100));
        in_force.offer("b", 1, &json("b", 100));
        in_force.offer("c", 1, b"bad");
        assert!(matches!(in_force.remove("a"), Some(Ok(SpecChange::Removed(ref job))) if job == "a"));
        assert!(in_force.remove("a").is_none());
        // "c" never had a spec in force: its removal changes nothing.
        assert!(in_force.remove("c").is_none());
        let gone = in_force.listing().finish(false);
        assert!(matches!(gone.as_slice(), [Ok(SpecChange::Removed(job))] if job == "b"), "{gone:?}");
    }

    #[test]
    fn a_listing_at_the_bound_replaces_jobs_by_others() {
        let mut in_force = InForce::default();
        let mut listing = in_force.listing();
        for i in 0..MAX_JOBS {
            let job = format!("j{i}");
            listing.offer(&job, 1, &json(&job, 100));
        }
        let first = listing.finish(true);
        assert!(matches!(first.as_slice(), [Ok(SpecChange::Current(specs))] if specs.len() == MAX_JOBS));
        // j0 gone and "past" new in the same listing: "past" is taken.
        let mut listing = in_force.listing();
        for i in 1..MAX_JOBS {
            let job = format!("j{i}");
            listing.offer(&job, 1, &json(&job, 100));
        }
        listing.offer("past", 1, &json("past", 100));
        let items = listing.finish(false);
        assert!(
            matches!(items.as_slice(), [Ok(SpecChange::Removed(gone)), Ok(SpecChange::Put(new))] if gone == "j0" && new.job == "past"),
            "{items:?}"
        );
    }

    #[test]
    fn no_more_than_max_jobs_are_in_force() {
        let mut in_force = InForce::default();
        for i in 0..MAX_JOBS {
            let job = format!("j{i}");
            assert!(matches!(in_force.offer(&job, 1, &json(&job, 100)), Some(Ok(_))));
        }
        let refused = in_force.offer("past", 1, &json("past", 100));
        assert!(
            matches!(refused, Some(Err(SpecStoreError::TooManyJobs { ref job, limit })) if job == "past" && limit == MAX_JOBS),
            "{refused:?}"
        );
        // Room made: the same value is taken when seen again.
        in_force.remove("j0");
        assert!(matches!(in_force.offer("past", 1, &json("past", 100)), Some(Ok(SpecChange::Put(_)))));
    }
}
