//! Ownership for the application, against a model: `held_since` and
//! `is_assigned_continuously` after every install, and the change stream read while
//! generations arrive as fast as they can be installed — no change lost or reordered.

use std::time::Duration;

use proptest::prelude::*;
use steady_slice::{Assignment, Slice, SliceKey};
use steady_slicelet::{SliceChange, Slicelet};
use steady_subset::prng::SplitMix64;

/// The task the Slicelet speaks for.
const ME: u32 = 0;

/// Cut points of the key space the assignments choose from, and the keys checked: each
/// cut, the key before it and one between cuts.
const CUTS: [u64; 7] = [1 << 40, 1 << 50, 1 << 60, 1 << 61, 1 << 62, 1 << 63, u64::MAX - 7];

fn sample_keys() -> Vec<SliceKey> {
    let mut keys = vec![SliceKey(0), SliceKey(u64::MAX)];
    for c in CUTS {
        keys.extend([SliceKey(c), SliceKey(c - 1), SliceKey(c / 2 + c / 3)]);
    }
    keys
}

/// An assignment of generation `generation` from `choice`: bit `i` of the low byte keeps
/// cut `i`; the owner of slice `j` is `(choice >> (8 + 2j)) % 3`.
fn assignment(generation: u64, choice: u64) -> Assignment {
    let mut starts = vec![0u64];
    starts.extend(CUTS.iter().enumerate().filter(|(i, _)| choice >> i & 1 == 1).map(|(_, &c)| c));
    let slices = starts
        .iter()
        .enumerate()
        .map(|(j, &s)| Slice::new(SliceKey(s), vec![((choice >> (8 + 2 * j)) % 3) as u32]))
        .collect();
    Assignment::new(generation, slices).unwrap()
}

fn holds(a: &Assignment, key: SliceKey) -> bool {
    a.slice_for(key).replicas().contains(&ME)
}

/// The model: per installed generation, each sample key's `held_since` (None: not held).
fn model(history: &[Assignment], keys: &[SliceKey]) -> Vec<Vec<Option<u64>>> {
    let mut out: Vec<Vec<Option<u64>>> = Vec::new();
    for (i, a) in history.iter().enumerate() {
        let g = a.generation();
        let previous = (i > 0 && history[i - 1].generation() + 1 == g).then(|| &out[i - 1]);
        out.push(
            keys.iter()
                .enumerate()
                .map(|(k, &key)| holds(a, key).then(|| previous.and_then(|p| p[k]).unwrap_or(g)))
                .collect(),
        );
    }
    out
}

/// Generations 1, 2, ... with a skip where `skips` says, and the assignments `choices`.
fn history(choices: &[u64], skips: &[bool]) -> Vec<Assignment> {
    let mut generation = 0;
    choices
        .iter()
        .zip(skips.iter().chain(std::iter::repeat(&false)))
        .map(|(&c, &skip)| {
            generation += if skip { 2 } else { 1 };
            assignment(generation, c)
        })
        .collect()
}

/// Checks `change` against the model: each sample key is acquired, released, both or
/// neither exactly as its history between `from` and `to` says.
fn check(change: &SliceChange, history: &[Assignment], model: &[Vec<Option<u64>>], keys: &[SliceKey]) {
    let at = |g: u64| history.partition_point(|a| a.generation() < g);
    let to = at(change.to);
    for (k, &key) in keys.iter().enumerate() {
        let held_before = change.from.is_some_and(|f| holds(&history[at(f)], key));
        let kept = change.from.is_some_and(|f| model[to][k].is_some_and(|since| since <= f));
        let acquired = change.acquired.iter().any(|r| r.contains(key));
        let released = change.released.iter().any(|r| r.contains(key));
        assert_eq!(acquired, model[to][k].is_some() && !kept, "{key:?} acquired in {change:?}");
        assert_eq!(released, held_before && !kept, "{key:?} released in {change:?}");
    }
}

proptest! {
    #[test]
    fn held_since_follows_the_model_after_every_install(
        choices in prop::collection::vec(any::<u64>(), 1..40),
        skips in prop::collection::vec(prop::bool::weighted(0.15), 0..40),
    ) {
        let history = history(&choices, &skips);
        let keys = sample_keys();
        let model = model(&history, &keys);
        let slicelet = Slicelet::new(ME);
        for (i, a) in history.iter().enumerate() {
            prop_assert!(slicelet.set_assignment(a.clone()));
            // An older or equal generation changes nothing.
            prop_assert!(!slicelet.set_assignment(a.clone()));
            for (k, &key) in keys.iter().enumerate() {
                prop_assert_eq!(slicelet.held_since(key), model[i][k], "{:?} at generation {}", key, a.generation());
                prop_assert_eq!(slicelet.holds(key), Some(model[i][k].is_some()));
                let g = a.generation();
                prop_assert_eq!(slicelet.is_assigned_continuously(key, g), model[i][k].is_some());
                if let Some(since) = model[i][k].filter(|&s| s > 1) {
                    prop_assert!(!slicelet.is_assigned_continuously(key, since - 1));
                }
            }
        }
    }

    #[test]
    fn a_change_from_any_generation_to_any_later_one_is_what_the_model_says(
        choices in prop::collection::vec(any::<u64>(), 2..30),
        skips in prop::collection::vec(prop::bool::weighted(0.15), 0..30),
        from in any::<prop::sample::Index>(),
        to in any::<prop::sample::Index>(),
    ) {
        let history = history(&choices, &skips);
        let keys = sample_keys();
        let model = model(&history, &keys);
        let (mut from, mut to) = (from.index(history.len()), to.index(history.len()));
        if from > to {
            std::mem::swap(&mut from, &mut to);
        }
        // Two Slicelets: one left at `from`, one brought to `to`; the second's change
        // stream, read once at `from` and once at `to`, gives the change between them.
        let slicelet = Slicelet::new(ME);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            for a in &history[..=from] {
                slicelet.set_assignment(a.clone());
            }
            let mut changes = slicelet.slice_changes();
            // Everything is installed already: a change is there at the first poll, or
            // there is none (nothing held) and the wait ends with the timeout.
            let first = tokio::time::timeout(Duration::from_millis(50), changes.next()).await;
            if let Ok(Some(first)) = &first {
                assert_eq!((first.from, first.to), (None, history[from].generation()));
                check(first, &history, &model, &keys);
            }
            for a in &history[from + 1..=to] {
                slicelet.set_assignment(a.clone());
            }
            if to > from {
                let from_generation = Some(history[from].generation());
                let to_generation = history[to].generation();
                match tokio::time::timeout(Duration::from_millis(50), changes.next()).await {
                    Ok(Some(change)) => {
                        assert_eq!((change.from, change.to), (from_generation, to_generation));
                        check(&change, &history, &model, &keys);
                    }
                    // No change: every sample key must be untouched.
                    _ => {
                        let none = SliceChange { from: from_generation, to: to_generation, acquired: vec![], released: vec![], warming: vec![] };
                        check(&none, &history, &model, &keys);
                    }
                }
            }
        });
    }
}

/// Generations installed from another thread as fast as they come while the application
/// reads the stream: each change is exactly the change from where the last one ended,
/// generations only go up, and the last one reaches the final generation.
#[test]
fn no_change_is_lost_or_reordered_under_rapid_generation_changes() {
    for seed in 1..=3u64 {
        let mut rng = SplitMix64::new(seed);
        let mut choices: Vec<u64> = (0..3_000).map(|_| rng.next()).collect();
        // The last two differ for sure: nothing held, then everything.
        let n = choices.len();
        choices[n - 2] = 2 << 8; // one slice, owner 2
        choices[n - 1] = 0; // one slice, owner 0
        let skips: Vec<bool> = (0..n).map(|_| rng.next() % 50 == 0).collect();
        let history = history(&choices, &skips);
        let keys = sample_keys();
        let model = model(&history, &keys);
        let last = history.last().unwrap().generation();

        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let slicelet = Slicelet::new(ME);
        let mut changes = slicelet.slice_changes();
        let installer = {
            let (slicelet, history) = (slicelet.clone(), history.clone());
            std::thread::spawn(move || {
                for a in history {
                    assert!(slicelet.set_assignment(a));
                }
            })
        };
        let received = runtime.block_on(async {
            let mut received: Vec<SliceChange> = Vec::new();
            while received.last().is_none_or(|c| c.to < last) {
                let change = tokio::time::timeout(Duration::from_secs(10), changes.next())
                    .await
                    .expect("the final generation's change arrived within 10 s")
                    .expect("the slicelet lives");
                received.push(change);
            }
            received
        });
        installer.join().unwrap();
        let mut previous: Option<u64> = None;
        for change in &received {
            // Generations in which nothing changed are folded in silently, so a change may
            // start after the last one ended; it must then be exactly the change from where
            // the last one ended.
            assert!(change.from >= previous, "seed {seed}: a change starts before the last ended");
            assert!(previous.is_none_or(|p| change.to > p), "seed {seed}: generations went back");
            check(change, &history, &model, &keys);
            check(&SliceChange { from: previous, ..change.clone() }, &history, &model, &keys);
            previous = Some(change.to);
        }
        assert_eq!(previous, Some(last));
        assert!(received.len() >= 2, "seed {seed}: {} changes", received.len());
    }
}

/// The shutdown wait: a task that still holds slices waits until an assignment gives it
/// none, and returns at once when it holds none.
#[tokio::test]
async fn a_draining_task_waits_until_every_slice_it_held_has_moved() {
    let slicelet = Slicelet::new(ME);
    slicelet.set_assignment(assignment(1, 0)); // one slice, owner 0: held
    let waiting = tokio::spawn({
        let slicelet = slicelet.clone();
        async move { slicelet.wait_until_released().await }
    });
    // Generation 2 still gives it slice [0, 2^40); generation 3 moves everything away.
    slicelet.set_assignment(assignment(2, 0b1 | (0b10 << 8) | (1 << 10)));
    assert_eq!(slicelet.held_since(SliceKey(0)), Some(1), "generation 2 keeps slice [0, 2^40) on task {ME}");
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(!waiting.is_finished(), "returned while task {ME} still held a slice");
    slicelet.set_assignment(assignment(3, 1 << 8)); // one slice, owner 1
    tokio::time::timeout(Duration::from_secs(10), waiting).await.expect("released within 10 s").unwrap();
    tokio::time::timeout(Duration::from_secs(10), slicelet.wait_until_released()).await.expect("at once");
}
