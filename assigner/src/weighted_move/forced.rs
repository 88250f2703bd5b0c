//! Phase 2 of weighted-move (phase 1 is `Run::new`): replica counts within the limits,
//! and slices repaired to meet the placement, both forced (not charged to the budget);
//! and where a forced replica goes, found through the `ColdIndex` while it is there.

use super::Run;

impl Run<'_> {
    /// Phase 2: every slice's replica count within `[min_r, max_r]`.
    pub(super) fn fit_replica_counts(&mut self) {
        for i in 0..self.pieces.len() {
            let mut replicas = self.pieces[i].replicas.clone();
            if replicas.len() >= self.min_r && replicas.len() <= self.max_r {
                continue;
            }
            while replicas.len() < self.min_r {
                let Some(cold) = self.best_target(&replicas, None) else { break };
                replicas.push(cold);
                self.moves.forced += 1;
            }
            while replicas.len() > self.max_r {
                // The replica whose removal leaves the best placement, the busiest of those.
                let layout = self.layout;
                let drop = (0..replicas.len())
                    .max_by(|&a, &b| {
                        let score = |x: usize| layout.score_after(&replicas, Some(replicas[x]), None);
                        score(b).cmp(&score(a)).then(
                            self.loads[replicas[a] as usize].total_cmp(&self.loads[replicas[b] as usize]),
                        )
                    })
                    .expect("more than max_r >= 1 replicas");
                replicas.swap_remove(drop);
                self.moves.forced += 1;
            }
            self.forced_churn += self.pieces[i].fraction();
            self.set_replicas(i, replicas);
        }
    }

    /// Phase 2, continued: slices whose replicas miss the placement (a spread domain used
    /// twice, a required zone without a replica) get replicas replaced, one at a time, by
    /// the least loaded tasks that improve it, until they meet it or nothing improves it
    /// (an infeasible placement: the best the task set allows). Forced, like phase 1.
    pub(super) fn repair_placement(&mut self) {
        if !self.layout.constrained {
            return;
        }
        for i in 0..self.pieces.len() {
            let mut replicas = self.pieces[i].replicas.clone();
            let mut score = self.layout.score(&replicas);
            if score == 0 {
                continue;
            }
            let mut changed = false;
            while score > 0 {
                // The replacement that improves the placement most, onto the least loaded.
                let mut best: Option<(usize, usize, u32)> = None;
                for x in 0..replicas.len() {
                    let drop = replicas[x];
                    let Some(to) = self.best_target(&replicas, Some(drop)) else { continue };
                    let candidate = (self.layout.score_after(&replicas, Some(drop), Some(to)), x, to);
                    let better = best.is_none_or(|b| {
                        let load = |t: u32| self.loads[t as usize];
                        candidate.0.cmp(&b.0).then(load(to).total_cmp(&load(b.2))).is_lt()
                    });
                    if better {
                        best = Some(candidate);
                    }
                }
                let Some((after, x, to)) = best.filter(|b| b.0 < score) else { break };
                replicas[x] = to;
                score = after;
                changed = true;
                self.moves.forced += 1;
            }
            if changed {
                self.forced_churn += self.pieces[i].fraction();
                self.set_replicas(i, replicas);
            }
        }
    }

    /// The position to give a replica of a slice whose replicas are `replicas`, with
    /// `drop` (one of them) leaving: among the positions not in `replicas`, one that
    /// leaves the best placement, the least loaded of those. `O(groups * r^2 + tasks)`.
    pub(super) fn best_target(&mut self, replicas: &[u32], drop: Option<u32>) -> Option<u32> {
        let layout = self.layout;
        let score = |g: usize| {
            if layout.constrained {
                layout.score_after(replicas, drop, Some(layout.representative(g)))
            } else {
                0
            }
        };
        let Some(cold) = self.cold.as_mut() else {
            // No index (outside the forced phases): a scan, in the same order.
            let group_score: Vec<usize> = (0..layout.groups).map(score).collect();
            return (0..self.loads.len())
                .filter(|&t| !replicas.contains(&(t as u32)))
                .min_by(|&a, &b| {
                    let s = |t: usize| group_score[layout.group[t] as usize];
                    s(a).cmp(&s(b)).then(self.loads[a].total_cmp(&self.loads[b]))
                })
                .map(|t| t as u32);
        };
        (0..layout.groups)
            .filter_map(|g| cold.coldest(g, &self.loads, replicas).map(|(key, t)| (score(g), key, t)))
            .min()
            .map(|(_, _, t)| t)
    }
}
