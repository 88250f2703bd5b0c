//! Assignments: the codec, JSON, and key lookup, over random valid and invalid inputs.

use proptest::prelude::*;
use steady_slice::{Assignment, AssignmentError, Slice, SliceKey, MAX_TASK};

/// Valid assignments: any generation from 1, 1..200 slices, the first at 0, starts
/// strictly increasing, 1..6 distinct tasks each; in even generations the last 0..2 of
/// a slice's tasks are warming instead of replicas (a handover: wire version 2).
fn any_assignment() -> impl Strategy<Value = Assignment> {
    (
        1u64..,
        prop::collection::btree_set(1u64.., 0..200),
        prop::collection::vec((prop::collection::btree_set(0u32..=MAX_TASK, 1..6), 0usize..3), 200),
    )
        .prop_map(|(generation, starts, tasks)| {
            let starts: Vec<u64> = std::iter::once(0).chain(starts).collect();
            let slices = starts
                .iter()
                .zip(tasks)
                .map(|(&start, (t, warming))| {
                    let mut replicas: Vec<u32> = t.into_iter().collect();
                    let keep = if generation % 2 == 0 {
                        replicas.len().saturating_sub(warming).max(1)
                    } else {
                        replicas.len()
                    };
                    let warming = replicas.split_off(keep);
                    Slice::new(SliceKey(start), replicas).with_warming(warming)
                })
                .collect();
            Assignment::new(generation, slices).expect("valid by construction")
        })
}

/// The slice holding `key`, by scanning every slice's range.
fn linear_lookup(a: &Assignment, key: SliceKey) -> Vec<usize> {
    let s = a.slices();
    (0..s.len()).filter(|&i| s[i].start <= key && s.get(i + 1).is_none_or(|next| key < next.start)).collect()
}

/// Per key, the sorted owners in `a`, for the keys in `probes`.
fn owners_at(a: &Assignment, key: SliceKey) -> Vec<u32> {
    let mut r = a.slice_for(key).replicas().to_vec();
    r.sort_unstable();
    r
}

/// Assignments on a small key space (starts below 64) with replicas drawn from 4
/// tasks, so that two random ones share boundaries and owners often.
fn small_assignment() -> impl Strategy<Value = Assignment> {
    (
        prop::collection::btree_set(1u64..64, 0..8),
        prop::collection::vec(prop::collection::btree_set(0u32..4, 1..3), 8),
    )
        .prop_map(|(starts, replicas)| {
            let starts: Vec<u64> = std::iter::once(0).chain(starts).collect();
            let slices = starts
                .iter()
                .zip(replicas)
                .map(|(&start, r)| Slice::new(SliceKey(start), r.into_iter().rev().collect::<Vec<_>>()))
                .collect();
            Assignment::new(1, slices).expect("valid by construction")
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn the_diff_holds_exactly_the_keys_whose_owners_change(a in small_assignment(), b in small_assignment()) {
        let diff = a.diff(&b);
        // Keys 0..=64 and the top of the key space, where the last slices run.
        for key in (0..=64).chain([u64::MAX]).map(SliceKey) {
            let changed = diff.changed().iter().any(|r| r.contains(key));
            prop_assert_eq!(changed, owners_at(&a, key) != owners_at(&b, key), "key {}", key);
        }
        let covered: f64 = diff.changed().iter().map(|r| r.fraction()).sum();
        prop_assert!((diff.key_churn() - covered).abs() < 1e-12);
        // Ranges are sorted and merged: no two touch.
        for w in diff.changed().windows(2) {
            prop_assert!(w[0].end().is_some_and(|e| e < w[1].start()));
        }
        let back = b.diff(&a);
        prop_assert_eq!(back.changed(), diff.changed());
    }

    #[test]
    fn a_tasks_ranges_are_the_keys_that_name_it(a in small_assignment(), task in 0u32..4) {
        let ranges: Vec<_> = a.slices_of(task).collect();
        for key in (0..=64).chain([u64::MAX]).map(SliceKey) {
            let held = ranges.iter().any(|r| r.contains(key));
            prop_assert_eq!(held, a.slice_for(key).replicas().contains(&task));
        }
    }

    #[test]
    fn decoding_an_encoding_gives_the_assignment_back(a in any_assignment()) {
        prop_assert_eq!(Assignment::decode(&a.encode()), Ok(a.clone()));
        #[cfg(feature = "serde")]
        {
            let json = serde_json::to_string(&a).unwrap();
            prop_assert_eq!(serde_json::from_str::<Assignment>(&json).unwrap(), a);
        }
    }

    #[test]
    fn every_key_is_in_exactly_one_slice_and_lookup_agrees_with_a_scan(
        a in any_assignment(),
        keys in prop::collection::vec(any::<u64>(), 50),
    ) {
        // Random keys, and every boundary: each start, the key before it, the extremes.
        let boundaries = a.slices().iter().flat_map(|s| [s.start.get(), s.start.get().saturating_sub(1)]);
        for key in keys.into_iter().chain(boundaries).chain([0, u64::MAX]).map(SliceKey) {
            let holders = linear_lookup(&a, key);
            prop_assert_eq!(holders.len(), 1, "key {} in {:?}", key, holders);
            prop_assert_eq!(a.slice_index(key), holders[0]);
        }
    }

    #[test]
    fn corrupted_bytes_decode_to_a_valid_assignment_or_a_typed_error(
        a in any_assignment(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut bytes = a.encode();
        for (at, value) in flips {
            let i = at.index(bytes.len());
            bytes[i] = value;
        }
        bytes.truncate(cut.index(bytes.len() + 1));
        if let Ok(decoded) = Assignment::decode(&bytes) {
            // Whatever decodes is valid and re-encodes to the same bytes.
            prop_assert_eq!(decoded.encode(), bytes);
        }
    }
}

#[cfg(feature = "serde")]
#[test]
fn invalid_json_is_rejected_with_the_first_problem() {
    let cases = [
        (r#"{"generation":0,"slices":[{"start":0,"replicas":[1]}]}"#, "generation 0 means"),
        (r#"{"generation":1,"slices":[]}"#, "no slices"),
        (r#"{"generation":1,"slices":[{"start":5,"replicas":[1]}]}"#, "not 0"),
        (r#"{"generation":1,"slices":[{"start":0,"replicas":[1]},{"start":0,"replicas":[2]}]}"#, "not after"),
        (r#"{"generation":1,"slices":[{"start":0,"replicas":[]}]}"#, "no replicas"),
        (r#"{"generation":1,"slices":[{"start":0,"replicas":[3,3]}]}"#, "twice"),
    ];
    for (json, problem) in cases {
        let err = serde_json::from_str::<Assignment>(json).unwrap_err().to_string();
        assert!(err.contains(problem), "{json}: {err}");
    }
    let ok: Assignment =
        serde_json::from_str(r#"{"generation":2,"slices":[{"start":0,"replicas":[1,2]}]}"#).unwrap();
    assert_eq!(ok, Assignment::single(2, vec![1, 2]).unwrap());
}

#[test]
fn a_slice_without_replicas_is_named() {
    assert_eq!(Assignment::single(1, vec![]), Err(AssignmentError::NoReplicas { slice: 0 }));
}
