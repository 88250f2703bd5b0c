//! `steady-lab exclusive-mover` (hidden): a scripted Assigner for the checker. It
//! campaigns for the job on etcd like the Assigner service, and every `--every-ms` moves
//! about a quarter of the slices (and every slice of a task whose hold is gone) to random
//! live tasks, through the store's exclusive write: the same protocol steps the Assigner
//! service takes, at a pace a load-driven Assigner would not keep up.

use std::time::Duration;

use clap::Args;
use etcd_client::GetOptions;
use steady_slice::guard::holds_prefix;
use steady_slice::{Assignment, Slice, SliceKey};
use steady_slicer::store::{AssignmentStore, EtcdConfig, EtcdStore, StoreError, DEFAULT_KEY_PREFIX};
use steady_subset::prng::SplitMix64;

use crate::LabResult;

/// Slices of the checker's assignments.
const SLICES: u64 = 16;

/// Arguments of `steady-lab exclusive-mover`.
#[derive(Debug, Args)]
pub struct MoverArgs {
    /// The etcd endpoint.
    #[arg(long)]
    etcd: String,
    /// The job.
    #[arg(long)]
    job: String,
    /// Backend tasks 0..N.
    #[arg(long)]
    tasks: u32,
    /// Time between changes, milliseconds.
    #[arg(long, default_value_t = 300)]
    every_ms: u64,
    /// This candidate's name.
    #[arg(long)]
    candidate: String,
    /// Stop after this many seconds.
    #[arg(long, default_value_t = 3600)]
    seconds: u64,
}

pub(crate) fn run(args: &MoverArgs) -> LabResult {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    runtime.block_on(async {
        let config = EtcdConfig::new([args.etcd.clone()])
            .lease_ttl(Duration::from_secs(2))
            .request_timeout(Duration::from_secs(1))
            .recall_timeout(Duration::from_secs(3));
        let store = EtcdStore::connect(config).await?;
        let mut client = etcd_client::Client::connect([args.etcd.clone()], None).await?;
        let mut rng = SplitMix64::new(u64::from(std::process::id()));
        let stop = tokio::time::Instant::now() + Duration::from_secs(args.seconds);
        while tokio::time::Instant::now() < stop {
            let Ok(leadership) = store.campaign(&args.job, &args.candidate).await else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            while leadership.is_held() && tokio::time::Instant::now() < stop {
                tokio::time::sleep(Duration::from_millis(args.every_ms)).await;
                let Ok(snapshot) = store.read(&args.job).await else { continue };
                let live = live_tasks(&mut client, &args.job, args.tasks).await;
                let next = next_assignment(snapshot.assignment(), &live, &mut rng);
                match store.write_exclusive(&leadership, &snapshot, &next).await {
                    Ok(_)
                    | Err(
                        StoreError::Conflict | StoreError::RecallPending { .. } | StoreError::Unavailable(_),
                    ) => {}
                    Err(StoreError::NotLeader) => break,
                    Err(error) => eprintln!("exclusive-mover: {error}"),
                }
            }
        }
        Ok(())
    })
}

/// The tasks with a hold in etcd (all of them when none has one yet).
async fn live_tasks(client: &mut etcd_client::Client, job: &str, tasks: u32) -> Vec<u32> {
    let prefix = holds_prefix(DEFAULT_KEY_PREFIX, job);
    let mut live: Vec<u32> =
        match client.get(prefix.clone(), Some(GetOptions::new().with_prefix().with_keys_only())).await {
            Ok(response) => response
                .kvs()
                .iter()
                .filter_map(|kv| kv.key_str().ok()?.strip_prefix(&prefix)?.split('/').next()?.parse().ok())
                .filter(|&t| t < tasks)
                .collect(),
            Err(_) => Vec::new(),
        };
    live.sort_unstable();
    live.dedup();
    if live.is_empty() {
        live = (0..tasks).collect();
    }
    live
}

/// The previous assignment with a quarter of its slices, and every slice of a task not
/// live, moved to random live tasks; one replica each.
fn next_assignment(previous: Option<&Assignment>, live: &[u32], rng: &mut SplitMix64) -> Assignment {
    let generation = previous.map_or(1, |a| a.generation() + 1);
    let step = u64::MAX / SLICES;
    let slices = (0..SLICES)
        .map(|i| {
            let owner = previous.map(|a| a.slice_for(SliceKey(i * step)).replicas()[0]);
            let owner = match owner {
                Some(o) if live.contains(&o) && rng.below(4) != 0 => o,
                _ => live[rng.below(live.len() as u64) as usize],
            };
            Slice::new(SliceKey(i * step), vec![owner])
        })
        .collect();
    Assignment::new(generation, slices).expect("evenly spaced slices with one owner each")
}
