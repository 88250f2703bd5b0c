//! [`Layout`]: a run's view of its serving tasks for placement: capacities, failure
//! domains as small integers, the effective replica limits, and how far a replica set is
//! from satisfying the [`Placement`].

use std::collections::HashMap;

use super::{Placement, Spread};
use crate::load::ReplicaLimits;
use crate::tasks::Tasks;

/// The serving tasks of one run, by position (the index into the ascending serving list),
/// compiled from the task profiles and the placement.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    /// The serving task indices, ascending.
    pub(crate) serving: Vec<u32>,
    /// Each position's capacity.
    pub(crate) capacity: Vec<f64>,
    /// `1 / capacity`: what one unit of load adds to a position's utilisation.
    pub(crate) inverse: Vec<f64>,
    /// Each position's zone (0: unlabelled).
    zone: Vec<u32>,
    /// Each position's rack label (0: unlabelled); a rack is within its zone.
    rack: Vec<u32>,
    /// Each position's *group*: its (zone, rack) pair, numbered from 0: the rack as a
    /// failure domain. Every task of a group is interchangeable for the constraints.
    pub(crate) group: Vec<u32>,
    /// How many groups there are.
    pub(crate) groups: usize,
    /// A position of each group.
    representatives: Vec<u32>,
    /// The zones every slice needs a replica in (when the placement asks for one per zone):
    /// `required[zone]`, by zone number.
    required: Vec<bool>,
    /// How many zones that is.
    pub(crate) required_count: usize,
    spread: Spread,
    /// Whether any constraint applies (otherwise every replica set scores 0).
    pub(crate) constrained: bool,
    /// The replica limits the run works to: the configured ones capped by the serving
    /// tasks, raised to the required zones, capped by the spread domains.
    pub(crate) min_r: usize,
    pub(crate) max_r: usize,
}

impl Layout {
    /// The layout of `serving` (ascending task indices, at least one) of `tasks`.
    pub(crate) fn new(
        tasks: &Tasks,
        serving: Vec<u32>,
        placement: &Placement,
        replicas: ReplicaLimits,
    ) -> Self {
        let n = serving.len();
        let mut zones: HashMap<&str, u32> = HashMap::new();
        let mut racks: HashMap<&str, u32> = HashMap::new();
        let mut groups: HashMap<(u32, u32), u32> = HashMap::new();
        let mut representatives = Vec::new();
        let (mut capacity, mut inverse, mut zone, mut rack, mut group) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        for &t in &serving {
            let profile = tasks.profile(t);
            capacity.push(profile.capacity);
            inverse.push(1.0 / profile.capacity);
            let z = profile.zone.as_deref().map_or(0, |label| {
                let next = zones.len() as u32 + 1;
                *zones.entry(label).or_insert(next)
            });
            let r = profile.rack.as_deref().map_or(0, |label| {
                let next = racks.len() as u32 + 1;
                *racks.entry(label).or_insert(next)
            });
            let next = groups.len() as u32;
            let g = *groups.entry((z, r)).or_insert(next);
            if g == next {
                representatives.push(group.len() as u32);
            }
            group.push(g);
            zone.push(z);
            rack.push(r);
        }
        let mut required = vec![false; zones.len() + 1];
        if placement.replica_per_zone {
            if placement.zones.is_empty() {
                for &z in &zone {
                    required[z as usize] = z != 0;
                }
            } else {
                for label in &placement.zones {
                    if let Some(&z) = zones.get(label.as_str()) {
                        required[z as usize] = true;
                    }
                }
            }
        }
        let required_count = required.iter().filter(|&&r| r).count();
        let (mut min_r, mut max_r) = replicas.effective(n);
        if required_count > min_r {
            min_r = required_count.min(max_r);
        }
        let domains = match placement.spread {
            Spread::None => n,
            Spread::Zones => distinct(&zone),
            Spread::Racks => groups.len(),
        };
        max_r = max_r.min(domains).max(min_r);
        let constrained = placement.spread != Spread::None || required_count > 0;
        Self {
            serving,
            capacity,
            inverse,
            zone,
            rack,
            group,
            groups: groups.len(),
            representatives,
            required,
            required_count,
            spread: placement.spread,
            constrained,
            min_r,
            max_r,
        }
    }

    /// A position in group `g`.
    pub(crate) fn representative(&self, g: usize) -> u32 {
        self.representatives[g]
    }

    /// The positions in an order whose consecutive entries sit in different domains as
    /// far as the task set allows: round-robin over zones, and within a zone round-robin
    /// over racks. Without constraints, `0..n` (the order assigners used before placement
    /// existed, which keeps their unconstrained output unchanged).
    pub(crate) fn spread_order(&self) -> Vec<u32> {
        let n = self.serving.len() as u32;
        if !self.constrained {
            return (0..n).collect();
        }
        if self.spread == Spread::Racks && self.required_count == 0 {
            return round_robin(&self.group, (0..n).collect(), |o| o);
        }
        round_robin(&self.zone, (0..n).collect(), |order| round_robin(&self.rack, order, |o| o))
    }

    /// The domain replicas must not share under the spread constraint.
    fn domain(&self, t: u32) -> u32 {
        match self.spread {
            Spread::Racks => self.group[t as usize],
            _ => self.zone[t as usize],
        }
    }

    /// How far the replica set (positions) is from satisfying the placement: pairs of
    /// replicas that share a spread domain, plus required zones with no replica. 0: it
    /// satisfies the placement. (The replica count is the limits' business, not this.)
    pub(crate) fn score(&self, replicas: &[u32]) -> usize {
        if !self.constrained {
            return 0;
        }
        let (spread, missing) = self.misses(replicas);
        spread + missing
    }

    /// The replica set's misses: pairs of replicas in one spread domain, and required zones
    /// without a replica.
    pub(crate) fn misses(&self, replicas: &[u32]) -> (usize, usize) {
        let mut spread = 0;
        if self.spread != Spread::None {
            for (i, &a) in replicas.iter().enumerate() {
                let d = self.domain(a);
                spread += replicas[..i].iter().filter(|&&b| self.domain(b) == d).count();
            }
        }
        let mut missing = 0;
        if self.required_count > 0 {
            let covered = replicas
                .iter()
                .enumerate()
                .filter(|&(i, &a)| {
                    let z = self.zone[a as usize];
                    self.required[z as usize] && replicas[..i].iter().all(|&b| self.zone[b as usize] != z)
                })
                .count();
            missing = self.required_count - covered;
        }
        (spread, missing)
    }

    /// How many spread domains (zones or racks, by the placement) have serving tasks.
    pub(crate) fn domains(&self) -> usize {
        match self.spread {
            Spread::Racks => self.groups,
            _ => distinct(&self.zone),
        }
    }

    /// The score of `replicas` with `drop` (if any) replaced by `add` (if any).
    pub(crate) fn score_after(&self, replicas: &[u32], drop: Option<u32>, add: Option<u32>) -> usize {
        if !self.constrained {
            return 0;
        }
        // Replica sets are small: no allocation for the common ones.
        let mut small = [0u32; 16];
        let mut large = Vec::new();
        let after: &mut [u32] = if replicas.len() < small.len() {
            &mut small[..]
        } else {
            large.resize(replicas.len() + 1, 0);
            &mut large[..]
        };
        let mut len = 0;
        for &r in replicas.iter().filter(|&&r| Some(r) != drop).chain(add.iter()) {
            after[len] = r;
            len += 1;
        }
        self.score(&after[..len])
    }
}

impl Layout {
    /// `count` replicas (positions) walking `order` from `start`: each next position in
    /// turn, passing over one that would leave the placement worse than the replicas left
    /// to choose can mend (so a walk that wraps round an order of zones does not put two
    /// replicas in one zone); when one walk round is not enough, the first positions not
    /// yet chosen. Without constraints: `order[start], order[start + 1], ...`, as before.
    pub(crate) fn spread_replicas(&self, order: &[u32], start: usize, count: usize) -> Vec<u32> {
        let n = order.len();
        let mut chosen: Vec<u32> = Vec::with_capacity(count.min(n));
        for strict in [true, false] {
            for k in 0..n {
                if chosen.len() == count {
                    return chosen;
                }
                let t = order[(start + k) % n];
                if chosen.contains(&t) {
                    continue;
                }
                if strict && self.constrained {
                    let (now, after) = (self.score(&chosen), self.score_after(&chosen, None, Some(t)));
                    let slots = count - chosen.len();
                    if !(after < now || (after == now && slots > now)) {
                        continue;
                    }
                }
                chosen.push(t);
            }
        }
        chosen
    }
}

/// `positions` round-robin over their `labels` (first the first position of each label,
/// in order of first appearance, then the second...), each label's positions first put in
/// order by `within`.
fn round_robin(labels: &[u32], positions: Vec<u32>, within: impl Fn(Vec<u32>) -> Vec<u32>) -> Vec<u32> {
    let mut buckets: Vec<(u32, Vec<u32>)> = Vec::new();
    for p in positions {
        let label = labels[p as usize];
        match buckets.iter_mut().find(|b| b.0 == label) {
            Some(b) => b.1.push(p),
            None => buckets.push((label, vec![p])),
        }
    }
    let buckets: Vec<Vec<u32>> = buckets.into_iter().map(|b| within(b.1)).collect();
    let longest = buckets.iter().map(Vec::len).max().unwrap_or(0);
    (0..longest).flat_map(|i| buckets.iter().filter_map(move |b| b.get(i).copied())).collect()
}

fn distinct(labels: &[u32]) -> usize {
    let mut seen: Vec<u32> = labels.to_vec();
    seen.sort_unstable();
    seen.dedup();
    seen.len()
}
