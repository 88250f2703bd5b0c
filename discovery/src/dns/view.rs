//! From resolved records to a [`JobView`]: the index rules, with no I/O.

use std::collections::btree_map::Entry;
use std::collections::BTreeMap;
use std::net::SocketAddr;

use std::sync::Arc;

use steady_core::{JobView, Locality, Task, TaskState, Zone};

use crate::identity::ordinal_of;
use crate::source::view_of;

/// One SRV target and, when its own lookup found one, its address.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Target {
    /// The target host name (`web-3.web.ns.svc.cluster.local.`).
    pub(super) host: String,
    /// Its address and the task's port; `None` when the target has no A/AAAA record.
    pub(super) address: Option<SocketAddr>,
}

/// What building a view by ordinals left out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Tally {
    /// Targets whose ordinal another target (sorting first) already had.
    pub(super) duplicate_ordinals: u64,
    /// Targets left out: no ordinal, an ordinal at or above the cap, or no address.
    pub(super) skipped: u64,
}

/// The view by StatefulSet ordinals: task `i` is the target whose first label ends in
/// `-i`; the size is the largest ordinal plus one; ordinals at or above `max_tasks` are
/// left out.
///
/// Deterministic whatever the order of the answer (servers rotate records): targets are
/// taken in name order, so of two targets claiming one ordinal the same one always wins.
/// A target repeated (one SRV record per port) counts once.
pub(super) fn by_ordinal(mut targets: Vec<Target>, max_tasks: usize) -> (JobView<String>, Tally) {
    targets.sort();
    targets.dedup_by(|a, b| a.host == b.host);
    let mut tally = Tally::default();
    let mut tasks: BTreeMap<usize, SocketAddr> = BTreeMap::new();
    for target in targets {
        let (Some(ordinal), Some(address)) = (ordinal_of(&target.host), target.address) else {
            tally.skipped += 1;
            continue;
        };
        if ordinal >= max_tasks {
            tally.skipped += 1;
            continue;
        }
        match tasks.entry(ordinal) {
            Entry::Vacant(slot) => {
                slot.insert(address);
            }
            Entry::Occupied(_) => tally.duplicate_ordinals += 1,
        }
    }
    let size = tasks.last_key_value().map_or(0, |(&top, _)| top + 1);
    debug_assert!(size <= max_tasks);
    let view = view_of(size, tasks.into_iter().map(|(i, a)| (i, a.to_string(), TaskState::Serving)));
    (view, tally)
}

/// The view by address order: task `i` is the `i`-th smallest distinct address (numeric
/// order, IPv4 before IPv6). See [`IndexRule::SortedAddresses`](super::IndexRule) for
/// the churn this costs.
pub(super) fn by_address(mut addresses: Vec<SocketAddr>) -> JobView<String> {
    addresses.sort();
    addresses.dedup();
    JobView::serving(addresses.iter().map(SocketAddr::to_string))
}

/// The zones' views (each by ordinals, in the configured order) as one job: the task of
/// ordinal `o` in the zone at position `p` of `Z` is task `o × Z + p`, at locality
/// (zone, `o`). See [`DnsConfig::zoned`](super::DnsConfig::zoned).
pub(super) fn zoned(parts: Vec<(Zone, JobView<String>)>) -> JobView<String> {
    let zones = parts.len();
    let mut tasks: BTreeMap<usize, Task<String>> = BTreeMap::new();
    for (position, (zone, view)) in parts.into_iter().enumerate() {
        for (&ordinal, task) in view.tasks.range(..view.size) {
            // The ordinals are below the configured cap; past usize, a task is left out.
            let Some(index) = ordinal.checked_mul(zones).and_then(|i| i.checked_add(position)) else {
                continue;
            };
            let locality = Locality::new(zone.clone(), ordinal);
            tasks.insert(index, Task::new(task.address.clone(), task.state).in_zone(locality));
        }
    }
    let size = tasks.last_key_value().map_or(0, |(&top, _)| top + 1);
    JobView { size, tasks: Arc::new(tasks) }
}

/// `view` with, for each zone position in `empty_zones` (of `zones`), the tasks of
/// `last` at that position put back: a zone whose answer was empty keeps its last tasks.
pub(super) fn keep_empty_zones(
    view: JobView<String>,
    empty_zones: &[usize],
    zones: usize,
    last: &JobView<String>,
) -> JobView<String> {
    if empty_zones.is_empty() || zones == 0 {
        return view;
    }
    let mut tasks = (*view.tasks).clone();
    for (&index, task) in last.tasks.range(..last.size) {
        if empty_zones.contains(&(index % zones)) {
            tasks.insert(index, task.clone());
        }
    }
    let size = tasks.last_key_value().map_or(0, |(&top, _)| top + 1);
    JobView { size, tasks: Arc::new(tasks) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(host: &str, address: &str) -> Target {
        Target { host: host.to_owned(), address: Some(address.parse().unwrap()) }
    }

    fn addresses(view: &JobView<String>) -> Vec<Option<&str>> {
        (0..view.size).map(|i| view.serving_task(i).map(String::as_str)).collect()
    }

    #[test]
    fn ordinals_give_indices_holes_and_the_size() {
        let (view, tally) = by_ordinal(
            vec![
                target("web-3.web.ns.svc.cluster.local.", "10.0.0.9:80"),
                target("web-0.web.ns.svc.cluster.local.", "10.0.0.7:80"),
                target("web-1.web.ns.svc.cluster.local.", "10.0.0.8:80"),
            ],
            4096,
        );
        assert_eq!(addresses(&view), [Some("10.0.0.7:80"), Some("10.0.0.8:80"), None, Some("10.0.0.9:80")]);
        assert_eq!(tally, Tally::default());
    }

    #[test]
    fn odd_targets_are_left_out_and_counted_whatever_the_answer_order() {
        let mut targets = vec![
            target("web-1.a.", "10.0.0.1:80"),
            target("web-1.b.", "10.0.0.2:80"), // duplicate ordinal: web-1.a. sorts first
            target("web-1.a.", "10.0.0.1:80"), // the same target again (another port)
            target("nopod.a.", "10.0.0.3:80"), // no ordinal
            target("web-7.a.", "10.0.0.4:80"), // at the cap
            Target { host: "web-0.a.".to_owned(), address: None }, // no address
        ];
        let (view, tally) = by_ordinal(targets.clone(), 7);
        assert_eq!(addresses(&view), [None, Some("10.0.0.1:80")]);
        assert_eq!(tally, Tally { duplicate_ordinals: 1, skipped: 3 });
        targets.reverse();
        assert_eq!(by_ordinal(targets, 7), (view, tally));
    }

    #[test]
    fn zones_interleave_so_that_resizing_one_renumbers_nobody() {
        let zone = |label| Zone::new(label).unwrap();
        let pods = |prefix: &str, ordinals: &[usize]| {
            let targets = ordinals
                .iter()
                .map(|&o| {
                    target(&format!("{prefix}-{o}.{prefix}.ns."), &format!("10.0.{}.{o}:80", prefix.len()))
                })
                .collect();
            by_ordinal(targets, 4096).0
        };
        let (a, bb, ccc) = (zone("a"), zone("bb"), zone("ccc"));
        let before = zoned(vec![
            (a.clone(), pods("a", &[0, 1, 2])),
            (bb.clone(), pods("bb", &[0, 2])), // ordinal 1 not ready: a hole
            (ccc.clone(), pods("ccc", &[0])),
        ]);
        // Task o × 3 + p.
        let placed: Vec<(usize, String, usize)> = before
            .tasks
            .iter()
            .map(|(&i, t)| {
                (i, t.locality.as_ref().unwrap().zone.to_string(), t.locality.as_ref().unwrap().index)
            })
            .collect();
        let expected = [(0, "a", 0), (1, "bb", 0), (2, "ccc", 0), (3, "a", 1), (6, "a", 2), (7, "bb", 2)];
        assert_eq!(placed, expected.map(|(i, z, o)| (i, z.to_owned(), o)));
        assert_eq!(before.size, 8);
        assert_eq!(before.serving_task(7).map(String::as_str), Some("10.0.2.2:80"));
        assert_eq!(before.zone_sizes().get(&bb), 3);
        // Zone ccc grows to 4 pods, zone a shrinks to 1: nobody else's index or locality moves.
        let after = zoned(vec![
            (a.clone(), pods("a", &[0])),
            (bb.clone(), pods("bb", &[0, 2])),
            (ccc.clone(), pods("ccc", &[0, 1, 2, 3])),
        ]);
        for (i, task) in after.tasks.iter() {
            if let Some(old) = before.tasks.get(i) {
                assert_eq!(old, task, "task {i} moved");
            }
        }
        assert_eq!(after.size, 12);
        assert_eq!(after.zone_sizes().get(&ccc), 4);
        // A zone whose answer was empty keeps its last tasks.
        let glitch = zoned(vec![(a, pods("a", &[0])), (bb, JobView::default()), (ccc, pods("ccc", &[0]))]);
        let kept = keep_empty_zones(glitch, &[1], 3, &before);
        assert_eq!(kept.tasks.keys().copied().collect::<Vec<_>>(), [0, 1, 2, 7]);
        assert_eq!(kept.tasks[&7], before.tasks[&7]);
    }

    #[test]
    fn nothing_usable_is_an_empty_view() {
        let (view, _) = by_ordinal(vec![target("db.a.", "10.0.0.1:80")], 4096);
        assert_eq!(view.size, 0);
        assert_eq!(by_address(Vec::new()).size, 0);
    }

    #[test]
    fn sorted_addresses_are_numeric_and_one_address_in_the_middle_shifts_every_later_index() {
        let before: Vec<SocketAddr> = ["10.0.0.10:80", "10.0.0.2:80", "10.0.0.30:80", "10.0.0.40:80"]
            .map(|a| a.parse().unwrap())
            .into();
        let view = by_address(before.clone());
        assert_eq!(
            addresses(&view),
            [Some("10.0.0.2:80"), Some("10.0.0.10:80"), Some("10.0.0.30:80"), Some("10.0.0.40:80")]
        );
        // One pod more, its address between the others: every task after it moves.
        let mut after = before;
        after.push("10.0.0.20:80".parse().unwrap());
        let moved = by_address(after);
        let shifted = (0..view.size).filter(|&i| view.serving_task(i) != moved.serving_task(i)).count();
        assert_eq!(shifted, 2, "10.0.0.30 and 10.0.0.40 each moved up one index");
        assert_eq!(moved.serving_task(4).map(String::as_str), Some("10.0.0.40:80"));
        // By ordinals, the same new pod (web-4) moves nothing.
        let pods =
            |n: usize| (0..n).map(|i| target(&format!("web-{i}.a."), &format!("10.0.0.{i}:80"))).collect();
        let (four, _) = by_ordinal(pods(4), 4096);
        let (five, _) = by_ordinal(pods(5), 4096);
        assert!((0..4).all(|i| four.serving_task(i) == five.serving_task(i)));
    }
}
