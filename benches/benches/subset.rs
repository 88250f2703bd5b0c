//! Cost of computing one frontend's subset, against building and sorting the whole ring.
//!
//! Groups `subset_k20` and `subset_k100`; parameter N in {100, 10^4, 10^5, 10^6}.
//! Target: Rocksteadier under 1 µs for k = 20 at every N, and at least 100x faster than
//! `naive_ring` at N = 100,000; decimal Rocksteadier within 2x of Rocksteadier
//! (the figures: `docs/benchmarks.md#computing-one-subset`). Print the ratios with
//! `cargo run --release -p steady-benches --bin bench-ratios -- subset naive_ring`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use steady_benches::naive_ring_subset;
use steady_subset::{DecimalRocksteadier, Deterministic, Ringsteady, Rocksteadier, Subsetting};

const BACKENDS: [usize; 4] = [100, 10_000, 100_000, 1_000_000];

fn bench_subset(c: &mut Criterion, size: usize) {
    let mut group = c.benchmark_group(format!("subset_k{size}"));
    group.warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    let rocksteadier = Rocksteadier::default();
    let decimal = DecimalRocksteadier::default();
    let ringsteady = Ringsteady::new();
    let deterministic = Deterministic::default();
    // Many frontends, so the figures are not one lucky frontend's.
    let frontend = |i: u64| (i.wrapping_mul(7919) % 100_003) as usize;
    for &n in &BACKENDS {
        let mut out = Vec::with_capacity(size);
        let mut i = 0u64;
        group.bench_with_input(BenchmarkId::new("rocksteadier", n), &n, |b, &n| {
            b.iter(|| {
                i += 1;
                rocksteadier.subset_into(frontend(i), black_box(n), size, &mut out).unwrap();
                black_box(&out);
            })
        });
        group.bench_with_input(BenchmarkId::new("rocksteadier-decimal", n), &n, |b, &n| {
            b.iter(|| {
                i += 1;
                decimal.subset_into(frontend(i), black_box(n), size, &mut out).unwrap();
                black_box(&out);
            })
        });
        group.bench_with_input(BenchmarkId::new("ringsteady", n), &n, |b, &n| {
            b.iter(|| {
                i += 1;
                ringsteady.subset_into(frontend(i), black_box(n), size, &mut out).unwrap();
                black_box(&out);
            })
        });
        if n >= 1_000_000 {
            // Tens of milliseconds per call: fewer samples.
            group.sample_size(10);
        }
        group.bench_with_input(BenchmarkId::new("deterministic", n), &n, |b, &n| {
            b.iter(|| {
                i += 1;
                deterministic.subset_into(frontend(i), black_box(n), size, &mut out).unwrap();
                black_box(&out);
            })
        });
        group.bench_with_input(BenchmarkId::new("naive_ring", n), &n, |b, &n| {
            b.iter(|| {
                i += 1;
                black_box(naive_ring_subset(frontend(i), black_box(n), size))
            })
        });
        group.sample_size(100);
    }
    group.finish();
}

fn subset_k20(c: &mut Criterion) {
    bench_subset(c, 20);
}

fn subset_k100(c: &mut Criterion) {
    bench_subset(c, 100);
}

criterion_group!(benches, subset_k20, subset_k100);
criterion_main!(benches);
