//! [`Report`]: what one assigner run did, and [`Outcome`]: the assignment with it.

use std::fmt;
use std::time::{Duration, Instant};

use steady_slice::Assignment;

use crate::error::AssignError;
use crate::pieces::{imbalance_over, pieces_of, task_loads, to_slices, Piece};
use crate::placement::layout::Layout;
use crate::placement::{Infeasible, Violation};
use crate::RunInput;

/// How many changes of each kind a run made. Weighted-move counts each; the other
/// assigners, which recompute the assignment whole, count changed ranges as `moved`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Moves {
    /// Replicas replaced or added because their task left or drains, or because a slice's
    /// replica count was outside the limits (phases 1 and 2; not charged to a budget).
    pub forced: usize,
    /// Adjacent slices merged.
    pub merged: usize,
    /// Slices reassigned from one task to another.
    pub moved: usize,
    /// Replicas added to spread a slice's load.
    pub replicas_added: usize,
    /// Replicas removed to shed load onto the other replicas.
    pub replicas_removed: usize,
    /// Pairs of slices on two tasks that traded places (weighted-move's swap, a local-search
    /// move for what no single move can do).
    pub swapped: usize,
    /// Slices split in place.
    pub split: usize,
}

/// How many slices the serving tasks hold (replicas counted on each of their tasks).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SlicesPerTask {
    /// The fewest on one task.
    pub min: usize,
    /// The mean.
    pub mean: f64,
    /// The most on one task.
    pub max: usize,
}

/// What one run did.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// The assigner's name (as [`crate::by_name`] takes it).
    pub algorithm: &'static str,
    /// The generation of the outcome's assignment.
    pub generation: u64,
    /// Nothing changed: the outcome is the previous assignment itself.
    pub unchanged: bool,
    /// Imbalance was under the suppression threshold, so nothing moved except forced moves.
    pub suppressed: bool,
    /// The changes made, by kind.
    pub moves: Moves,
    /// The share of the key space whose owners changed from the previous assignment
    /// (`Assignment::diff`); 1 for an initial assignment.
    pub key_churn: f64,
    /// The share of the key space charged to forced moves (phases 1 and 2), which no
    /// budget limits.
    pub forced_churn: f64,
    /// The previous assignment's imbalance under this run's load over the serving tasks
    /// (`None` without a previous assignment).
    pub imbalance_before: Option<f64>,
    /// The outcome's imbalance: the busiest serving task's load over its capacity, against
    /// the total load over the total capacity (with every capacity 1: the busiest task's
    /// load over the mean task load).
    pub imbalance_after: f64,
    /// The placement constraints the outcome misses (empty when it meets them; without
    /// constraints, only `min-replicas` when fewer tasks serve than the minimum); see
    /// [`crate::Placement::check`].
    pub violations: Vec<Violation>,
    /// Why the task set cannot meet the placement, if it cannot: the outcome is then the
    /// best assignment the run could make.
    pub infeasible: Option<Infeasible>,
    /// The number of slices.
    pub slices: usize,
    /// Slices per serving task.
    pub slices_per_task: SlicesPerTask,
    /// How long the run took.
    pub elapsed: Duration,
}

impl fmt::Display for Report {
    /// One line of `name=value` pairs (the CLI prints it on stderr).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = &self.moves;
        write!(
            f,
            "algorithm={} generation={} unchanged={} suppressed={} key_churn={:.6} forced_churn={:.6} \
             imbalance_before={} imbalance_after={:.4} slices={} slices_per_task={}/{:.1}/{} \
             forced={} merged={} moved={} added={} removed={} swapped={} split={} elapsed_us={}{}",
            self.algorithm,
            self.generation,
            self.unchanged,
            self.suppressed,
            self.key_churn,
            self.forced_churn,
            self.imbalance_before.map_or("none".to_string(), |i| format!("{i:.4}")),
            self.imbalance_after,
            self.slices,
            self.slices_per_task.min,
            self.slices_per_task.mean,
            self.slices_per_task.max,
            m.forced,
            m.merged,
            m.moved,
            m.replicas_added,
            m.replicas_removed,
            m.swapped,
            m.split,
            self.elapsed.as_micros(),
            self.violations.iter().fold(String::new(), |s, v| format!(
                "{s} violated_{}={}",
                v.constraint.name().replace('-', "_"),
                v.slices
            )),
        )
    }
}

/// The result of a run: the next assignment and the report.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The next assignment: the previous one itself when nothing changed
    /// ([`Report::unchanged`]), else a new generation.
    pub assignment: Assignment,
    /// What the run did.
    pub report: Report,
}

/// What an assigner hands to [`finish`] besides the pieces.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RunNotes {
    pub(crate) moves: Moves,
    pub(crate) forced_churn: f64,
    pub(crate) suppressed: bool,
    pub(crate) count_changed_ranges: bool,
}

/// Builds the outcome of a run from its final pieces: the previous assignment when they
/// name the same owners for the same slices, else the next generation, validated.
pub(crate) fn finish(
    algorithm: &'static str,
    input: &RunInput<'_>,
    layout: &Layout,
    pieces: &[Piece],
    mut notes: RunNotes,
    started: Instant,
) -> Result<Outcome, AssignError> {
    let (previous, serving, load) = (input.previous, &layout.serving[..], input.load);
    let slices = to_slices(pieces);
    let loads_after = task_loads(pieces, serving);
    let imbalance_before =
        previous.map(|p| imbalance_over(&task_loads(&pieces_of(p, load), serving), &layout.capacity));
    let same = previous.is_some_and(|p| {
        p.slices().len() == slices.len()
            && p.slices().iter().zip(&slices).all(|(a, b)| {
                let mut r = a.replicas().to_vec();
                r.sort_unstable();
                a.start == b.start && r == b.replicas()
            })
    });
    let (assignment, unchanged) = match previous {
        Some(p) if same => (p.clone(), true),
        _ => {
            let generation = match previous {
                Some(p) => p.generation().checked_add(1).ok_or(AssignError::GenerationExhausted)?,
                None => 1,
            };
            (Assignment::new(generation, slices).map_err(AssignError::Invalid)?, false)
        }
    };
    let key_churn = match previous {
        Some(p) if !unchanged => {
            let diff = p.diff(&assignment);
            if notes.count_changed_ranges {
                notes.moves.moved = diff.changed().len();
            }
            diff.key_churn()
        }
        Some(_) => 0.0,
        None => 1.0,
    };
    let mut counts = vec![0usize; serving.len()];
    for s in assignment.slices() {
        for r in s.replicas() {
            if let Ok(i) = serving.binary_search(r) {
                counts[i] += 1;
            }
        }
    }
    let slices_per_task = SlicesPerTask {
        min: counts.iter().copied().min().unwrap_or(0),
        mean: counts.iter().sum::<usize>() as f64 / counts.len().max(1) as f64,
        max: counts.iter().copied().max().unwrap_or(0),
    };
    // Without constraints, only too few serving tasks can miss one (the minimum replicas):
    // skip the pass over the slices otherwise.
    let check = if input.placement.is_none() && serving.len() >= input.replicas.min() {
        Default::default()
    } else {
        input.placement.check(input.tasks, input.replicas, &assignment)
    };
    let report = Report {
        algorithm,
        generation: assignment.generation(),
        unchanged,
        suppressed: notes.suppressed,
        moves: if unchanged { Moves::default() } else { notes.moves },
        key_churn,
        forced_churn: notes.forced_churn,
        imbalance_before,
        imbalance_after: imbalance_over(&loads_after, &layout.capacity),
        violations: check.violations,
        infeasible: check.infeasible,
        slices: assignment.slices().len(),
        slices_per_task,
        elapsed: started.elapsed(),
    };
    Ok(Outcome { assignment, report })
}
