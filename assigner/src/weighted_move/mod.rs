//! [`WeightedMove`]: Slicer's weighted-move sharding algorithm, from "Slicer: Auto-Sharding
//! for Datacenter Applications" (OSDI 2016); `docs/slicer.md` has how steady runs it.
//!
//! One run, in phases:
//! 1. **Forced moves.** Replicas on tasks that are gone or draining are replaced by the
//!    least loaded serving tasks (heaviest slices first), keeping each slice's replica
//!    count. Not charged to any budget.
//! 2. **Replica limits and placement.** Slices with fewer than `min` replicas get replicas
//!    on the least loaded tasks; slices with more than `max` lose their replicas on the
//!    most loaded ones. Then slices whose replicas miss the [`crate::Placement`] (two in
//!    one zone under a spread, a zone without one under a replica per zone) have replicas
//!    replaced, one at a time, by the least loaded tasks that improve it. Also forced, so
//!    not charged either (the limits and constraints are configuration).
//!
//! Then, unless the imbalance is under [`WeightedMoveConfig::suppress_below`] (phases 3
//! and 4 only):
//!
//! 3. **Merges.** Left to right, two adjacent slices merge while there are more than
//!    `min_slices_per_task` slices per serving task, their combined load is below the
//!    mean slice load, no receiving task would end above the busiest task's load, and
//!    the key space moved in this phase stays within `merge_budget`. Slices with the
//!    same replicas merge for free; otherwise the smaller range moves onto the larger's
//!    replicas and its share of the key space is charged.
//! 4. **Weighted moves.** Repeatedly take the busiest task and, for each of its slices,
//!    score three moves: reassign the slice to the least loaded task, add a replica on
//!    the least loaded task (within `max`), or remove the busy task's replica (within
//!    `min`). Apply the move with the highest weight = benefit / cost, until no move has
//!    a positive benefit that fits in what is left of `move_budget`. When none does, a
//!    *displacing* move (ours, see `moves.rs`) may: the same reassignment or added replica
//!    onto one of the coldest tasks, with some of that task's other slices moved away
//!    so that no touched task ends above the goal: the new peak of the slice's own
//!    tasks, or the mean when that is higher; and under a placement, when that cannot
//!    either, a *swap*: the slice trades places with a lighter slice of a cold task (the
//!    move a slice bound to its zone needs when its zone's other tasks are full). Under a placement, "the least
//!    loaded task" is the least loaded one the slice's placement allows, and no move
//!    leaves a slice's placement worse than it was.
//! 5. **Splits.** Slices carrying at least `split_factor` times the mean slice load
//!    (measured when the phase starts) are split in place, hottest first, while there
//!    are fewer than `max_slices_per_task` slices per serving task.
//!
//! # Capacity
//!
//! Every load comparison is of load over capacity ([`crate::TaskProfile::capacity`]): a
//! task with capacity 2 is as loaded as one with capacity 1 when it carries twice the
//! load, and the imbalance is the busiest task's load over capacity against the job's
//! total load over total capacity. With every capacity 1 (the default) the arithmetic is
//! the paper's, to the last bit.
//!
//! # Choices the paper leaves open
//!
//! * **Benefit**: the drop of the peak load among the tasks the move touches (the busy
//!   task, the receiving task, and for a change of replica count every replica of the
//!   slice): `max(before) - max(after)`. Since the busy task is the busiest, a move
//!   with a positive benefit never raises the job's imbalance.
//! * **Cost**: the slice's share of the key space, for all three moves. Removing a
//!   replica moves no key to a new owner, but it changes the keys' owner set (clients
//!   still sending to the removed replica misroute), and it is what
//!   `steady_slice::Assignment::diff` counts, so the budget bounds the measured churn:
//!   the churn of a run is at most forced churn + `merge_budget` + `move_budget`.
//! * **Budget edge**: a move is applied only if it fits in the budget left, so a run
//!   never exceeds it; moves that do not fit are skipped in favour of smaller ones.
//! * **Local optima**: the paper's greedy search over single moves stalls when the
//!   hottest slices sit on tasks that no single move can relieve without overloading the
//!   receiver (a hot key on three replicas, every other task near the mean); the
//!   displacing move above escapes it within the same budget. It is only tried when no
//!   single move helps and the busiest task is above `suppress_below` times the mean,
//!   so on the paper's own cases the run is the paper's. A stall whose receiver cannot
//!   be cleared within one run's budget (load spread evenly over wide slices) is not
//!   escaped: letting half-cleared receivers through made the chaos test's tail worse.
//! * **Split point**: the load median of the slice where per-key load is known (the
//!   boundary before or after the key that reaches half the load, whichever is closer to
//!   half; repeated splits isolate a hot key), the midpoint of the range otherwise.
//! * **Suppression**: Slicer suppresses rebalancing when the busiest task is under 25%
//!   CPU, an absolute level we do not see. We compare the imbalance with
//!   `suppress_below` instead, default 1.05: with a threshold of 1.0 (never suppress)
//!   every run moves keys to chase noise (the simulator's figures:
//!   `docs/slicer.md#how-well-the-assigners-balance-the-sharding-simulation`).
//!   Suppressed runs skip merges and moves but still split hot slices, which moves no
//!   key: a quiet job publishes a few refinements and then nothing, and a later shift
//!   finds its hot keys already in slices of their own.
//! * **Initial assignment**: without a previous assignment the run starts from
//!   [`crate::initial`]'s fine-grained round-robin and applies phases 3 to 5 to it.

use std::time::Instant;

use crate::error::AssignError;
use crate::initial;
use crate::load::Load;
use crate::pieces::{pieces_of, Piece};
use crate::placement::layout::Layout;
use crate::report::{finish, Moves, Outcome, RunNotes};
use crate::{serving_of, Assigner, RunInput};

mod cold;
mod forced;
mod moves;

use cold::ColdIndex;

/// Weighted-move's constants; the defaults are the paper's.
#[derive(Debug, Clone, PartialEq)]
pub struct WeightedMoveConfig {
    /// Merges stop at this many slices per serving task (paper: 50).
    pub min_slices_per_task: usize,
    /// Splits stop at this many slices per serving task (paper: 150).
    pub max_slices_per_task: usize,
    /// The key-space share merges may move per run (paper: 1%).
    pub merge_budget: f64,
    /// The key-space share weighted moves may move per run (paper: 9%).
    pub move_budget: f64,
    /// A slice is split when its load is at least this times the mean slice load
    /// (paper: 2).
    pub split_factor: f64,
    /// Nothing moves (merges and moves; splits go on) while the imbalance is below this
    /// (default 1.05; 1.0 never suppresses; see the module documentation).
    pub suppress_below: f64,
    /// Slices per task of the initial assignment (Slicer's static model: 100).
    pub initial_slices_per_task: usize,
    /// A bound on weighted moves per run, so a run's time is bounded even with a budget
    /// too large for the slices' sizes (default 100,000).
    pub max_moves: usize,
}

impl Default for WeightedMoveConfig {
    fn default() -> Self {
        Self {
            min_slices_per_task: 50,
            max_slices_per_task: 150,
            merge_budget: 0.01,
            move_budget: 0.09,
            split_factor: 2.0,
            suppress_below: 1.05,
            initial_slices_per_task: initial::SLICES_PER_TASK,
            max_moves: 100_000,
        }
    }
}

impl WeightedMoveConfig {
    /// Checks every field's range.
    ///
    /// # Errors
    ///
    /// [`AssignError::BadConfig`] naming the first field out of range.
    pub fn validate(&self) -> Result<(), AssignError> {
        let bad = |field, expected| Err(AssignError::BadConfig { field, expected });
        let fraction = |x: f64| x.is_finite() && (0.0..=1.0).contains(&x);
        if self.max_slices_per_task < self.min_slices_per_task {
            return bad("max_slices_per_task", "at least min_slices_per_task");
        }
        if !fraction(self.merge_budget) {
            return bad("merge_budget", "a fraction of the key space in [0, 1]");
        }
        if !fraction(self.move_budget) {
            return bad("move_budget", "a fraction of the key space in [0, 1]");
        }
        if !(self.split_factor.is_finite() && self.split_factor >= 1.0) {
            return bad("split_factor", "a finite number at least 1");
        }
        if !(self.suppress_below.is_finite() && self.suppress_below >= 0.0) {
            return bad("suppress_below", "a finite non-negative imbalance");
        }
        if self.initial_slices_per_task == 0 {
            return bad("initial_slices_per_task", "at least 1");
        }
        Ok(())
    }
}

/// Slicer's weighted-move assigner; see the module documentation for the phases.
///
/// Cost: phases 1 to 3 and 5 are `O(slices * tasks)` at worst; phase 4 is
/// `O(moves * slices per task * replicas)`.
#[derive(Debug, Clone, Default)]
pub struct WeightedMove {
    config: WeightedMoveConfig,
}

impl WeightedMove {
    /// An assigner with `config`.
    ///
    /// # Errors
    ///
    /// As [`WeightedMoveConfig::validate`].
    pub fn new(config: WeightedMoveConfig) -> Result<Self, AssignError> {
        config.validate()?;
        Ok(Self { config })
    }

    /// Its configuration.
    pub fn config(&self) -> &WeightedMoveConfig {
        &self.config
    }
}

impl Assigner for WeightedMove {
    fn name(&self) -> &'static str {
        "weighted-move"
    }

    fn assign(&self, input: &RunInput<'_>) -> Result<Outcome, AssignError> {
        let started = Instant::now();
        let layout = Layout::new(input.tasks, serving_of(input.tasks)?, input.placement, input.replicas);
        let pieces = match input.previous {
            Some(previous) => pieces_of(previous, input.load),
            None => {
                let order = layout.spread_order();
                let tasks: Vec<u32> = order.iter().map(|&p| layout.serving[p as usize]).collect();
                initial::round_robin(&tasks, self.config.initial_slices_per_task, layout.min_r, input.load)
            }
        };
        let mut run = Run::new(&self.config, &layout, pieces, input.load);
        run.fit_replica_counts();
        run.repair_placement();
        run.cold = None;
        let suppressed = run.imbalance() < self.config.suppress_below;
        if !suppressed {
            run.merge_cold_neighbours();
            run.weighted_moves();
        }
        // Splits move no key, so they go on under suppression: the next imbalance then
        // finds hot keys already in slices of their own.
        run.split_hot_slices();
        // Back from positions among the serving tasks to task indices.
        for p in &mut run.pieces {
            for r in &mut p.replicas {
                *r = layout.serving[*r as usize];
            }
        }
        let notes = RunNotes {
            moves: run.moves,
            forced_churn: run.forced_churn,
            suppressed,
            count_changed_ranges: false,
        };
        finish(self.name(), input, &layout, &run.pieces, notes, started)
    }
}

/// The state of one run. Replicas are positions in the serving task list, so task loads
/// are a plain vector.
#[derive(Debug)]
struct Run<'a> {
    config: &'a WeightedMoveConfig,
    layout: &'a Layout,
    pieces: Vec<Piece>,
    /// Each position's utilisation: its load over its capacity.
    loads: Vec<f64>,
    min_r: usize,
    max_r: usize,
    load: &'a Load,
    moves: Moves,
    forced_churn: f64,
    /// The least loaded task of each group, kept current through the forced phases
    /// (dropped before the load moves, which track loads their own way).
    cold: Option<ColdIndex>,
}

impl<'a> Run<'a> {
    /// Phase 1: maps replicas to serving positions, replacing those on tasks that are
    /// not serving by the least loaded serving tasks the placement allows, heaviest
    /// slices first.
    fn new(
        config: &'a WeightedMoveConfig,
        layout: &'a Layout,
        mut pieces: Vec<Piece>,
        load: &'a Load,
    ) -> Self {
        let serving = &layout.serving;
        let (min_r, max_r) = (layout.min_r, layout.max_r);
        let mut lost = Vec::new();
        for (i, p) in pieces.iter_mut().enumerate() {
            let wanted = p.replicas.len();
            p.replicas =
                p.replicas.iter().filter_map(|t| serving.binary_search(t).ok().map(|x| x as u32)).collect();
            if p.replicas.len() < wanted {
                lost.push((i, wanted));
            }
        }
        let mut loads = vec![0.0; serving.len()];
        for p in &pieces {
            for &r in &p.replicas {
                loads[r as usize] += p.per_replica() * layout.inverse[r as usize];
            }
        }
        let mut run = Self {
            config,
            layout,
            pieces,
            loads,
            min_r,
            max_r,
            load,
            moves: Moves::default(),
            forced_churn: 0.0,
            cold: None,
        };
        run.cold = Some(ColdIndex::new(layout, &run.loads));
        lost.sort_by(|a, b| run.pieces[b.0].load.total_cmp(&run.pieces[a.0].load));
        for (i, wanted) in lost {
            let target = wanted.clamp(min_r, max_r);
            let mut replicas = run.pieces[i].replicas.clone();
            while replicas.len() < target {
                let Some(cold) = run.best_target(&replicas, None) else { break };
                replicas.push(cold);
                run.moves.forced += 1;
            }
            run.forced_churn += run.pieces[i].fraction();
            run.set_replicas(i, replicas);
        }
        run
    }

    /// The utilisation of a perfect balance: the job's total load over its total capacity.
    /// (Computed from the task loads, in their order: with every capacity 1 it is the sum
    /// of the loads over their number, the paper's mean, to the last bit.)
    fn mean(&self) -> f64 {
        let total: f64 = self.loads.iter().zip(&self.layout.capacity).map(|(u, c)| u * c).sum();
        total / self.layout.capacity.iter().sum::<f64>()
    }

    /// The busiest task's utilisation over the mean utilisation (1 without load).
    fn imbalance(&self) -> f64 {
        let mean = self.mean();
        if self.loads.is_empty() || mean.is_nan() || mean <= 0.0 {
            return 1.0;
        }
        self.loads.iter().copied().fold(0.0, f64::max) / mean
    }

    /// Phase 3: merges adjacent cold slices, left to right, within the merge budget.
    fn merge_cold_neighbours(&mut self) {
        let n = self.loads.len();
        let total: f64 = self.pieces.iter().map(|p| p.load).sum();
        let floor = self.config.min_slices_per_task.saturating_mul(n);
        if self.pieces.len() <= floor {
            return;
        }
        let mut used = 0.0;
        let mut count = self.pieces.len();
        let mut merged: Vec<Piece> = Vec::with_capacity(count);
        for next in std::mem::take(&mut self.pieces) {
            let Some(last) = merged.last_mut() else {
                merged.push(next);
                continue;
            };
            let combined = last.load + next.load;
            if count <= floor || combined >= total / count as f64 {
                merged.push(next);
                continue;
            }
            if same_set(&last.replicas, &next.replicas) {
                last.end = next.end;
                last.load = combined;
                count -= 1;
                self.moves.merged += 1;
                continue;
            }
            // The smaller range moves onto the larger's replicas.
            let (mover, receiver) =
                if next.fraction() <= last.fraction() { (&next, &*last) } else { (&*last, &next) };
            let cost = mover.fraction();
            let gain = mover.load / receiver.replicas.len() as f64;
            let max = self.loads.iter().copied().fold(0.0, f64::max);
            let inverse = &self.layout.inverse;
            let fits = used + cost <= self.config.merge_budget
                && receiver.replicas.iter().all(|&r| {
                    let shed = if mover.replicas.contains(&r) { mover.per_replica() } else { 0.0 };
                    self.loads[r as usize] + gain * inverse[r as usize] - shed * inverse[r as usize] <= max
                });
            if !fits {
                merged.push(next);
                continue;
            }
            for &r in &mover.replicas {
                self.loads[r as usize] -= mover.per_replica() * inverse[r as usize];
            }
            for &r in &receiver.replicas {
                self.loads[r as usize] += gain * inverse[r as usize];
            }
            let replicas = receiver.replicas.clone();
            used += cost;
            last.end = next.end;
            last.load = combined;
            last.replicas = replicas;
            count -= 1;
            self.moves.merged += 1;
        }
        self.pieces = merged;
    }

    /// Phase 5: splits hot slices in place (same replicas), hottest first.
    fn split_hot_slices(&mut self) {
        let limit = self.config.max_slices_per_task.saturating_mul(self.loads.len());
        let total: f64 = self.pieces.iter().map(|p| p.load).sum();
        if total <= 0.0 || self.pieces.is_empty() {
            return;
        }
        let threshold = self.config.split_factor * total / self.pieces.len() as f64;
        // Each pass splits every hot slice once; a hot key is isolated in a few passes.
        for _ in 0..64 {
            if self.pieces.len() >= limit {
                return;
            }
            let mut hot: Vec<(usize, u64)> = (0..self.pieces.len())
                .filter(|&i| self.pieces[i].load >= threshold)
                .filter_map(|i| {
                    self.load.split_point(self.pieces[i].start, self.pieces[i].end).map(|s| (i, s))
                })
                .collect();
            if hot.is_empty() {
                return;
            }
            hot.sort_by(|a, b| self.pieces[b.0].load.total_cmp(&self.pieces[a.0].load));
            hot.truncate(limit - self.pieces.len());
            hot.sort_unstable_by_key(|h| h.0);
            let mut split = Vec::with_capacity(self.pieces.len() + hot.len());
            let mut next = hot.iter().peekable();
            for (i, p) in std::mem::take(&mut self.pieces).into_iter().enumerate() {
                match next.peek() {
                    Some(&&(j, at)) if j == i => {
                        next.next();
                        let left = Piece {
                            start: p.start,
                            end: u128::from(at),
                            replicas: p.replicas.clone(),
                            load: self.load.between(p.start, u128::from(at)),
                        };
                        let right = Piece { start: at, end: p.end, load: (p.load - left.load).max(0.0), ..p };
                        split.push(left);
                        split.push(right);
                        self.moves.split += 1;
                    }
                    _ => split.push(p),
                }
            }
            self.pieces = split;
        }
    }

    /// Gives piece `i` the replicas `replicas`, moving its load between tasks.
    fn set_replicas(&mut self, i: usize, replicas: Vec<u32>) {
        let inverse = &self.layout.inverse;
        let p = &mut self.pieces[i];
        let old = p.per_replica();
        for &r in &p.replicas {
            self.loads[r as usize] -= old * inverse[r as usize];
        }
        let old_replicas = std::mem::replace(&mut p.replicas, replicas);
        let new = p.per_replica();
        for &r in &p.replicas {
            self.loads[r as usize] += new * inverse[r as usize];
        }
        if let Some(cold) = self.cold.as_mut() {
            for &r in old_replicas.iter().chain(&self.pieces[i].replicas) {
                cold.update(self.layout.group[r as usize], r, self.loads[r as usize]);
            }
        }
    }
}

fn same_set(a: &[u32], b: &[u32]) -> bool {
    a.len() == b.len() && a.iter().all(|x| b.contains(x))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::{Placement, Spread, TaskProfile};
    use crate::{ReplicaLimits, Tasks};

    /// The forced phases' heap finds the task a scan finds, through loads that change.
    #[test]
    fn the_cold_index_chooses_as_the_scan_does() {
        let mut tasks = Tasks::serving(0..30).unwrap();
        for t in 0..30 {
            let profile = TaskProfile::in_zone(format!("z{}", t % 3)).rack(format!("r{}", t % 2));
            tasks.set_profile(t, profile.capacity(1.0 + f64::from(t % 4))).unwrap();
        }
        let placement = Placement { spread: Spread::Racks, replica_per_zone: true, zones: Vec::new() };
        let layout = Layout::new(&tasks, tasks.serving_ids(), &placement, ReplicaLimits::new(1, 4).unwrap());
        let config = WeightedMoveConfig::default();
        let load = Load::none().with_uniform(1000.0).unwrap();
        let pieces = initial::round_robin(&layout.serving, 20, 2, &load);
        let mut run = Run::new(&config, &layout, pieces, &load);
        let mut rng = 0x9E37_79B9_7F4A_7C15u64;
        for step in 0..400 {
            rng = rng.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            let i = (rng >> 33) as usize % run.pieces.len();
            let replicas = run.pieces[i].replicas.clone();
            let drop = replicas.get((rng >> 20) as usize % (replicas.len() + 1)).copied();
            let indexed = run.best_target(&replicas, drop);
            let cold = run.cold.take();
            let scanned = run.best_target(&replicas, drop);
            run.cold = cold;
            assert_eq!(indexed, scanned, "step {step}");
            // Give the slice to the chosen task (loads change both ways).
            let mut next: Vec<u32> = replicas.iter().copied().filter(|&r| Some(r) != drop).collect();
            next.extend(indexed);
            run.set_replicas(i, next);
        }
    }
}
