//! Phase 4 of weighted-move: the best-weighted move off the busiest task, again and
//! again, within the move budget; and, when no single move helps, a move that clears
//! room on its receiver first, or a swap of two slices.
//!
//! Under a placement, each move's receiver is the coldest task the slice's placement
//! allows among the coldest task of every group (zone and rack), so a slice bound to its
//! zone still finds the coldest task there; a swap is what moves load when the only tasks
//! a slice may go to are as busy as the slice is heavy.
//!
//! # Why the second kind of move
//!
//! Slicer's three moves are judged one at a time, and a greedy search over them stops at
//! a local optimum that skewed load reaches often: say the hottest key sits alone on
//! three tasks at 1.37 times the mean load each, and every other task is a little under
//! the mean. A fourth replica would bring the three down to 1.03, but the task that takes
//! it would carry its own load plus a quarter of the key, well above 1.37; so no single
//! move lowers the peak and the run ends at 1.37 for as long as the load stays. (The
//! simulator's reaction experiment, `steady-lab sharding --scenario slicer`, stalled
//! there after half of the hot-key shifts.)
//!
//! A *displacing* move is a reassignment or an added replica onto a cold task together
//! with reassignments of that task's other slices to other tasks, chosen so that every
//! task it touches ends at or below the goal: the new peak of the slice's own tasks, or
//! the mean when that is higher (and so below the old peak). It is tried only when no single move helps,
//! its cost is the key space of every slice it moves, and it obeys the same budget, so
//! the run's churn stays within `move_budget` and the peak never rises.

use super::Run;

/// The two moves that give load to a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Give {
    /// The slice's replica on the busy task moves to the receiver.
    Reassign,
    /// The receiver becomes one more replica of the slice.
    AddReplica,
}

/// One step of phase 4.
#[derive(Debug, Clone, PartialEq)]
enum Move {
    /// A move that gives a slice's load to the receiver.
    Give {
        slice: usize,
        kind: Give,
        to: usize,
        /// Reassignments that clear room on `to` first: `(slice, task)`; empty for a
        /// plain Slicer move.
        displaced: Vec<(usize, usize)>,
    },
    /// The busy task's replica is removed; the slice's other replicas take its share.
    RemoveReplica { slice: usize },
    /// The busy task's replica of `slice` and `to`'s replica of `with` trade places.
    Swap { slice: usize, with: usize, to: usize },
}

/// A move with its weight (benefit / cost) and cost (key-space share).
#[derive(Debug, Clone, PartialEq)]
struct Scored {
    weight: f64,
    cost: f64,
    step: Move,
}

/// A displacing move to score: slice `slice` of task `hot` given to `to` by `kind`,
/// clearing room on `to` by moving its slices `clearing` (in that order) to the coldest
/// tasks (`by_load`: every task, coldest first, before the move).
#[derive(Debug, Clone, Copy)]
struct Displacing<'a> {
    hot: usize,
    slice: usize,
    kind: Give,
    to: usize,
    clearing: &'a [usize],
    by_load: &'a [usize],
}

/// How many of the coldest tasks a displacing move or a swap tries as its receiver.
const DISPLACING_RECEIVERS: usize = 4;

/// How many groups' coldest tasks a displacing move or a swap tries besides.
const MAX_GROUP_RECEIVERS: usize = 8;

impl Run<'_> {
    /// Phase 4: see the module documentation.
    pub(super) fn weighted_moves(&mut self) {
        let n = self.loads.len();
        if n < 2 {
            return;
        }
        let mut on: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (i, p) in self.pieces.iter().enumerate() {
            for &r in &p.replicas {
                on[r as usize].push(i);
            }
        }
        let total: f64 = self.loads.iter().sum();
        let epsilon = 1e-12 * (total / n as f64).max(f64::MIN_POSITIVE);
        let mean = self.mean();
        let mut used = 0.0;
        for _ in 0..self.config.max_moves {
            let hot = argmax(&self.loads);
            let cold = argmin(&self.loads);
            if self.loads[hot] - self.loads[cold] <= epsilon {
                break;
            }
            let left = self.config.move_budget - used;
            // Where load may go: the coldest task, and under constraints the coldest task
            // of every group (zone and rack), so that each slice finds the coldest task
            // its placement allows.
            let targets = self.targets(cold);
            // Displacing moves and swaps escape stalls above the suppression threshold;
            // below it the job is balanced enough, and they cost far more to search than
            // single moves.
            let stalled = self.loads[hot] >= self.config.suppress_below * mean;
            let best = self.best_single_move(hot, &targets, &on, left, epsilon).or_else(|| {
                if !stalled {
                    return None;
                }
                let receivers = self.receivers(hot, &targets);
                // Swaps only under a placement, where slices bound to their zone need them:
                // without one, a run is what it was before placements existed.
                self.best_displacing_move(hot, &receivers, &on, left, mean).or_else(|| {
                    self.layout
                        .constrained
                        .then(|| self.best_swap(hot, &receivers, &on, left, epsilon))
                        .flatten()
                })
            });
            let Some(best) = best else { break };
            used += best.cost;
            self.apply(hot, best.step, &mut on);
        }
    }

    /// The positions load may move to, coldest first: `cold` alone without constraints,
    /// else the coldest position of each group.
    fn targets(&self, cold: usize) -> Vec<usize> {
        let layout = self.layout;
        if !layout.constrained {
            return vec![cold];
        }
        let mut coldest: Vec<Option<usize>> = vec![None; layout.groups];
        for t in 0..self.loads.len() {
            let c = &mut coldest[layout.group[t] as usize];
            if c.is_none_or(|c| self.loads[t] < self.loads[c]) {
                *c = Some(t);
            }
        }
        let mut targets: Vec<usize> = coldest.into_iter().flatten().collect();
        targets.sort_by(|&a, &b| self.loads[a].total_cmp(&self.loads[b]).then(a.cmp(&b)));
        targets
    }

    /// The receivers a displacing move or a swap tries: the few coldest tasks, and under
    /// constraints the coldest of each group too (few groups: zones, racks).
    fn receivers(&self, hot: usize, targets: &[usize]) -> Vec<usize> {
        let mut receivers: Vec<usize> = (0..self.loads.len()).filter(|&t| t != hot).collect();
        receivers.sort_by(|&a, &b| self.loads[a].total_cmp(&self.loads[b]).then(a.cmp(&b)));
        receivers.truncate(DISPLACING_RECEIVERS);
        for &t in targets.iter().take(MAX_GROUP_RECEIVERS) {
            if t != hot && !receivers.contains(&t) {
                receivers.push(t);
            }
        }
        receivers
    }

    /// Slicer's three moves for each slice of `hot`, the best by weight: each gives load
    /// to the coldest of `targets` that the slice's placement allows (a move never makes
    /// a slice's placement worse).
    fn best_single_move(
        &self,
        hot: usize,
        targets: &[usize],
        on: &[Vec<usize>],
        left: f64,
        epsilon: f64,
    ) -> Option<Scored> {
        let layout = self.layout;
        let inverse = &layout.inverse;
        let lh = self.loads[hot];
        let mut best: Option<Scored> = None;
        for &i in &on[hot] {
            let p = &self.pieces[i];
            let cost = p.fraction();
            if p.load <= 0.0 || cost > left {
                continue;
            }
            let r = p.replicas.len();
            let share = p.per_replica();
            let score = layout.score(&p.replicas);
            let allowed = |drop: Option<u32>| {
                targets.iter().copied().find(|&c| {
                    !p.replicas.contains(&(c as u32))
                        && layout.score_after(&p.replicas, drop, Some(c as u32)) <= score
                })
            };
            let mut consider = |benefit: f64, step: Move| {
                if benefit > epsilon && best.as_ref().is_none_or(|b| benefit / cost > b.weight) {
                    best = Some(Scored { weight: benefit / cost, cost, step });
                }
            };
            let give = |kind, to| Move::Give { slice: i, kind, to, displaced: Vec::new() };
            if let Some(c) = allowed(Some(hot as u32)) {
                let lc = self.loads[c];
                consider(
                    lh - (lh - share * inverse[hot]).max(lc + share * inverse[c]),
                    give(Give::Reassign, c),
                );
            }
            if r < self.max_r {
                if let Some(c) = allowed(None) {
                    let lc = self.loads[c];
                    let new_share = p.load / (r + 1) as f64;
                    let drop = share - new_share;
                    let peak = p
                        .replicas
                        .iter()
                        .map(|&x| self.loads[x as usize] - drop * inverse[x as usize])
                        .fold(lc + new_share * inverse[c], f64::max);
                    consider(lh - peak, give(Give::AddReplica, c));
                }
            }
            if r > self.min_r && layout.score_after(&p.replicas, Some(hot as u32), None) <= score {
                let gain = p.load / (r - 1) as f64 - share;
                let peak = p
                    .replicas
                    .iter()
                    .filter(|&&x| x as usize != hot)
                    .map(|&x| self.loads[x as usize] + gain * inverse[x as usize])
                    .fold(lh - share * inverse[hot], f64::max);
                consider(lh - peak, Move::RemoveReplica { slice: i });
            }
        }
        best
    }

    /// The best displacing move off `hot` (see the module documentation), trying
    /// `receivers`.
    fn best_displacing_move(
        &self,
        hot: usize,
        receivers: &[usize],
        on: &[Vec<usize>],
        left: f64,
        mean: f64,
    ) -> Option<Scored> {
        // Each receiver's slices that carry load, those with the most load per key first:
        // the order in which a displacing move clears room on it.
        let density =
            |j: usize| self.pieces[j].per_replica() / self.pieces[j].fraction().max(f64::MIN_POSITIVE);
        let clearing: Vec<Vec<usize>> = receivers
            .iter()
            .map(|&to| {
                let mut mine: Vec<usize> =
                    on[to].iter().copied().filter(|&j| self.pieces[j].per_replica() > 0.0).collect();
                mine.sort_by(|&a, &b| density(b).total_cmp(&density(a)).then(a.cmp(&b)));
                mine
            })
            .collect();
        // Every task, coldest first: where displaced slices look for room.
        let mut by_load: Vec<usize> = (0..self.loads.len()).collect();
        by_load.sort_by(|&a, &b| self.loads[a].total_cmp(&self.loads[b]).then(a.cmp(&b)));
        let mut best: Option<Scored> = None;
        for &i in &on[hot] {
            let p = &self.pieces[i];
            if p.load <= 0.0 || p.fraction() > left {
                continue;
            }
            let score = self.layout.score(&p.replicas);
            for (&to, clearing) in receivers.iter().zip(&clearing) {
                if p.replicas.contains(&(to as u32)) {
                    continue;
                }
                for kind in [Give::Reassign, Give::AddReplica] {
                    if kind == Give::AddReplica && p.replicas.len() >= self.max_r {
                        continue;
                    }
                    let drop = (kind == Give::Reassign).then_some(hot as u32);
                    if self.layout.score_after(&p.replicas, drop, Some(to as u32)) > score {
                        continue;
                    }
                    let m = Displacing { hot, slice: i, kind, to, clearing, by_load: &by_load };
                    let Some(scored) = self.displacing(m, left, mean) else { continue };
                    if best.as_ref().is_none_or(|b| scored.weight > b.weight) {
                        best = Some(scored);
                    }
                }
            }
        }
        best
    }

    /// The displacing move `m` (see [`Displacing`]): slice `m.slice` given to `m.to`
    /// with the receiver's other slices moved away until it ends at or below the goal:
    /// the new peak of the slice's own tasks, or the mean when that is higher. Each
    /// displaced slice goes to the coldest task it fits on within the goal. `None` when
    /// the receiver cannot reach the goal within `left` or the peak would not fall.
    fn displacing(&self, m: Displacing<'_>, left: f64, mean: f64) -> Option<Scored> {
        let Displacing { hot, slice: i, kind, to, clearing, by_load } = m;
        let p = &self.pieces[i];
        let lh = self.loads[hot];
        // Load changes so far, per task: few tasks are touched, so a short list serves.
        let mut delta: Vec<(usize, f64)> = Vec::new();
        let add = |delta: &mut Vec<(usize, f64)>, t: usize, d: f64| match delta.iter_mut().find(|e| e.0 == t)
        {
            Some(e) => e.1 += d,
            None => delta.push((t, d)),
        };
        let inverse = &self.layout.inverse;
        let share = p.per_replica();
        let gained = match kind {
            Give::Reassign => {
                add(&mut delta, hot, -share * inverse[hot]);
                share
            }
            Give::AddReplica => {
                let new_share = p.load / (p.replicas.len() + 1) as f64;
                for &x in &p.replicas {
                    add(&mut delta, x as usize, (new_share - share) * inverse[x as usize]);
                }
                new_share
            }
        };
        let after = |delta: &[(usize, f64)], t: usize| {
            self.loads[t] + delta.iter().filter(|e| e.0 == t).map(|e| e.1).sum::<f64>()
        };
        let goal = delta.iter().map(|&(t, _)| after(&delta, t)).fold(mean, f64::max);
        if goal >= lh {
            return None;
        }
        add(&mut delta, to, gained * inverse[to]);
        let mut cost = p.fraction();
        let mut displaced = Vec::new();
        for &j in clearing.iter().filter(|&&j| j != i) {
            if after(&delta, to) <= goal {
                break;
            }
            let q = &self.pieces[j];
            if cost + q.fraction() > left {
                continue;
            }
            // The coldest eligible task: among those already touched (their loads have
            // changed) and the first untouched one in load order.
            let score = self.layout.score(&q.replicas);
            let eligible = |t: usize| {
                t != to
                    && !q.replicas.contains(&(t as u32))
                    && self.layout.score_after(&q.replicas, Some(to as u32), Some(t as u32)) <= score
            };
            let untouched = by_load.iter().copied().find(|&t| eligible(t) && delta.iter().all(|e| e.0 != t));
            let Some(d) = delta
                .iter()
                .map(|e| e.0)
                .filter(|&t| eligible(t))
                .chain(untouched)
                .min_by(|&a, &b| after(&delta, a).total_cmp(&after(&delta, b)).then(a.cmp(&b)))
            else {
                continue;
            };
            let moved = q.per_replica();
            if after(&delta, d) + moved * inverse[d] > goal {
                continue;
            }
            add(&mut delta, to, -moved * inverse[to]);
            add(&mut delta, d, moved * inverse[d]);
            cost += q.fraction();
            displaced.push((j, d));
        }
        // Every touched task within the goal (a receiver that could not be cleared in
        // this run's budget is not taken: half-cleared receivers left worse starting
        // points for the next load in the chaos test), and the peak truly lower.
        let peak = delta.iter().map(|&(t, _)| after(&delta, t)).fold(0.0, f64::max);
        if peak > goal * (1.0 + 1e-12) || peak >= lh * (1.0 - 1e-12) || cost <= 0.0 {
            return None;
        }
        Some(Scored { weight: (lh - peak) / cost, cost, step: Move::Give { slice: i, kind, to, displaced } })
    }

    /// The best swap off `hot`: one of its slices exchanged with a lighter slice of one
    /// of `receivers`, where neither single move fits (the receiver would end above the
    /// busy task, or the placement forbids the plain move: a slice bound to its zone can
    /// only trade places within it). Both slices' placements must stay as good; the cost
    /// is both slices' key space.
    fn best_swap(
        &self,
        hot: usize,
        receivers: &[usize],
        on: &[Vec<usize>],
        left: f64,
        epsilon: f64,
    ) -> Option<Scored> {
        let layout = self.layout;
        let inverse = &layout.inverse;
        let lh = self.loads[hot];
        let mut best: Option<Scored> = None;
        for &to in receivers {
            let lt = self.loads[to];
            for &i in &on[hot] {
                let p = &self.pieces[i];
                if p.load <= 0.0 || p.fraction() >= left || p.replicas.contains(&(to as u32)) {
                    continue;
                }
                if layout.score_after(&p.replicas, Some(hot as u32), Some(to as u32))
                    > layout.score(&p.replicas)
                {
                    continue;
                }
                let si = p.per_replica();
                for &j in &on[to] {
                    let q = &self.pieces[j];
                    let sj = q.per_replica();
                    let cost = p.fraction() + q.fraction();
                    if sj >= si || cost > left || q.replicas.contains(&(hot as u32)) {
                        continue;
                    }
                    let peak = (lh + (sj - si) * inverse[hot]).max(lt + (si - sj) * inverse[to]);
                    let benefit = lh - peak;
                    if benefit <= epsilon || best.as_ref().is_some_and(|b| benefit / cost <= b.weight) {
                        continue;
                    }
                    if layout.score_after(&q.replicas, Some(to as u32), Some(hot as u32))
                        > layout.score(&q.replicas)
                    {
                        continue;
                    }
                    best = Some(Scored {
                        weight: benefit / cost,
                        cost,
                        step: Move::Swap { slice: i, with: j, to },
                    });
                }
            }
        }
        best
    }

    /// Applies `step`, keeping `on` (the slices on each task) current.
    fn apply(&mut self, hot: usize, step: Move, on: &mut [Vec<usize>]) {
        match step {
            Move::Give { slice, kind, to, displaced } => {
                for (j, d) in displaced {
                    self.reassign(j, to, d, on);
                }
                match kind {
                    Give::Reassign => self.reassign(slice, hot, to, on),
                    Give::AddReplica => {
                        let mut replicas = self.pieces[slice].replicas.clone();
                        replicas.push(to as u32);
                        on[to].push(slice);
                        self.moves.replicas_added += 1;
                        self.set_replicas(slice, replicas);
                    }
                }
            }
            Move::Swap { slice, with, to } => {
                self.reassign(slice, hot, to, on);
                self.reassign(with, to, hot, on);
                self.moves.swapped += 1;
            }
            Move::RemoveReplica { slice } => {
                let mut replicas = self.pieces[slice].replicas.clone();
                replicas.retain(|&x| x as usize != hot);
                remove_value(&mut on[hot], slice);
                self.moves.replicas_removed += 1;
                self.set_replicas(slice, replicas);
            }
        }
    }

    /// Moves slice `i`'s replica from task `from` to task `to`.
    fn reassign(&mut self, i: usize, from: usize, to: usize, on: &mut [Vec<usize>]) {
        let mut replicas = self.pieces[i].replicas.clone();
        let at = replicas.iter().position(|&x| x as usize == from).expect("the slice is on `from`");
        replicas[at] = to as u32;
        remove_value(&mut on[from], i);
        on[to].push(i);
        self.moves.moved += 1;
        self.set_replicas(i, replicas);
    }
}

fn argmax(loads: &[f64]) -> usize {
    (0..loads.len()).max_by(|&a, &b| loads[a].total_cmp(&loads[b]).then(b.cmp(&a))).unwrap_or(0)
}

fn argmin(loads: &[f64]) -> usize {
    (0..loads.len()).min_by(|&a, &b| loads[a].total_cmp(&loads[b]).then(a.cmp(&b))).unwrap_or(0)
}

fn remove_value(list: &mut Vec<usize>, value: usize) {
    if let Some(at) = list.iter().position(|&x| x == value) {
        list.swap_remove(at);
    }
}
