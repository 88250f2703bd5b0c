//! [`EtcdSpecs`]: job specs on etcd, under an assignment store's key prefix.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, GetOptions, GetResponse, Txn, TxnOp, TxnOpResponse};

use super::{
    checked_document, document, JobConfig, JobConfigError, RejectedSpec, SpecListing, SpecStoreError,
    SpecWatch, MAX_JOBS, SPECS_SEGMENT,
};
use crate::store::{EtcdConfig, EtcdStore};

mod watch;

/// Keys per page of a listing: with values of up to etcd's request limit (1.5 MiB by
/// default; ours are at most 64 KiB, others' are refused unread but still received), a
/// page stays under [`MAX_RESPONSE_BYTES`].
const PAGE: i64 = 32;
/// The largest response a listing or a watch accepts from etcd (tonic's default is
/// 4 MiB, less than a page of values at etcd's request limit).
const MAX_RESPONSE_BYTES: usize = 64 << 20;

/// Job specs on etcd: job `J`'s spec is the key `<prefix>.specs/J` (see
/// [`super::SPECS_SEGMENT`]) under an [`EtcdStore`]'s key prefix (`/steady/jobs/` by
/// default), its value the JSON document of [`JobConfig`]. So the store's users and
/// roles cover it, and the store's connection (TLS, client certificate, user) serves it.
///
/// * `put` validates, then writes the key (a new job only while fewer than
///   [`MAX_JOBS`] are stored: a count, then a put, so two instances' puts may race past
///   the bound by one each; a watch holds no more than the bound whatever is stored).
/// * A listing reads the prefix in pages of 32 keys at one revision.
/// * A watch lists the prefix, then follows it with an etcd watch from the revision
///   after the listing; after an error (the connection, a compacted revision) it lists
///   again (and says what changed meanwhile: removals included), with backoff (50 ms
///   doubling to 2 s). A value that does not parse or validate is refused once per
///   revision, the job's last good spec staying in force; a deleted key removes its job.
#[derive(Clone)]
pub struct EtcdSpecs {
    /// Shared: an etcd client is a few KiB, and a `SpecStore` is cloned into tasks.
    client: Arc<Client>,
    /// `<store prefix>.specs/`.
    prefix: String,
    timeout: Duration,
}

impl fmt::Debug for EtcdSpecs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdSpecs")
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl EtcdSpecs {
    /// The specs under the prefix of `store`, on its connection.
    pub fn of(store: &EtcdStore) -> Self {
        Self {
            client: Arc::new(store.client().clone()),
            prefix: format!("{}{SPECS_SEGMENT}/", store.prefix()),
            timeout: store.timeout(),
        }
    }

    /// Connects as [`EtcdStore::connect`] does (the same settings, checks and errors)
    /// and keeps the specs under `config`'s prefix.
    ///
    /// # Errors
    ///
    /// [`SpecStoreError::Store`] with [`EtcdStore::connect`]'s error.
    pub async fn connect(config: EtcdConfig) -> Result<Self, SpecStoreError> {
        let store = EtcdStore::connect(config).await.map_err(SpecStoreError::Store)?;
        Ok(Self::of(&store))
    }

    /// The prefix of the spec keys: `<store prefix>.specs/`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The key of `job`'s spec.
    pub fn key(&self, job: &str) -> String {
        format!("{}{job}", self.prefix)
    }

    /// Writes `config` (see [`super::SpecStore::put`]).
    ///
    /// # Errors
    ///
    /// As [`super::SpecStore::put`].
    pub async fn put(&self, config: &JobConfig) -> Result<(), SpecStoreError> {
        let document = checked_document(config).await?;
        let key = self.key(&config.job);
        let mut kv = self.client.kv_client();
        // Replace an existing spec at once; else count the stored ones first.
        let replace = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Greater, 0)])
            .and_then([TxnOp::put(key.as_str(), document.as_str(), None)])
            .or_else([TxnOp::get(
                self.prefix.as_str(),
                Some(GetOptions::new().with_prefix().with_count_only()),
            )]);
        let response = bounded(self.timeout, "spec put", kv.txn(replace)).await?;
        if response.succeeded() {
            return Ok(());
        }
        let stored = match response.op_responses().into_iter().next() {
            Some(TxnOpResponse::Get(get)) => get.count(),
            _ => 0,
        };
        if stored >= MAX_JOBS as i64 {
            return Err(SpecStoreError::too_many_jobs(&config.job));
        }
        bounded(self.timeout, "spec put", kv.put(key, document, None)).await?;
        Ok(())
    }

    /// `job`'s spec (see [`super::SpecStore::get`]).
    ///
    /// # Errors
    ///
    /// As [`super::SpecStore::get`].
    pub async fn get(&self, job: &str) -> Result<Option<JobConfig>, SpecStoreError> {
        check_job(job)?;
        let mut kv = self.client.kv_client().max_decoding_message_size(MAX_RESPONSE_BYTES);
        let response = bounded(self.timeout, "spec get", kv.get(self.key(job), None)).await?;
        let Some(kv) = response.kvs().first() else { return Ok(None) };
        match read_value(job, kv.value()) {
            Ok(config) => Ok(Some(config)),
            Err(error) => Err(SpecStoreError::Rejected(RejectedSpec { job: job.to_owned(), error })),
        }
    }

    /// The last valid spec `job`'s key held before `revision` (where it holds a value
    /// that is not one), looked for in etcd's history of the key: at most
    /// [`LOOK_BACK`] older values, none before the key was created or compacted away.
    /// So an instance that starts while a job's stored value is bad serves the spec the
    /// instances that saw it before have in force, and they agree on the set of jobs.
    pub(super) async fn last_good(&self, job: &str, mut revision: i64) -> Option<(i64, JobConfig)> {
        let mut kv = self.client.kv_client().max_decoding_message_size(MAX_RESPONSE_BYTES);
        for _ in 0..LOOK_BACK {
            let options = GetOptions::new().with_revision(revision - 1);
            // An error (compacted, unreachable): no last good spec known.
            let response =
                bounded(self.timeout, "spec history", kv.get(self.key(job), Some(options))).await.ok()?;
            let older = response.kvs().first()?;
            if let Ok(config) = read_value(job, older.value()) {
                return Some((older.mod_revision(), config));
            }
            revision = older.mod_revision();
        }
        None
    }

    /// Every stored spec (see [`super::SpecStore::list`]).
    ///
    /// # Errors
    ///
    /// As [`super::SpecStore::list`].
    pub async fn list(&self) -> Result<SpecListing, SpecStoreError> {
        let mut listing = SpecListing::default();
        self.list_pages(|job, _, value| {
            match job.and_then(|job| read_value(&job, value).map_err(|e| (job, e))) {
                Ok(config) => listing.specs.push(config),
                Err((job, error)) => listing.rejected.push(RejectedSpec { job, error }),
            }
        })
        .await?;
        Ok(listing)
    }

    /// Removes `job`'s spec (see [`super::SpecStore::delete`]).
    ///
    /// # Errors
    ///
    /// As [`super::SpecStore::delete`].
    pub async fn delete(&self, job: &str) -> Result<bool, SpecStoreError> {
        check_job(job)?;
        let mut kv = self.client.kv_client();
        let response = bounded(self.timeout, "spec delete", kv.delete(self.key(job), None)).await?;
        Ok(response.deleted() > 0)
    }

    /// Follows the specs (see the type's documentation and [`SpecWatch`]).
    pub fn watch(&self) -> SpecWatch {
        watch::follow(self.clone())
    }

    /// Reads every spec key at one revision, in pages, calling `visit` with each key's
    /// job (or its lossy name and why it names none), revision and value; returns the
    /// revision read at.
    async fn list_pages(
        &self,
        mut visit: impl FnMut(Result<String, (String, super::DocumentError)>, i64, &[u8]),
    ) -> Result<i64, SpecStoreError> {
        let mut kv = self.client.kv_client().max_decoding_message_size(MAX_RESPONSE_BYTES);
        let end = prefix_end(self.prefix.as_bytes());
        let first = GetOptions::new().with_range(end.clone()).with_limit(PAGE);
        let mut response: GetResponse =
            bounded(self.timeout, "spec list", kv.get(self.prefix.as_str(), Some(first))).await?;
        let found = usize::try_from(response.count()).unwrap_or(usize::MAX);
        if found > MAX_JOBS {
            return Err(SpecStoreError::TooManySpecs { found, limit: MAX_JOBS });
        }
        let revision = response.header().map_or(0, |h| h.revision());
        loop {
            for kv in response.kvs() {
                visit(self.job_of(kv.key()), kv.mod_revision(), kv.value());
            }
            let Some(last) = response.kvs().last().filter(|_| response.more()) else { break };
            let mut after = last.key().to_vec();
            after.push(0);
            let next = GetOptions::new().with_range(end.clone()).with_limit(PAGE).with_revision(revision);
            response = bounded(self.timeout, "spec list", kv.get(after, Some(next))).await?;
        }
        Ok(revision)
    }

    /// The job a spec key names, or its lossy name and why it names none.
    fn job_of(&self, key: &[u8]) -> Result<String, (String, super::DocumentError)> {
        let name = key.strip_prefix(self.prefix.as_bytes()).unwrap_or(key);
        match std::str::from_utf8(name) {
            Ok(job) => Ok(job.to_owned()),
            Err(_) => {
                let error = JobConfigError::new("job", "UTF-8 (the key is not)");
                Err((String::from_utf8_lossy(name).into_owned(), super::DocumentError::Invalid(error)))
            }
        }
    }
}

/// How many older values of a key [`EtcdSpecs::last_good`] reads at most.
const LOOK_BACK: usize = 16;

/// A stored value as `job`'s spec (a value above [`super::MAX_SPEC_BYTES`] refused
/// unread).
fn read_value(job: &str, value: &[u8]) -> Result<JobConfig, super::DocumentError> {
    document::from_json_for(job, value)
}

/// A name `get` and `delete` take: a job's (`put` validates the whole spec).
fn check_job(job: &str) -> Result<(), SpecStoreError> {
    let probe = JobConfig::new(job, super::TaskSource::Count(1));
    match probe.validate() {
        Err(error) if error.field == "job" => Err(SpecStoreError::Invalid { job: job.to_owned(), error }),
        _ => Ok(()),
    }
}

/// The end of the key range of `prefix` (etcd's `range_end` for a prefix).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // A prefix of 0xff bytes only: every key after it (etcd's "\0").
    vec![0]
}

/// One etcd request within `timeout`, as a [`SpecStoreError`].
async fn bounded<T>(
    timeout: Duration,
    what: &'static str,
    request: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, SpecStoreError> {
    steady_etcd::bounded(timeout, what, request).await.map_err(SpecStoreError::unavailable)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_range_of_a_prefix_ends_past_its_last_byte() {
        assert_eq!(prefix_end(b"/steady/jobs/.specs/"), b"/steady/jobs/.specs0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
    }

    #[test]
    fn get_and_delete_refuse_names_no_spec_can_have() {
        assert!(check_job("users").is_ok());
        for bad in ["", ".specs", ".specs/users"] {
            let refused = check_job(bad);
            assert!(
                matches!(refused, Err(SpecStoreError::Invalid { ref error, .. }) if error.field == "job"),
                "{bad:?}"
            );
        }
    }
}
