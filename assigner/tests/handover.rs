//! The warming step of a handover, over random pairs of assignments and task states:
//! every key keeps the owners it had that are still up, and warms exactly the owners it
//! is about to gain.

use proptest::prelude::*;
use steady_assigner::{warming_step, Assignment, SliceKey, TaskState, Tasks};
use steady_slice::Slice;

/// Assignments over starts below 64 and replicas from 5 tasks, so that two random ones
/// share boundaries and owners often.
fn small_assignment(generation: u64) -> impl Strategy<Value = Assignment> {
    (
        prop::collection::btree_set(1u64..64, 0..8),
        prop::collection::vec(prop::collection::btree_set(0u32..5, 1..3), 8),
    )
        .prop_map(move |(starts, replicas)| {
            let starts: Vec<u64> = std::iter::once(0).chain(starts).collect();
            let slices = starts
                .iter()
                .zip(replicas)
                .map(|(&s, r)| Slice::new(SliceKey(s), r.into_iter().collect::<Vec<_>>()))
                .collect();
            Assignment::new(generation, slices).expect("valid by construction")
        })
}

fn any_tasks() -> impl Strategy<Value = Tasks> {
    prop::collection::vec(0u8..3, 5).prop_map(|states| {
        let state = |s| match s {
            0 => TaskState::Serving,
            1 => TaskState::Draining,
            _ => TaskState::Gone,
        };
        Tasks::new(states.into_iter().enumerate().map(|(t, s)| (t as u32, state(s)))).unwrap()
    })
}

fn sorted(mut v: Vec<u32>) -> Vec<u32> {
    v.sort_unstable();
    v
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn every_key_keeps_its_live_owners_and_warms_the_ones_it_gains(
        previous in small_assignment(3),
        target in small_assignment(4),
        tasks in any_tasks(),
    ) {
        let up = |t: &u32| matches!(tasks.state(*t), TaskState::Serving | TaskState::Draining);
        let step = warming_step(&previous, &target, &tasks, 4);
        let mut gains = false;
        for k in 0..70u64 {
            let key = SliceKey(k);
            let old: Vec<u32> = previous.slice_for(key).replicas().iter().copied().filter(up).collect();
            let new = target.slice_for(key).replicas();
            let warming: Vec<u32> = new.iter().copied().filter(|t| !old.contains(t)).collect();
            gains |= !old.is_empty() && !warming.is_empty();
            if let Some(step) = &step {
                let got = step.slice_for(key);
                if old.is_empty() {
                    prop_assert_eq!(sorted(got.replicas().to_vec()), sorted(new.to_vec()), "key {}", k);
                    prop_assert!(got.warming().is_empty());
                } else {
                    prop_assert_eq!(sorted(got.replicas().to_vec()), sorted(old.clone()), "key {}", k);
                    prop_assert_eq!(sorted(got.warming().to_vec()), sorted(warming), "key {}", k);
                }
            }
        }
        // A step exactly when some key has an owner to warm from and an owner to gain.
        prop_assert_eq!(step.is_some(), gains);
        if let Some(step) = &step {
            prop_assert_eq!(step.generation(), 4);
            // Merged: no two neighbours alike.
            for w in step.slices().windows(2) {
                prop_assert!(w[0].replicas() != w[1].replicas() || w[0].warming() != w[1].warming());
            }
        }
    }
}
