//! `steady-lab exclusive-node` (hidden): one backend task of the checker, in a process of
//! its own so that it can be paused and killed. An exclusive Slicelet holds its leases on
//! etcd; a sampler takes a key handle on every one of a fixed set of keys it owns and
//! records, per key, each interval during which its handle stayed valid.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use steady_slice::SliceKey;
use steady_slicelet::{ExclusiveConfig, KeyHandle, Slicelet};
use steady_testing::clock::monotonic_nanos;

use super::intervals::Interval;
use crate::LabResult;

/// Arguments of `steady-lab exclusive-node`.
#[derive(Debug, Args)]
pub struct NodeArgs {
    /// The etcd endpoint (the checker puts a fault proxy here).
    #[arg(long)]
    etcd: String,
    /// The job.
    #[arg(long)]
    job: String,
    /// This task's index.
    #[arg(long)]
    task: u32,
    /// How many keys to sample, spread evenly over the key space.
    #[arg(long, default_value_t = 64)]
    keys: u32,
    /// The file intervals are appended to.
    #[arg(long)]
    out: PathBuf,
    /// The lease's TTL, seconds.
    #[arg(long, default_value_t = 2)]
    ttl: u64,
    /// How long one etcd request may take, milliseconds.
    #[arg(long, default_value_t = 500)]
    request_timeout_ms: u64,
    /// Take no bridge across a change.
    #[arg(long)]
    no_bridge: bool,
    /// The deliberately broken variant: the deadline from when a renewal's answer arrived.
    #[arg(long)]
    unsafe_deadline_from_answer: bool,
    /// Stop after this many seconds (the checker also kills it).
    #[arg(long, default_value_t = 3600)]
    seconds: u64,
}

/// Key `i` of `n`, spread over the key space.
pub(crate) fn sample_key(i: u32, n: u32) -> SliceKey {
    SliceKey((u64::MAX / u64::from(n)) * u64::from(i) + 0x1234)
}

pub(crate) fn run(args: &NodeArgs) -> LabResult {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(async {
        let client = etcd_client::Client::connect([args.etcd.clone()], None).await?;
        let mut config = ExclusiveConfig::default()
            .lease_ttl(Duration::from_secs(args.ttl))
            .request_timeout(Duration::from_millis(args.request_timeout_ms))
            .bridge(!args.no_bridge);
        if args.unsafe_deadline_from_answer {
            config = config.unsafe_deadline_from_answer();
        }
        let slicelet = Slicelet::exclusive(args.task);
        let _holder = slicelet.hold_leases(client, args.job.clone(), config)?;
        let mut out = std::fs::OpenOptions::new().create(true).append(true).open(&args.out)?;
        let keys: Vec<SliceKey> = (0..args.keys).map(|i| sample_key(i, args.keys)).collect();
        // Per key: the handle held, when it was taken (after), and the last instant a
        // check proved it valid (before the check), once one has.
        let mut open: Vec<Option<(KeyHandle, u64, Option<u64>)>> = vec![None; keys.len()];
        let stop = tokio::time::Instant::now() + Duration::from_secs(args.seconds);
        while tokio::time::Instant::now() < stop {
            for (i, key) in keys.iter().enumerate() {
                match open[i].take() {
                    Some((handle, start, end)) => {
                        let now = monotonic_nanos();
                        if handle.is_valid() {
                            open[i] = Some((handle, start, Some(now)));
                        } else if let Some(end) = end {
                            let line = Interval { key: i as u32, owner: args.task, start, end }.line();
                            writeln!(out, "{line}")?;
                        }
                    }
                    None => {
                        if let Some(handle) = slicelet.key_handle(*key) {
                            let start = monotonic_nanos();
                            open[i] = Some((handle, start, None));
                        }
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        for (i, slot) in open.iter().enumerate() {
            if let Some((_, start, Some(end))) = slot {
                writeln!(
                    out,
                    "{}",
                    Interval { key: i as u32, owner: args.task, start: *start, end: *end }.line()
                )?;
            }
        }
        Ok(())
    })
}
