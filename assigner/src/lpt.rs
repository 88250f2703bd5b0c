//! [`Lpt`]: longest processing time first over fixed bins (Rudolph's LPT variant).
//!
//! The key space is cut into `c * n` equal bins; bins carrying load go, heaviest first,
//! each to the least loaded serving tasks (`min` of them, each carrying an equal share).
//! Ties go to a task that held the bin before, then to the lower task index. Bins that
//! carry no load keep their previous owners when those still serve (so idle keys do not
//! churn), else go round-robin. LPT's peak is at most 4/3 of the optimum for the bins,
//! but it ignores the previous assignment otherwise, so its churn is unbounded: it is
//! the balance reference, not a production assigner. `O(c * n * (log(c * n) + n))`.

use std::time::Instant;

use crate::error::AssignError;
use crate::pieces::{bins_per_task, equal_ranges};
use crate::placement::layout::Layout;
use crate::report::{finish, Outcome, RunNotes};
use crate::{serving_of, Assigner, RunInput};

/// The LPT assigner.
#[derive(Debug, Clone, PartialEq)]
pub struct Lpt {
    bins_per_task: usize,
}

impl Default for Lpt {
    /// 64 bins per task, as Rudolph's rotation.
    fn default() -> Self {
        Self { bins_per_task: 64 }
    }
}

impl Lpt {
    /// `bins_per_task` bins per serving task.
    ///
    /// # Errors
    ///
    /// [`AssignError::BadConfig`] for 0.
    pub fn new(bins_per_task: usize) -> Result<Self, AssignError> {
        if bins_per_task == 0 {
            return Err(AssignError::BadConfig { field: "bins_per_task", expected: "at least 1" });
        }
        Ok(Self { bins_per_task })
    }
}

impl Assigner for Lpt {
    fn name(&self) -> &'static str {
        "lpt"
    }

    fn assign(&self, input: &RunInput<'_>) -> Result<Outcome, AssignError> {
        let started = Instant::now();
        let layout = Layout::new(input.tasks, serving_of(input.tasks)?, input.placement, input.replicas);
        let serving = &layout.serving;
        let n = serving.len();
        let replicas = layout.min_r;
        let m = bins_per_task(self.bins_per_task, n) * n;
        let mut bins = equal_ranges(m, input.load);
        let before: Vec<Vec<usize>> = bins
            .iter()
            .map(|b| {
                let owners = input
                    .previous
                    .map_or(&[][..], |p| p.slice_for(steady_slice::SliceKey(b.start)).replicas());
                owners.iter().filter_map(|t| serving.binary_search(t).ok()).collect()
            })
            .collect();
        let mut order: Vec<usize> = (0..m).collect();
        order.sort_by(|&a, &b| bins[b].load.total_cmp(&bins[a].load).then(a.cmp(&b)));
        // Each task's load over its capacity.
        let mut loads = vec![0.0f64; n];
        let spread = layout.spread_order();
        for b in order {
            let load = bins[b].load;
            let kept = load <= 0.0
                && before[b].len() == replicas
                && layout.score(&before[b].iter().map(|&t| t as u32).collect::<Vec<_>>()) == 0;
            let chosen: Vec<usize> = if kept {
                before[b].clone()
            } else if load <= 0.0 {
                layout.spread_replicas(&spread, b % n, replicas).into_iter().map(|t| t as usize).collect()
            } else if !layout.constrained {
                let mut candidates: Vec<usize> = (0..n).collect();
                candidates.sort_by(|&x, &y| {
                    loads[x]
                        .total_cmp(&loads[y])
                        .then(before[b].contains(&y).cmp(&before[b].contains(&x)))
                        .then(x.cmp(&y))
                });
                candidates.truncate(replicas);
                candidates
            } else {
                // One replica at a time: the task that keeps the placement best, then the
                // least loaded, then one that held the bin, then the lowest index.
                let mut chosen: Vec<u32> = Vec::with_capacity(replicas);
                for _ in 0..replicas {
                    let by_group: Vec<usize> = (0..layout.groups)
                        .map(|g| layout.score_after(&chosen, None, Some(layout.representative(g))))
                        .collect();
                    let pick = (0..n).filter(|&t| !chosen.contains(&(t as u32))).min_by(|&x, &y| {
                        let score = |t: usize| by_group[layout.group[t] as usize];
                        score(x)
                            .cmp(&score(y))
                            .then(loads[x].total_cmp(&loads[y]))
                            .then(before[b].contains(&y).cmp(&before[b].contains(&x)))
                            .then(x.cmp(&y))
                    });
                    chosen.extend(pick.map(|t| t as u32));
                }
                chosen.into_iter().map(|t| t as usize).collect()
            };
            for &t in &chosen {
                loads[t] += load / replicas as f64 * layout.inverse[t];
            }
            bins[b].replicas = chosen.into_iter().map(|t| serving[t]).collect();
        }
        let notes = RunNotes { count_changed_ranges: true, ..RunNotes::default() };
        finish(self.name(), input, &layout, &bins, notes, started)
    }
}
