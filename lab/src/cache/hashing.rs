//! The two hashing strategies as assignments, so that the balancer routes by them as it
//! routes by Slicer's: static hashing (the key space cut into one equal range per task of
//! the configured job, whatever their state) and consistent hashing (a ring of virtual
//! nodes over the tasks that serve, rebuilt when one drains or returns).

use steady_assigner::Tasks;
use steady_slice::{Assignment, Slice, SliceKey};

/// Points per task on the consistent-hashing ring.
pub(crate) const VIRTUAL_NODES: usize = 100;

/// Static hashing over `tasks` tasks: task `i` owns the `i`-th of `tasks` equal ranges of
/// the key space (the range form of `hash(key) mod N`). It never changes: a task that
/// drains keeps its keys, and the balancer's fallback serves them elsewhere meanwhile.
pub(crate) fn static_hashing(tasks: u32) -> Assignment {
    let tasks = tasks.max(1);
    let width = u64::MAX / u64::from(tasks);
    let slices = (0..tasks).map(|t| Slice::new(SliceKey(u64::from(t) * width), vec![t])).collect();
    Assignment::new(1, slices).expect("equal ranges from 0 are a valid assignment")
}

/// Consistent hashing over the tasks of `tasks` that serve, as generation `generation`:
/// each task has [`VIRTUAL_NODES`] points on the ring (the key hash of `task-<t>-<v>`), and
/// a key belongs to the first point at or after it, wrapping past the end. `None` when no
/// task serves.
pub(crate) fn consistent_hashing(tasks: &Tasks, generation: u64) -> Option<Assignment> {
    let mut points: Vec<(u64, u32)> = tasks
        .serving_ids()
        .into_iter()
        .flat_map(|t| (0..VIRTUAL_NODES).map(move |v| (SliceKey::of(format!("task-{t}-{v}")).0, t)))
        .collect();
    if points.is_empty() {
        return None;
    }
    points.sort_unstable();
    points.dedup_by_key(|p| p.0);
    // Range [0, p0] belongs to p0's task, (p_{i-1}, p_i] to p_i's, (p_last, MAX] wraps to p0's.
    let mut slices = vec![Slice::new(SliceKey::MIN, vec![points[0].1])];
    let owners = points.iter().skip(1).map(|p| p.1).chain(std::iter::once(points[0].1));
    for (&(point, _), owner) in points.iter().zip(owners) {
        if point == u64::MAX {
            break;
        }
        if slices.last().is_some_and(|s| s.replicas()[0] == owner) {
            continue;
        }
        slices.push(Slice::new(SliceKey(point + 1), vec![owner]));
    }
    Some(Assignment::new(generation, slices).expect("a ring's arcs are a valid assignment"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use steady_assigner::TaskState;

    fn owner(a: &Assignment, key: u64) -> u32 {
        a.slice_for(SliceKey(key)).replicas()[0]
    }

    fn shares(a: &Assignment, tasks: u32) -> Vec<f64> {
        let mut share = vec![0.0; tasks as usize];
        for i in 0..a.slices().len() {
            share[a.slices()[i].replicas()[0] as usize] += a.range(i).fraction();
        }
        share
    }

    #[test]
    fn static_hashing_gives_each_task_an_equal_range() {
        let a = static_hashing(8);
        for s in shares(&a, 8) {
            assert!((s - 0.125).abs() < 1e-9, "{s}");
        }
        assert_eq!(owner(&a, 0), 0);
        assert_eq!(owner(&a, u64::MAX), 7);
    }

    #[test]
    fn the_ring_follows_its_points_and_wraps() {
        let tasks = Tasks::serving(0..8).unwrap();
        let a = consistent_hashing(&tasks, 3).unwrap();
        assert_eq!(a.generation(), 3);
        let mut points: Vec<(u64, u32)> = (0..8u32)
            .flat_map(|t| (0..VIRTUAL_NODES).map(move |v| (SliceKey::of(format!("task-{t}-{v}")).0, t)))
            .collect();
        points.sort_unstable();
        // A point belongs to its own task; the key after it to the next point's task.
        for w in points.windows(2) {
            assert_eq!(owner(&a, w[0].0), w[0].1);
            assert_eq!(owner(&a, w[0].0 + 1), w[1].1);
        }
        assert_eq!(owner(&a, u64::MAX), points[0].1, "past the last point wraps to the first");
        // 100 virtual nodes spread 8 tasks within a factor of 1.5 of the mean.
        for s in shares(&a, 8) {
            assert!(s > 0.125 / 1.5 && s < 0.125 * 1.5, "{s}");
        }
    }

    #[test]
    fn a_draining_task_moves_only_its_own_keys() {
        let all = Tasks::serving(0..8).unwrap();
        let drained =
            Tasks::new((0..8).map(|t| (t, if t == 5 { TaskState::Draining } else { TaskState::Serving })))
                .unwrap();
        let (a, b) = (consistent_hashing(&all, 1).unwrap(), consistent_hashing(&drained, 2).unwrap());
        let mut rng = steady_subset::prng::SplitMix64::new(7);
        for _ in 0..10_000 {
            let key = rng.next();
            let (before, after) = (owner(&a, key), owner(&b, key));
            assert_ne!(after, 5);
            if before != 5 {
                assert_eq!(before, after, "key {key} moved off a task that stayed");
            }
        }
        assert!(consistent_hashing(&Tasks::new([(0, TaskState::Draining)]).unwrap(), 1).is_none());
    }
}
