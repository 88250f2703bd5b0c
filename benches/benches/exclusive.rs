//! The cost of exclusive ownership's checks on a backend (Slicer's `getSliceKeyHandle`
//! and `isAssignedContinuously`; the paper reports 153 µs and 94 µs), against the
//! eventual mode's `holds` in the same run.
//!
//! A real etcd (started as the tests start it) and a real `LeaseHolder`: task 0 of 300
//! owns 50 of 15,000 one-replica slices by the lease protocol. Then, per request, with
//! keys drawn uniformly from what task 0 owns:
//!
//! * `eventual_holds` (baseline): `Slicelet::holds` on an eventual Slicelet with the same
//!   assignment (an atomic load and a binary search over the slices);
//! * `key_handle`: `Slicelet::key_handle` on the exclusive one (an atomic load, a clock
//!   read, a binary search over the owned ranges, an `Arc` clone);
//! * `is_valid`: `KeyHandle::is_valid` on a handle taken before;
//! * `is_assigned_continuously`: `Slicelet::is_assigned_continuously(key, 1)`.
//!
//! `cargo bench -p steady-benches --bench exclusive` (needs `etcd` on the PATH, as
//! `scripts/test.sh` installs it).

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use steady_slice::guard::{guard_key, Guard};
use steady_slice::{Assignment, Slice, SliceKey};
use steady_slicelet::{ExclusiveConfig, Slicelet};
use steady_subset::prng::SplitMix64;

const SLICES: usize = 15_000;
const TASKS: usize = 300;
const KEYS: usize = 1 << 12;

fn assignment() -> Assignment {
    let step = u64::MAX / SLICES as u64;
    let slices =
        (0..SLICES).map(|i| Slice::new(SliceKey(i as u64 * step), vec![(i % TASKS) as u32])).collect();
    Assignment::new(1, slices).unwrap()
}

fn checks(c: &mut Criterion) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let etcd = steady_testing::Etcd::start().expect("the exclusive bench needs etcd on the PATH");
    let a = assignment();
    let owned: Vec<SliceKey> = {
        let mut rng = SplitMix64::new(7);
        let mut keys = Vec::with_capacity(KEYS);
        while keys.len() < KEYS {
            let key = SliceKey(rng.next());
            if a.slice_for(key).replicas() == [0] {
                keys.push(key);
            }
        }
        keys
    };
    let (exclusive, _holder) = runtime.block_on(async {
        let mut client = etcd_client::Client::connect([etcd.endpoint()], None).await.unwrap();
        let txn = etcd_client::Txn::new().and_then([
            etcd_client::TxnOp::put("/steady/jobs/bench/assignment", a.encode(), None),
            etcd_client::TxnOp::put(guard_key("/steady/jobs/", "bench"), Guard::Granted(1).encode(), None),
        ]);
        client.txn(txn).await.unwrap();
        let slicelet = Slicelet::exclusive(0);
        let holder = slicelet.hold_leases(client, "bench", ExclusiveConfig::default()).unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while slicelet.holds(owned[0]) != Some(true) {
            assert!(tokio::time::Instant::now() < deadline, "task 0 never came to own its slices");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        (slicelet, holder)
    });
    let eventual = Slicelet::new(0);
    eventual.set_assignment(a);
    let handles: Vec<_> = owned.iter().map(|&k| exclusive.key_handle(k).expect("owned")).collect();

    let mut group = c.benchmark_group("exclusive_checks");
    let mut i = 0;
    let mut next = move || {
        i = (i + 1) & (KEYS - 1);
        i
    };
    group.bench_function("eventual_holds", |b| b.iter(|| black_box(eventual.holds(owned[next()]))));
    group.bench_function("key_handle", |b| b.iter(|| black_box(exclusive.key_handle(owned[next()]))));
    group.bench_function("is_valid", |b| b.iter(|| black_box(handles[next()].is_valid())));
    group.bench_function("is_assigned_continuously", |b| {
        b.iter(|| black_box(exclusive.is_assigned_continuously(owned[next()], 1)))
    });
    group.finish();
    drop(runtime);
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = checks
}
criterion_main!(benches);
