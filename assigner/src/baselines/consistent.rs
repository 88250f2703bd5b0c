//! [`ConsistentHashing`]: a ring of virtual nodes, and its load-aware variant.
//!
//! Each serving task `t` has virtual nodes at positions `mix(t << 32 | i)` for
//! `i < count(t)` (`mix` is SplitMix64's finaliser: fixed, so every run and every
//! process places them alike). A key belongs to the virtual node at or before it on the
//! ring (keys before the first node wrap to the last), so each virtual node's arc is one
//! slice. Extra replicas are the next distinct tasks clockwise.
//!
//! # The load-aware rule
//!
//! As in the load-aware consistent hashing that Slicer replaced (described in "Slicer:
//! Auto-Sharding for Datacenter Applications", OSDI 2016, after Centrifuge), each run:
//! 1. reads each task's virtual-node count back from the previous assignment (the
//!    longest run `i = 0, 1, ..` of its positions that start a slice the task serves;
//!    a new task, or no previous assignment, starts at the base count);
//! 2. measures each task's load under the previous assignment and scales its count by
//!    `mean task load / its load` (rounded, within `[1, 10 * base]`; a task with no
//!    load doubles, within the same cap; a task within 10% of the mean keeps its
//!    count, so a balanced job stops changing), so a hot task sheds arcs, which land on
//!    whichever tasks follow them: randomly, not on the coolest task;
//! 3. replicates hot arcs: an arc carrying more than half the mean task load gets
//!    `ceil(load / (mean / 2))` replicas (within the replica limits) on the next
//!    distinct tasks clockwise.
//!
//! The slice count is the number of virtual nodes (plus one for the wrap), so with
//! 1,000 nodes per task assignments are large, as the paper notes.

use std::collections::HashMap;
use std::time::Instant;

use steady_slice::Assignment;

use crate::error::AssignError;
use crate::load::Load;
use crate::pieces::{pieces_of, task_loads, Piece};
use crate::placement::layout::Layout;
use crate::report::{finish, Outcome, RunNotes};
use crate::{serving_of, Assigner, RunInput};

/// Tasks whose load is within this share of the mean keep their count.
const DEAD_BAND: f64 = 0.1;

/// The most a load-aware count may grow, as a multiple of the base count.
const MAX_SCALE: usize = 10;

/// Consistent hashing with virtual nodes, optionally load-aware (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct ConsistentHashing {
    vnodes: usize,
    load_aware: bool,
}

impl ConsistentHashing {
    /// `vnodes` virtual nodes per task (at least 1); the paper's comparison used 100 and
    /// 1,000.
    pub fn new(vnodes: usize) -> Self {
        Self { vnodes: vnodes.max(1), load_aware: false }
    }

    /// The load-aware variant, starting from `vnodes` per task.
    pub fn load_aware(vnodes: usize) -> Self {
        Self { vnodes: vnodes.max(1), load_aware: true }
    }

    /// Each serving task's virtual-node count for this run.
    fn counts(&self, serving: &[u32], previous: Option<&Assignment>, load: &Load) -> Vec<usize> {
        let base = self.vnodes;
        let Some(previous) = previous.filter(|_| self.load_aware) else { return vec![base; serving.len()] };
        let starts: HashMap<u64, &[u32]> =
            previous.slices().iter().map(|s| (s.start.get(), s.replicas())).collect();
        let loads = task_loads(&pieces_of(previous, load), serving);
        let mean = loads.iter().sum::<f64>() / serving.len() as f64;
        serving
            .iter()
            .zip(&loads)
            .map(|(&t, &l)| {
                let had = (0..base * MAX_SCALE)
                    .take_while(|&i| starts.get(&position(t, i)).is_some_and(|r| r.contains(&t)))
                    .count();
                let had = if had == 0 { base } else { had };
                let scaled = if l <= 0.0 {
                    had * 2
                } else if (l - mean).abs() <= DEAD_BAND * mean {
                    had
                } else {
                    (had as f64 * mean / l).round() as usize
                };
                scaled.clamp(1, base * MAX_SCALE)
            })
            .collect()
    }
}

/// Where virtual node `i` of task `t` sits: SplitMix64's finaliser of `t << 32 | i`.
fn position(task: u32, i: usize) -> u64 {
    let mut z = (u64::from(task) << 32 | i as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Assigner for ConsistentHashing {
    fn name(&self) -> &'static str {
        match (self.load_aware, self.vnodes) {
            (true, _) => "consistent-load-aware",
            (false, 1000) => "consistent-1000",
            (false, _) => "consistent",
        }
    }

    fn assign(&self, input: &RunInput<'_>) -> Result<Outcome, AssignError> {
        let started = Instant::now();
        let serving = serving_of(input.tasks)?;
        let n = serving.len();
        let (min_r, max_r) = input.replicas.effective(n);
        let counts = self.counts(&serving, input.previous, input.load);
        // (position, serving position), sorted; a position taken twice keeps its first.
        let serving_ref = &serving;
        let mut ring: Vec<(u64, usize)> = counts
            .iter()
            .enumerate()
            .flat_map(|(t, &c)| (0..c).map(move |i| (position(serving_ref[t], i), t)))
            .collect();
        ring.sort_unstable();
        ring.dedup_by_key(|v| v.0);
        ring.truncate(steady_slice::MAX_SLICES - 1);
        let mean = input.load.total() / n as f64;
        let owners_from = |j: usize, want: usize| -> Vec<u32> {
            let mut owners: Vec<u32> = Vec::with_capacity(want);
            for k in 0..ring.len() {
                let t = serving[ring[(j + k) % ring.len()].1];
                if !owners.contains(&t) {
                    owners.push(t);
                    if owners.len() == want {
                        break;
                    }
                }
            }
            owners
        };
        let mut pieces = Vec::with_capacity(ring.len() + 1);
        let mut arc = |start: u64, end: u128, j: usize| {
            let load = input.load.between(start, end);
            let want = if self.load_aware && mean > 0.0 && load > mean / 2.0 {
                ((load / (mean / 2.0)).ceil() as usize).clamp(min_r, max_r)
            } else {
                min_r
            };
            pieces.push(Piece { start, end, replicas: owners_from(j, want), load });
        };
        if ring[0].0 != 0 {
            arc(0, u128::from(ring[0].0), ring.len() - 1);
        }
        for j in 0..ring.len() {
            let end = ring.get(j + 1).map_or(1u128 << 64, |v| u128::from(v.0));
            arc(ring[j].0, end, j);
        }
        let notes = RunNotes { count_changed_ranges: true, ..RunNotes::default() };
        let layout = Layout::new(input.tasks, serving, input.placement, input.replicas);
        finish(self.name(), input, &layout, &pieces, notes, started)
    }
}
