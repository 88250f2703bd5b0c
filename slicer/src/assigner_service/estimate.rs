//! From load reports to the load an assigner run balances.
//!
//! Two sources report load: the Slicelets (per slice they held, with their hottest keys)
//! and clients that report load per key range (gRFC A119). Each sees part of the truth:
//! the Slicelets only the tasks that run one, the clients only the clients that report.
//! Neither counts a request twice, so on any key range the larger of the two is the better
//! lower bound of the load there. [`estimate`] takes, on each slice of the assignment in
//! force, the source with the larger load over the slice, and keeps that source's load
//! there, shaped as that source saw it.

use std::collections::BTreeMap;

use steady_assigner::{AssignError, Load, SliceKey};
use steady_proto::autosharding::ranges::RangeRates;
use steady_slice::{Assignment, KeyRange};

use crate::load::{ClientReceived, Received};

/// The key space's size, `2^64`.
const SPACE: u128 = 1 << 64;

/// One source's load: rates spread evenly over ranges (which may overlap; their rates
/// add up) and rates at single keys.
#[derive(Debug, Clone, Default)]
struct Source {
    ranges: Vec<(KeyRange, f64)>,
    points: Vec<(SliceKey, f64)>,
}

impl Source {
    fn is_empty(&self) -> bool {
        self.ranges.is_empty() && self.points.is_empty()
    }

    fn load(&self) -> Result<Load, AssignError> {
        Load::from_points(self.points.iter().copied())?.with_ranges(self.ranges.iter().copied())
    }
}

/// The load of a job estimated from its tasks' fresh reports (`fresh`) and its clients'
/// (`clients`).
///
/// The Slicelets' load:
///
/// * Each reported slice's rate is spread evenly over the slice's range in the
///   generation the report was taken under, minus the rates of the hot keys inside it,
///   which are placed at their keys (so splits can isolate them). A slice the reporting
///   task did not hold in that generation is ignored, and so is a hot key outside the
///   slices its report lists.
/// * A serving task with no fresh report is assumed to carry, on each slice it holds in
///   `current`, the mean rate per key (and per replica) of the reported slices.
///
/// The clients' load: each client's latest report is its current rate (a client reports
/// the load it saw since its previous report), so the clients' rates add up. A range's
/// rate is spread evenly over its keys (hashed keys are), and a range of one key is that
/// key's rate ([`client_load`]).
///
/// Together:
///
/// * No client load: the Slicelets' load, as described (exactly as without clients).
/// * On each slice of `current`, the source whose load over the slice is larger (the
///   Slicelets' on a tie), its ranges clipped to the slice (a range keeps the share of
///   its rate that its overlap is of its keys) and its keys inside the slice. Each source
///   sees only part of the truth and neither counts a request twice, so the larger is the
///   better lower bound. The total is at least either source's and at most their sum.
/// * Without `current`: the clients' load if the Slicelets report none, else the source
///   with the larger total.
/// * With no fresh report from either source the load is unknown: uniform, so the run
///   only keeps replica counts within limits and moves slices off leaving tasks.
pub fn estimate(
    fresh: &[Received],
    clients: &[ClientReceived],
    current: Option<&Assignment>,
    serving: &[u32],
) -> Load {
    let from_clients = client_source(clients.iter().map(|c| &*c.rates));
    if fresh.is_empty() && from_clients.is_empty() {
        return Load::none().with_uniform(1.0).expect("1 is a valid load");
    }
    let from_slicelets = slicelet_source(fresh, current, serving);
    let combined = if from_clients.is_empty() {
        Ok(from_slicelets)
    } else {
        combine(from_slicelets, from_clients, current)
    };
    let usable = |source: Result<Source, AssignError>| {
        source.and_then(|source| source.load()).ok().filter(|load| load.total().is_finite())
    };
    if let Some(load) = usable(combined) {
        return load;
    }
    // Clients are remote peers: load they make unusable must not cost the Slicelets' too.
    if !fresh.is_empty() {
        if let Some(load) = usable(Ok(slicelet_source(fresh, current, serving))) {
            tracing::warn!(
                "assigner: the clients' load does not add up to a finite total; the Slicelets' alone"
            );
            return load;
        }
    }
    tracing::warn!("assigner: reported load does not add up to a finite total; taken as uniform");
    Load::none().with_uniform(1.0).expect("1 is a valid load")
}

/// The load clients report, alone: their rates per range summed, each range's rate
/// spread evenly over its keys, a range of one key that key's rate. What [`estimate`]
/// takes as the clients' load (no report, or only reports without load: no load).
///
/// # Errors
///
/// [`AssignError::BadLoad`] when the rates do not add up to finite loads.
pub fn client_load<'a>(reports: impl IntoIterator<Item = &'a RangeRates>) -> Result<Load, AssignError> {
    client_source(reports).load()
}

/// The Slicelets' load (see [`estimate`]); empty without reports.
fn slicelet_source(fresh: &[Received], current: Option<&Assignment>, serving: &[u32]) -> Source {
    let mut out = Source::default();
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
            out.ranges.push((range, slice_rate - inside_rate));
            let scale =
                if inside_rate > 0.0 { inside_rate / inside.iter().map(|h| h.1).sum::<f64>() } else { 0.0 };
            out.points.extend(inside.into_iter().map(|(k, r)| (k, r * scale)));
            rate += slice_rate;
            covered += range.fraction() / slice.replicas().len() as f64;
        }
    }
    if let (Some(current), false) = (current, fresh.is_empty()) {
        let density = if covered > 0.0 { rate / covered } else { 0.0 };
        // Both sorted: `fresh` by task, `serving` ascending.
        let reported: Vec<u32> = fresh.iter().map(|r| r.report.task()).collect();
        let unreported = |t: &u32| serving.binary_search(t).is_ok() && reported.binary_search(t).is_err();
        for (i, slice) in current.slices().iter().enumerate() {
            let missing = slice.replicas().iter().filter(|t| unreported(t)).count();
            if missing > 0 && density > 0.0 {
                let range = current.range(i);
                let share = density * range.fraction() / slice.replicas().len() as f64;
                out.ranges.push((range, share * missing as f64));
            }
        }
    }
    out
}

/// The clients' load (see [`client_load`]), its ranges merged into one step function:
/// ranges that do not overlap, in key order, however many clients reported (so what is
/// built from it costs `O(ranges)`, not `O(ranges × clients)`).
fn client_source<'a>(reports: impl IntoIterator<Item = &'a RangeRates>) -> Source {
    let mut out = Source::default();
    // (where, density, whether a range starts there)
    let mut steps: Vec<(u128, f64, bool)> = Vec::new();
    for rates in reports {
        for &(start, end, rate) in &rates.ranges {
            let (from, to) = (u128::from(start.get()), end.map_or(SPACE, |e| u128::from(e.get())));
            if !(rate > 0.0 && rate.is_finite()) || to <= from {
                // No load (or, from a valid report, never: an empty range).
                continue;
            }
            if to - from == 1 {
                out.points.push((start, rate));
            } else {
                let density = rate / (to - from) as f64;
                steps.push((from, density, true));
                steps.push((to, density, false));
            }
        }
    }
    steps.sort_by_key(|s| s.0);
    // The open densities, summed per binade: a one-key-wide density can be some 10^19
    // times a wide range's, so adding and taking back across magnitudes would lose the
    // small; within a binade it loses no more than a few units in the last place, and an
    // emptied binade is exactly zero again.
    let mut open: BTreeMap<u64, (f64, usize)> = BTreeMap::new();
    let mut at = 0u128;
    let mut density = 0.0f64;
    for (where_, change, starts) in steps {
        if where_ > at && density > 0.0 {
            out.ranges.push((key_range(at, where_), density * (where_ - at) as f64));
        }
        at = where_;
        let binade = open.entry(change.to_bits() >> 52).or_default();
        if starts {
            binade.0 += change;
            binade.1 += 1;
        } else {
            binade.0 -= change;
            binade.1 -= 1;
            if binade.1 == 0 {
                open.remove(&(change.to_bits() >> 52));
            }
        }
        density = open.values().map(|b| b.0.max(0.0)).sum();
    }
    out
}

/// The keys in `[start, end)` (`end` up to `2^64`; `start < end`).
fn key_range(start: u128, end: u128) -> KeyRange {
    KeyRange::new(SliceKey(start as u64), (end < SPACE).then_some(SliceKey(end as u64)))
}

/// On each slice of `current` the source with the larger load there (see [`estimate`]);
/// without `current`, the clients' load if the Slicelets report none, else the larger.
fn combine(slicelets: Source, clients: Source, current: Option<&Assignment>) -> Result<Source, AssignError> {
    if slicelets.is_empty() {
        return Ok(clients);
    }
    let (of_slicelets, of_clients) = (slicelets.load()?, clients.load()?);
    let Some(current) = current else {
        return Ok(if of_clients.total() > of_slicelets.total() { clients } else { slicelets });
    };
    // Per slice: whether the clients' load wins there.
    let to_clients: Vec<bool> = (0..current.slices().len())
        .map(|i| {
            let range = current.range(i);
            of_clients.of_range(range) > of_slicelets.of_range(range)
        })
        .collect();
    let mut out = Source::default();
    clip(&slicelets, current, |i| !to_clients[i], &mut out);
    clip(&clients, current, |i| to_clients[i], &mut out);
    Ok(out)
}

/// Adds to `out` the part of `source` on the slices of `current` that `keep` selects (by
/// index): each range's rate by the share of its keys on them, each key on one.
fn clip(source: &Source, current: &Assignment, keep: impl Fn(usize) -> bool, out: &mut Source) {
    let slices = current.slices();
    for &(range, rate) in &source.ranges {
        let (start, end) =
            (u128::from(range.start().get()), range.end().map_or(SPACE, |e| u128::from(e.get())));
        let mut i = current.slice_index(range.start());
        while i < slices.len() && u128::from(slices[i].start.get()) < end {
            if keep(i) {
                let slice_end = slices.get(i + 1).map_or(SPACE, |s| u128::from(s.start.get()));
                let (from, to) = (start.max(u128::from(slices[i].start.get())), end.min(slice_end));
                let share = if from == start && to == end {
                    rate
                } else {
                    rate * ((to - from) as f64 / (end - start) as f64)
                };
                out.ranges.push((key_range(from, to), share));
            }
            i += 1;
        }
    }
    out.points.extend(source.points.iter().copied().filter(|&(k, _)| keep(current.slice_index(k))));
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;
    use tokio::time::Instant;

    use proptest::prelude::*;
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
        let load = estimate(&fresh, &[], Some(&a), &[0, 1]);
        assert!((load.total() - 140.0).abs() < 1e-9, "{}", load.total());
        assert!((load.of_range(KeyRange::new(SliceKey(7), Some(SliceKey(8)))) - 60.0).abs() < 1e-6);
        assert!((load.of_range(KeyRange::new(SliceKey(half), None)) - 40.0).abs() < 1e-9);
    }

    #[test]
    fn an_unreported_task_is_assumed_average_and_no_reports_mean_uniform_load() {
        let (a, half) = (two_halves(), 1u64 << 63);
        let load = estimate(&[received(0, &a, vec![(SliceKey(0), 100.0)], vec![])], &[], Some(&a), &[0, 1]);
        assert!((load.of_range(KeyRange::new(SliceKey(half), None)) - 100.0).abs() < 1e-6);
        let unknown = estimate(&[], &[], Some(&a), &[0, 1]);
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
        let load = estimate(&fresh, &[], Some(&a), &[0, 1]);
        assert!((load.total() - 40.0).abs() < 1e-9, "{}", load.total());
    }

    /// A client's report: `(start, end, rate)` ranges.
    fn client(name: &str, ranges: Vec<(u64, Option<u64>, f64)>) -> ClientReceived {
        let ranges = ranges.into_iter().map(|(s, e, r)| (SliceKey(s), e.map(SliceKey), r)).collect();
        ClientReceived {
            client: name.to_owned(),
            rates: Arc::new(RangeRates { ranges, interval: Duration::from_secs(10) }),
            at: Instant::now(),
        }
    }

    fn near(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
    }

    const HALF: u64 = 1 << 63;
    const QUARTER: u64 = 1 << 62;

    #[test]
    fn client_reports_alone_are_their_ranges_summed_with_one_key_ranges_as_keys() {
        let a = two_halves();
        // Two clients; the second's range [7, 8) is key 7 alone.
        let clients = [
            client("a", vec![(0, Some(HALF), 30.0), (HALF, None, 10.0)]),
            client(
                "b",
                vec![(0, Some(7), 0.0), (7, Some(8), 50.0), (8, Some(QUARTER), 4.0), (QUARTER, None, 0.0)],
            ),
        ];
        for current in [Some(&*a), None] {
            let load = estimate(&[], &clients, current, &[0, 1]);
            assert!(near(load.total(), 94.0), "{}", load.total());
            let seven = KeyRange::new(SliceKey(7), Some(SliceKey(8)));
            assert!(near(load.of_range(seven), 50.0), "key 7 carries its own rate: {}", load.of_range(seven));
            assert!(near(load.of_range(KeyRange::new(SliceKey(HALF), None)), 10.0));
            // No uniform part: what no client reported carries nothing beyond the ranges.
            let upper_quarter = KeyRange::new(SliceKey(HALF + QUARTER), None);
            assert!(near(load.of_range(upper_quarter), 5.0));
        }
        let alone = client_load(clients.iter().map(|c| &*c.rates)).unwrap();
        assert!(near(alone.total(), 94.0));
    }

    #[test]
    fn on_each_slice_the_source_with_the_larger_load_counts_shaped_as_it_saw_it() {
        let a = two_halves();
        // The Slicelets see 100 on the lower half (60 on key 7), 40 on the upper one.
        let fresh = [
            received(0, &a, vec![(SliceKey(0), 100.0)], vec![(SliceKey(7), 60.0)]),
            received(1, &a, vec![(SliceKey(HALF), 40.0)], vec![]),
        ];
        // The clients see less on both: one range of 50 across both, over 5/4 of a half.
        let clients =
            [client("a", vec![(0, Some(HALF + QUARTER / 2), 50.0), (HALF + QUARTER / 2, None, 0.0)])];
        let load = estimate(&fresh, &clients, Some(&a), &[0, 1]);
        let lower = KeyRange::new(SliceKey(0), Some(SliceKey(HALF)));
        let upper = KeyRange::new(SliceKey(HALF), None);
        // 40 of it on the lower half, 10 on the upper one: the Slicelets win both.
        assert!(near(load.of_range(lower), 100.0), "the Slicelets win below: {}", load.of_range(lower));
        assert!(near(load.of_range(KeyRange::new(SliceKey(7), Some(SliceKey(8)))), 60.0));
        assert!(near(load.of_range(upper), 40.0), "and above: {}", load.of_range(upper));

        // Now the clients see 90 on the upper half, all of it in its first half of keys.
        let clients = [client("a", vec![(HALF, Some(HALF + QUARTER), 90.0), (HALF + QUARTER, None, 0.0)])];
        let load = estimate(&fresh, &clients, Some(&a), &[0, 1]);
        assert!(near(load.of_range(lower), 100.0));
        assert!(near(load.of_range(upper), 90.0), "the clients win above: {}", load.of_range(upper));
        let clients_range = KeyRange::new(SliceKey(HALF), Some(SliceKey(HALF + QUARTER)));
        assert!(near(load.of_range(clients_range), 90.0), "where the clients saw it");
        assert!(near(load.total(), 190.0), "{}", load.total());
    }

    #[test]
    fn without_an_assignment_in_force_the_larger_total_counts() {
        let a = two_halves();
        let fresh = [received(0, &a, vec![(SliceKey(0), 100.0)], vec![])];
        let small = [client("a", vec![(HALF, None, 30.0)])];
        let large = [client("a", vec![(HALF, None, 300.0)])];
        assert!(near(estimate(&fresh, &small, None, &[0, 1]).total(), 100.0));
        let load = estimate(&fresh, &large, None, &[0, 1]);
        assert!(near(load.of_range(KeyRange::new(SliceKey(HALF), None)), 300.0));
        assert!(near(load.total(), 300.0));
    }

    #[test]
    fn clients_that_report_no_load_change_nothing() {
        let (a, half) = (two_halves(), 1u64 << 63);
        let fresh = [
            received(0, &a, vec![(SliceKey(0), 100.0)], vec![(SliceKey(7), 60.0)]),
            received(1, &a, vec![(SliceKey(half), 40.0)], vec![]),
        ];
        let silent = [client("a", vec![]), client("b", vec![(0, None, 0.0)])];
        for current in [Some(&*a), None] {
            assert_eq!(estimate(&fresh, &silent, current, &[0, 1]), estimate(&fresh, &[], current, &[0, 1]));
        }
        assert_eq!(estimate(&[], &silent, Some(&a), &[0, 1]), estimate(&[], &[], Some(&a), &[0, 1]));
    }

    #[test]
    fn clients_whose_load_overflows_cost_the_slicelets_nothing() {
        let (a, half) = (two_halves(), 1u64 << 63);
        let fresh = [
            received(0, &a, vec![(SliceKey(0), 100.0)], vec![]),
            received(1, &a, vec![(SliceKey(half), 40.0)], vec![]),
        ];
        // Each finite; summed, past f64: the clients' load is unusable.
        let hostile = [client("a", vec![(5, Some(6), f64::MAX)]), client("b", vec![(5, Some(6), f64::MAX)])];
        assert_eq!(estimate(&fresh, &hostile, Some(&a), &[0, 1]), estimate(&fresh, &[], Some(&a), &[0, 1]));
    }

    #[test]
    fn many_clients_with_wide_and_narrow_ranges_keep_every_rate() {
        // A two-key range's density is some 10^18 times a half's: merging them must keep
        // the wide ranges' load past the narrow one.
        let clients: Vec<ClientReceived> = (0..100u64)
            .map(|i| {
                client(
                    &i.to_string(),
                    vec![(0, Some(HALF), 1.0), (HALF, Some(HALF + 2), 1e6), (HALF + 2, None, 1.0)],
                )
            })
            .collect();
        let load = estimate(&[], &clients, None, &[]);
        assert!(near(load.total(), 100.0 * (2.0 + 1e6)), "{}", load.total());
        assert!(
            near(load.of_range(KeyRange::new(SliceKey(HALF + 2), None)), 100.0),
            "the wide range past it"
        );
    }

    /// An assignment of slices at `starts` (0 added), slice `i` on task `i % 3`.
    fn assignment(mut starts: Vec<u64>) -> Arc<Assignment> {
        starts.push(0);
        starts.sort_unstable();
        starts.dedup();
        let slices =
            starts.iter().enumerate().map(|(i, &s)| Slice::new(SliceKey(s), vec![i as u32 % 3])).collect();
        Arc::new(Assignment::new(3, slices).unwrap())
    }

    /// A client's contiguous ranges from cut points, with rates; a cut right after
    /// another makes a one-key range.
    fn contiguous(mut cuts: Vec<u64>, rates: &[f64]) -> Vec<(u64, Option<u64>, f64)> {
        cuts.sort_unstable();
        cuts.dedup();
        (0..cuts.len()).map(|i| (cuts[i], cuts.get(i + 1).copied(), rates[i % rates.len()])).collect()
    }

    proptest! {
        #[test]
        fn the_combined_total_is_between_the_larger_source_and_both(
            starts in prop::collection::vec(any::<u64>(), 0..8),
            slice_rates in prop::collection::vec(0.0f64..1e4, 1..8),
            hot in prop::collection::vec((any::<u64>(), 0.0f64..1e3), 0..4),
            cuts in prop::collection::vec(prop::collection::vec(
                prop_oneof![any::<u64>(), 0u64..4, (u64::MAX - 4)..u64::MAX], 1..12), 0..4),
            client_rates in prop::collection::vec(0.0f64..1e4, 1..6),
            reporting in 1u32..4,
            with_current in any::<bool>(),
        ) {
            let a = assignment(starts);
            // Tasks below `reporting` report each of their slices.
            let fresh: Vec<Received> = (0..reporting.min(3))
                .map(|t| {
                    let slices: Vec<(SliceKey, f64)> = a
                        .slices()
                        .iter()
                        .enumerate()
                        .filter(|(_, s)| s.replicas().contains(&t))
                        .map(|(i, s)| (s.start, slice_rates[i % slice_rates.len()]))
                        .collect();
                    let hot: Vec<(SliceKey, f64)> = hot.iter().map(|&(k, r)| (SliceKey(k), r)).collect();
                    received(t, &a, slices, hot)
                })
                .filter(|r| !r.report.slices().is_empty())
                .collect();
            let clients: Vec<ClientReceived> = cuts
                .into_iter()
                .enumerate()
                .map(|(i, c)| client(&i.to_string(), contiguous(c, &client_rates)))
                .collect();
            let current = with_current.then_some(&*a);
            let serving = [0, 1, 2];
            let slicelets = if fresh.is_empty() { 0.0 } else { estimate(&fresh, &[], current, &serving).total() };
            let of_clients = client_load(clients.iter().map(|c| &*c.rates)).unwrap().total();
            let total = estimate(&fresh, &clients, current, &serving).total();
            let eps = 1e-9 * (slicelets + of_clients).max(1.0);
            prop_assert!(total >= slicelets.max(of_clients) - eps, "{total} < max({slicelets}, {of_clients})");
            prop_assert!(total <= slicelets + of_clients + eps, "{total} > {slicelets} + {of_clients}");
        }
    }
}
