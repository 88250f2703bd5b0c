//! A key prefix followed into a map of its keys: a listing, then an etcd watch from the
//! revision after it; after an error (a connection lost, a compacted revision), a listing
//! again with backoff. Small values only: each is cut to [`MAX_VALUE`] bytes.

use std::collections::BTreeMap;
use std::time::Duration;

use etcd_client::{Client, EventType, GetOptions, WatchOptions};
use tokio::sync::watch;

/// The most of a value kept, in bytes.
const MAX_VALUE: usize = 1024;

/// A key's value and its `mod_revision` (each put a new one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Entry {
    pub(super) revision: i64,
    pub(super) value: Vec<u8>,
}

/// The keys under a prefix, by name (the key without the prefix).
pub(super) type Keys = BTreeMap<String, Entry>;

/// Follows `prefix` until every receiver is dropped; at most `limit` keys are kept (the
/// first by name; the rest are ignored, with a warning). `None` until the first listing.
pub(super) fn follow(
    client: Client,
    prefix: String,
    limit: usize,
    timeout: Duration,
) -> watch::Receiver<Option<Keys>> {
    let (tx, rx) = watch::channel(None);
    tokio::spawn(async move {
        let mut failures = 0;
        loop {
            if failures > 0 {
                tokio::select! {
                    () = tokio::time::sleep(steady_etcd::watch_backoff(failures)) => {}
                    () = tx.closed() => return,
                }
            }
            tokio::select! {
                outcome = follow_once(&client, &prefix, limit, timeout, &tx) => {
                    failures += 1;
                    tracing::warn!(prefix, failures, error = %outcome, "fleet: following etcd failed; listing again");
                }
                () = tx.closed() => return,
            }
        }
    });
    rx
}

/// One listing and the watch after it, until it fails (the error).
async fn follow_once(
    client: &Client,
    prefix: &str,
    limit: usize,
    timeout: Duration,
    tx: &watch::Sender<Option<Keys>>,
) -> String {
    let mut kv = client.kv_client();
    let options = GetOptions::new().with_prefix().with_limit(limit as i64);
    let listed = match steady_etcd::bounded(timeout, "fleet list", kv.get(prefix, Some(options))).await {
        Ok(listed) => listed,
        Err(error) => return error.to_string(),
    };
    if listed.more() {
        tracing::warn!(
            prefix,
            found = listed.count(),
            limit,
            "fleet: more keys than are read; the first are kept"
        );
    }
    let mut keys: Keys = listed.kvs().iter().filter_map(|kv| entry(prefix, kv)).collect();
    tx.send_if_modified(|now| replace(now, &keys));
    let from = listed.header().map_or(0, |h| h.revision()) + 1;
    let mut watcher = client.watch_client();
    let options = WatchOptions::new().with_prefix().with_start_revision(from);
    let mut stream =
        match steady_etcd::bounded(timeout, "fleet watch", watcher.watch(prefix, Some(options))).await {
            Ok(stream) => stream,
            Err(error) => return error.to_string(),
        };
    loop {
        let response = match stream.message().await {
            Ok(Some(response)) if !response.canceled() => response,
            Ok(Some(response)) => {
                return format!("watch cancelled (compacted to {})", response.compact_revision())
            }
            Ok(None) => return "watch ended".to_owned(),
            Err(error) => return error.to_string(),
        };
        for event in response.events() {
            let Some(kv) = event.kv() else { continue };
            match event.event_type() {
                EventType::Put => {
                    if let Some((name, value)) = entry(prefix, kv) {
                        if keys.len() < limit || keys.contains_key(&name) {
                            keys.insert(name, value);
                        }
                    }
                }
                EventType::Delete => {
                    if let Some((name, _)) = entry(prefix, kv) {
                        keys.remove(&name);
                    }
                }
            }
        }
        tx.send_if_modified(|now| replace(now, &keys));
    }
}

fn replace(now: &mut Option<Keys>, keys: &Keys) -> bool {
    if now.as_ref() == Some(keys) {
        return false;
    }
    *now = Some(keys.clone());
    true
}

/// A key under `prefix` as a name and its entry (`None` for a name that is not UTF-8).
fn entry(prefix: &str, kv: &etcd_client::KeyValue) -> Option<(String, Entry)> {
    let name = kv.key().strip_prefix(prefix.as_bytes())?;
    let name = std::str::from_utf8(name).ok()?.to_owned();
    let value = kv.value()[..kv.value().len().min(MAX_VALUE)].to_vec();
    Some((name, Entry { revision: kv.mod_revision(), value }))
}
