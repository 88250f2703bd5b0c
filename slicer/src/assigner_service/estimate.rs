//! From the Slicelets' reports to the load an assigner run balances.

use steady_assigner::{Load, SliceKey};
use steady_slice::{Assignment, KeyRange};

use crate::load::Received;

/// The load of a job estimated from its tasks' fresh reports.
///
/// * Each reported slice's rate is spread evenly over the slice's range in the
///   generation the report was taken under, minus the rates of the hot keys inside it,
///   which are placed at their keys (so splits can isolate them). A slice the reporting
///   task did not hold in that generation is ignored, and so is a hot key outside the
///   slices its report lists.
/// * A serving task with no fresh report is assumed to carry, on each slice it holds in
///   `current`, the mean rate per key (and per replica) of the reported slices.
/// * With no fresh report at all the load is unknown: uniform, so the run only keeps
///   replica counts within limits and moves slices off leaving tasks.
pub fn estimate(fresh: &[Received], current: Option<&Assignment>, serving: &[u32]) -> Load {
    if fresh.is_empty() {
        return Load::none().with_uniform(1.0).expect("1 is a valid load");
    }
    let mut ranges: Vec<(KeyRange, f64)> = Vec::new();
    let mut points: Vec<(SliceKey, f64)> = Vec::new();
    // Reported rate over the key space it covered, per replica: for the unreported.
    let (mut rate, mut covered) = (0.0, 0.0);
    for received in fresh {
        let a = &received.assignment;
        let task = received.report.task();
        let hot = received.report.hot_keys();
        for &(start, slice_rate) in received.report.slices() {
            let i = a.slice_index(start);
            let slice = &a.slices()[i];
            if slice.start != start || !slice.replicas().contains(&task) {
                // Not a slice of that generation this task held: the report is
                // inconsistent (or forged); its claim is ignored.
                continue;
            }
            let range = a.range(i);
            // Hot keys count where their slice is reported, and only there: a key the
            // task saw before it moved away is not double counted with its new owner's.
            let inside: Vec<(SliceKey, f64)> =
                hot.iter().copied().filter(|(k, _)| range.contains(*k)).collect();
            let inside_rate: f64 = inside.iter().map(|h| h.1).sum::<f64>().min(slice_rate);
            ranges.push((range, slice_rate - inside_rate));
            let scale =
                if inside_rate > 0.0 { inside_rate / inside.iter().map(|h| h.1).sum::<f64>() } else { 0.0 };
            points.extend(inside.into_iter().map(|(k, r)| (k, r * scale)));
            rate += slice_rate;
            covered += range.fraction() / slice.replicas().len() as f64;
        }
    }
    if let Some(current) = current {
        let density = if covered > 0.0 { rate / covered } else { 0.0 };
        // Both sorted: `fresh` by task, `serving` ascending.
        let reported: Vec<u32> = fresh.iter().map(|r| r.report.task()).collect();
        let unreported = |t: &u32| serving.binary_search(t).is_ok() && reported.binary_search(t).is_err();
        for (i, slice) in current.slices().iter().enumerate() {
            let missing = slice.replicas().iter().filter(|t| unreported(t)).count();
            if missing > 0 && density > 0.0 {
                let range = current.range(i);
                let share = density * range.fraction() / slice.replicas().len() as f64;
                ranges.push((range, share * missing as f64));
            }
        }
    }
    match Load::from_points(points).and_then(|load| load.with_ranges(ranges)) {
        Ok(load) if load.total().is_finite() => load,
        _ => {
            tracing::warn!("assigner: reported load does not add up to a finite total; taken as uniform");
            Load::none().with_uniform(1.0).expect("1 is a valid load")
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use tokio::time::Instant;

    use steady_slice::Slice;

    use super::*;
    use steady_slicelet::LoadReport;

    fn received(
        task: u32,
        a: &Arc<Assignment>,
        slices: Vec<(SliceKey, f64)>,
        hot: Vec<(SliceKey, f64)>,
    ) -> Received {
        Received {
            report: LoadReport::new("job", task, a.generation(), slices, hot).unwrap(),
            at: Instant::now(),
            assignment: a.clone(),
        }
    }

    /// Generation 3: keys below 2^63 on task 0, the rest on task 1.
    fn two_halves() -> Arc<Assignment> {
        let slices = vec![Slice::new(SliceKey(0), vec![0]), Slice::new(SliceKey(1 << 63), vec![1])];
        Arc::new(Assignment::new(3, slices).unwrap())
    }

    #[test]
    fn reports_become_range_loads_with_hot_keys_at_their_keys() {
        let (a, half) = (two_halves(), 1u64 << 63);
        let fresh = [
            received(0, &a, vec![(SliceKey(0), 100.0)], vec![(SliceKey(7), 60.0)]),
            received(1, &a, vec![(SliceKey(half), 40.0)], vec![]),
        ];
        let load = estimate(&fresh, Some(&a), &[0, 1]);
        assert!((load.total() - 140.0).abs() < 1e-9, "{}", load.total());
        assert!((load.of_range(KeyRange::new(SliceKey(7), Some(SliceKey(8)))) - 60.0).abs() < 1e-6);
        assert!((load.of_range(KeyRange::new(SliceKey(half), None)) - 40.0).abs() < 1e-9);
    }

    #[test]
    fn an_unreported_task_is_assumed_average_and_no_reports_mean_uniform_load() {
        let (a, half) = (two_halves(), 1u64 << 63);
        let load = estimate(&[received(0, &a, vec![(SliceKey(0), 100.0)], vec![])], Some(&a), &[0, 1]);
        assert!((load.of_range(KeyRange::new(SliceKey(half), None)) - 100.0).abs() < 1e-6);
        let unknown = estimate(&[], Some(&a), &[0, 1]);
        assert_eq!(unknown.of_range(KeyRange::new(SliceKey(0), Some(SliceKey(half)))), 0.5);
    }

    #[test]
    fn claims_on_slices_a_task_did_not_hold_and_hot_keys_outside_its_slices_are_ignored() {
        let (a, half) = (two_halves(), 1u64 << 63);
        // Task 1 claims task 0's slice, and reports a key it no longer holds.
        let fresh = [
            received(0, &a, vec![(SliceKey(0), 10.0)], vec![]),
            received(1, &a, vec![(SliceKey(0), 500.0), (SliceKey(half), 30.0)], vec![(SliceKey(5), 400.0)]),
        ];
        let load = estimate(&fresh, Some(&a), &[0, 1]);
        assert!((load.total() - 40.0).abs() < 1e-9, "{}", load.total());
    }
}
