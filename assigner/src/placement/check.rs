//! [`Placement::check`]: the constraints an assignment misses, and whether a task set can
//! meet them at all.

use std::fmt;

use steady_slice::{Assignment, SliceKey};

use super::layout::Layout;
use super::{Placement, Spread};
use crate::load::{ReplicaLimits, SPACE};
use crate::tasks::Tasks;

/// A constraint of a [`Placement`], by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Constraint {
    /// At least the minimum number of replicas per slice.
    MinReplicas,
    /// Replicas of a slice in distinct zones.
    SpreadZones,
    /// Replicas of a slice in distinct racks.
    SpreadRacks,
    /// A replica of every slice in every zone.
    ReplicaPerZone,
}

impl Constraint {
    /// Every constraint, in a fixed order (metrics list them all).
    pub const ALL: [Constraint; 4] = [
        Constraint::MinReplicas,
        Constraint::SpreadZones,
        Constraint::SpreadRacks,
        Constraint::ReplicaPerZone,
    ];

    /// Its name in reports, metrics and the job spec: `min-replicas`, `spread-zones`,
    /// `spread-racks`, `replica-per-zone`.
    pub fn name(self) -> &'static str {
        match self {
            Self::MinReplicas => "min-replicas",
            Self::SpreadZones => "spread-zones",
            Self::SpreadRacks => "spread-racks",
            Self::ReplicaPerZone => "replica-per-zone",
        }
    }
}

impl fmt::Display for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The slices of an assignment that miss one constraint.
#[derive(Debug, Clone, PartialEq)]
pub struct Violation {
    /// The constraint missed.
    pub constraint: Constraint,
    /// How many slices miss it.
    pub slices: usize,
    /// Their share of the key space.
    pub key_share: f64,
    /// The start of the first of them.
    pub first: SliceKey,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} slices ({:.4} of the key space, the first at {})",
            self.constraint, self.slices, self.key_share, self.first
        )
    }
}

/// Why no assignment of a task set can meet a placement: the constraint, with what it
/// needs and what there is. A run still returns the best assignment it can.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Infeasible {
    /// Fewer serving tasks than the minimum replicas.
    MinReplicas {
        /// The minimum asked for.
        min: usize,
        /// The serving tasks.
        serving: usize,
    },
    /// Fewer zones (racks) with serving tasks than replicas each slice needs.
    Spread {
        /// [`Constraint::SpreadZones`] or [`Constraint::SpreadRacks`].
        constraint: Constraint,
        /// The replicas each slice needs.
        replicas: usize,
        /// The domains with serving tasks.
        domains: usize,
    },
    /// A zone the placement names has no serving task.
    ZoneWithoutTasks {
        /// The zone.
        zone: String,
    },
    /// More zones to cover than the most replicas a slice may have.
    ReplicaPerZone {
        /// The zones to cover.
        zones: usize,
        /// The replica maximum.
        max: usize,
    },
}

impl Infeasible {
    /// The constraint that cannot be met.
    pub fn constraint(&self) -> Constraint {
        match self {
            Self::MinReplicas { .. } => Constraint::MinReplicas,
            Self::Spread { constraint, .. } => *constraint,
            Self::ZoneWithoutTasks { .. } | Self::ReplicaPerZone { .. } => Constraint::ReplicaPerZone,
        }
    }
}

impl fmt::Display for Infeasible {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "constraint {} cannot be met: ", self.constraint())?;
        match self {
            Self::MinReplicas { min, serving } => {
                write!(f, "{min} replicas per slice asked for, {serving} tasks serve")
            }
            Self::Spread { replicas, domains, constraint } => {
                let level = if *constraint == Constraint::SpreadRacks { "racks" } else { "zones" };
                write!(f, "{replicas} replicas per slice need as many {level}, {domains} have serving tasks")
            }
            Self::ZoneWithoutTasks { zone } => write!(f, "zone {zone} has no serving task"),
            Self::ReplicaPerZone { zones, max } => {
                write!(f, "{zones} zones to cover, at most {max} replicas per slice")
            }
        }
    }
}

impl std::error::Error for Infeasible {}

/// The result of [`Placement::check`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PlacementCheck {
    /// The constraints some slices miss, one entry per constraint, in [`Constraint::ALL`]
    /// order; empty when the assignment meets the placement.
    pub violations: Vec<Violation>,
    /// Why the task set cannot meet the placement, if it cannot.
    pub infeasible: Option<Infeasible>,
}

impl PlacementCheck {
    /// Whether the assignment meets every constraint.
    pub fn is_met(&self) -> bool {
        self.violations.is_empty()
    }
}

impl Placement {
    /// Whether `tasks`' serving tasks can meet this placement with `replicas`.
    ///
    /// # Errors
    ///
    /// The first constraint that cannot be met, as [`Infeasible`].
    pub fn feasibility(&self, tasks: &Tasks, replicas: ReplicaLimits) -> Result<(), Infeasible> {
        let layout = Layout::new(tasks, tasks.serving_ids(), self, replicas);
        self.infeasibility(tasks, replicas, &layout).map_or(Ok(()), Err)
    }

    /// The first constraint the serving tasks of `layout` cannot meet, if any.
    fn infeasibility(&self, tasks: &Tasks, replicas: ReplicaLimits, layout: &Layout) -> Option<Infeasible> {
        let serving = &layout.serving;
        if serving.len() < replicas.min() {
            return Some(Infeasible::MinReplicas { min: replicas.min(), serving: serving.len() });
        }
        if self.replica_per_zone {
            let has_tasks = |z: &str| serving.iter().any(|&t| tasks.profile(t).zone.as_deref() == Some(z));
            if let Some(zone) = self.zones.iter().find(|z| !has_tasks(z)) {
                return Some(Infeasible::ZoneWithoutTasks { zone: zone.clone() });
            }
        }
        // Every named zone has serving tasks (above): the zones to cover are the layout's.
        let covered = layout.required_count;
        if covered > replicas.max() {
            return Some(Infeasible::ReplicaPerZone { zones: covered, max: replicas.max() });
        }
        let domains = layout.domains();
        let needed = replicas.min().max(covered);
        if self.spread != Spread::None && needed > domains {
            return Some(Infeasible::Spread {
                constraint: self.spread_constraint(),
                replicas: needed,
                domains,
            });
        }
        None
    }

    /// The constraint a spread over this placement's level is, by name.
    fn spread_constraint(&self) -> Constraint {
        if self.spread == Spread::Racks {
            Constraint::SpreadRacks
        } else {
            Constraint::SpreadZones
        }
    }

    /// Which constraints `assignment` misses for `tasks` (replicas on tasks that do not
    /// serve do not count), and whether the task set can meet them at all.
    pub fn check(&self, tasks: &Tasks, replicas: ReplicaLimits, assignment: &Assignment) -> PlacementCheck {
        let layout = Layout::new(tasks, tasks.serving_ids(), self, replicas);
        let infeasible = self.infeasibility(tasks, replicas, &layout);
        if layout.serving.is_empty() {
            return PlacementCheck { violations: Vec::new(), infeasible };
        }
        // A named zone with no serving task: every slice misses it.
        let zone_missing = matches!(infeasible, Some(Infeasible::ZoneWithoutTasks { .. }));
        let mut found: Vec<Option<Violation>> = vec![None; Constraint::ALL.len()];
        let slices = assignment.slices();
        let mut positions = Vec::new();
        for (i, s) in slices.iter().enumerate() {
            let end = slices.get(i + 1).map_or(1u128 << 64, |n| u128::from(n.start.get()));
            let share = (end - u128::from(s.start.get())) as f64 / SPACE;
            positions.clear();
            positions.extend(
                s.replicas().iter().filter_map(|t| layout.serving.binary_search(t).ok().map(|p| p as u32)),
            );
            let (spread, missing) = layout.misses(&positions);
            let mut note = |c: Constraint| {
                let v = found[c as usize].get_or_insert(Violation {
                    constraint: c,
                    slices: 0,
                    key_share: 0.0,
                    first: s.start,
                });
                v.slices += 1;
                v.key_share += share;
            };
            if positions.len() < replicas.min() {
                note(Constraint::MinReplicas);
            }
            if spread > 0 {
                note(if self.spread == Spread::Racks {
                    Constraint::SpreadRacks
                } else {
                    Constraint::SpreadZones
                });
            }
            if missing > 0 || (zone_missing && self.replica_per_zone) {
                note(Constraint::ReplicaPerZone);
            }
        }
        PlacementCheck { violations: found.into_iter().flatten().collect(), infeasible }
    }
}
