//! A chaos test in the style of Dicer's: 1,000 seeded rounds of weighted-move over a job of
//! 8 tasks of which 6 to 8 serve, each round with a fresh random load map, and half of the
//! rounds with one hot key carrying half of the load. Each round starts from the previous
//! round's assignment, as a live assigner does. Asserts frozen quantile bounds on the
//! relative excess of the busiest task, `(max - mean) / mean`, after each run.

mod common;

use steady_assigner::{Assigner, Load, ReplicaLimits, RunInput, SliceKey, TaskState, Tasks, WeightedMove};

/// SplitMix64: a seeded, dependency-free generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

#[test]
fn weighted_move_keeps_the_busiest_task_near_the_mean_through_chaos() {
    let mut rng = Rng(0x5EED_D1CE);
    let limits = ReplicaLimits::new(1, 4).unwrap();
    let wm = WeightedMove::default();
    let hot_keys: Vec<u64> = (0..4).map(|_| rng.next()).collect();
    let mut previous = None;
    let mut excess = Vec::with_capacity(1000);
    let mut excess_hot = Vec::new();
    for _ in 0..1000 {
        // 6 to 8 of the 8 tasks serve; the others drain or are gone.
        let serving = 6 + rng.below(3) as usize;
        let mut order: Vec<u32> = (0..8).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let tasks = Tasks::new(order.iter().enumerate().map(|(i, &t)| {
            let state = if i < serving {
                TaskState::Serving
            } else if rng.below(2) == 0 {
                TaskState::Draining
            } else {
                TaskState::Gone
            };
            (t, state)
        }))
        .unwrap();
        // 300 random keys with skewed loads; half the time a hot key with half of the load.
        let mut points: Vec<(SliceKey, f64)> =
            (0..300).map(|_| (SliceKey(rng.next()), 100.0 * rng.unit().powi(3))).collect();
        let hot = rng.below(2) == 0;
        if hot {
            let rest: f64 = points.iter().map(|p| p.1).sum();
            points.push((SliceKey(hot_keys[rng.below(4) as usize]), rest));
        }
        let load = Load::from_points(points).unwrap();
        let run = wm.assign(&RunInput {
            previous: previous.as_ref(),
            tasks: &tasks,
            load: &load,
            replicas: limits,
            placement: steady_assigner::Placement::none(),
        });
        let run = run.unwrap();
        common::check_placement(&run.assignment, &tasks, limits);
        let e = run.report.imbalance_after - 1.0;
        excess.push(e);
        if hot {
            excess_hot.push(e);
        }
        previous = Some(run.assignment);
    }
    excess.sort_by(f64::total_cmp);
    excess_hot.sort_by(f64::total_cmp);
    let q = |s: &[f64]| [0.5, 0.9, 0.99, 1.0].map(|p| quantile(s, p));
    let (all, with_hot) = (q(&excess), q(&excess_hot));
    println!("all rounds p50/p90/p99/max: {all:?}");
    println!("hot rounds p50/p90/p99/max: {with_hot:?}");
    // Frozen bounds. Measured (debug and release alike; the run is deterministic):
    // all rounds p50 0.0004, p90 0.082, p99 0.336, max 0.510; rounds with the hot key
    // p50 0.003, p90 0.125. (Before displacing moves and splits under suppression:
    // p90 0.109, p99 0.356, max 0.592, hot p90 0.167.)
    // * p50: with 300 keys over 6-8 tasks at 50-150 slices per task, a typical run ends
    //   nearly balanced, even with a fresh load map, within its 9% budget.
    // * p90: the rounds after a task leaves (its slices land where phase 1 puts them) or
    //   the hot key changes: 9% of the key space is not always enough to finish. With
    //   six tasks and the hot key on four replicas (1/8 of the load each, the mean is 1/6)
    //   a residual excess of 1/6 is common; displacing moves (weighted_move/moves.rs)
    //   clear part of it.
    // * p99 and max: a hot key seen for the first time sits in an ordinary slice; splits
    //   come last in a run, so this run can only replicate or move the whole slice, and
    //   the next run finishes the job.
    // The p90, p99 and max bounds leave about 30% headroom over the measurements, and p50
    // is held at 1% (measured 0.04%), so a change of arithmetic passes and a regression
    // that widens the tail or unbalances the typical round does not.
    assert!(all[0] <= 0.01, "p50 {all:?}");
    assert!(all[1] <= 0.11, "p90 {all:?}");
    assert!(all[2] <= 0.44, "p99 {all:?}");
    assert!(all[3] <= 0.67, "max {all:?}");
    assert!(with_hot[0] <= 0.02 && with_hot[1] <= 0.17, "hot rounds {with_hot:?}");
}
