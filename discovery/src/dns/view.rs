//! From resolved records to a [`JobView`]: the index rules, with no I/O.

use std::collections::btree_map::Entry;
use std::collections::BTreeMap;
use std::net::SocketAddr;

use steady_core::{JobView, TaskState};

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
