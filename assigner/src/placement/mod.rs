//! Placement under constraints, as Shard Manager ("Shard Manager: A Generic Shard
//! Management Framework for Geo-distributed Applications", SOSP 2021) places shards:
//! replicas spread over failure domains, a replica of every slice in every zone, and load
//! balanced over tasks of different capacities.
//!
//! The pieces:
//! * [`TaskProfile`] (on [`crate::Tasks`]): a task's zone, rack and capacity.
//! * [`Placement`] (on [`crate::RunInput`]): the constraints a job asks for.
//! * [`Placement::check`]: which constraints an assignment misses ([`Violation`]s), and
//!   whether the task set can meet them at all ([`Infeasible`], naming the constraint).
//! * [`crate::JobSpec`]: the declarative form of all of it (replicas, constraints, goals,
//!   task profiles) that the `steady-slicer` binary and `steady-lab assign` read.
//!
//! # Constraints
//!
//! * **Spread** ([`Spread::Zones`], [`Spread::Racks`]): no two replicas of a slice share a
//!   zone (a rack). Replica counts are capped at the number of domains with serving tasks.
//! * **A replica per zone** ([`Placement::replica_per_zone`]): every slice has a replica in
//!   every zone ([`Placement::zones`], or every zone of a serving task when that list is
//!   empty), so keyed requests can stay in their zone. The replica minimum is raised to the
//!   number of zones.
//! * **Minimum replicas** ([`crate::ReplicaLimits`]): a constraint like the others when the
//!   serving tasks are fewer than the minimum.
//!
//! A task with no zone (no rack) is in one shared *unlabelled* domain: tasks that nobody
//! labelled never count as spread.
//!
//! # What the assigners do with them
//!
//! Weighted-move and LPT honour every constraint wherever the task set allows it; rotation
//! spreads consecutive replicas over zones (it orders tasks round-robin over zones) but
//! does not search. A run never makes a slice's placement worse by a load move, repairs
//! violations first (as forced moves, outside the churn budget), and where the task set
//! cannot meet a constraint it still returns an assignment: the best it can, with the
//! [`Infeasible`] reason and the [`Violation`]s in its [`crate::Report`].

mod check;
pub(crate) mod layout;
mod profile;

pub use check::{Constraint, Infeasible, PlacementCheck, Violation};
pub use profile::{TaskProfile, MAX_DOMAIN_LEN};

use crate::error::AssignError;
use profile::valid_label;

/// The failure-domain level over which a slice's replicas must be spread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum Spread {
    /// No spread constraint.
    #[default]
    None,
    /// No two replicas of a slice in one zone.
    Zones,
    /// No two replicas of a slice in one rack.
    Racks,
}

impl Spread {
    /// The name the job spec uses: `none`, `zones`, `racks`.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Zones => "zones",
            Self::Racks => "racks",
        }
    }

    /// The level named `name` (as [`Spread::name`] gives it).
    pub fn from_name(name: &str) -> Option<Self> {
        [Self::None, Self::Zones, Self::Racks].into_iter().find(|s| s.name() == name)
    }
}

/// The constraints of a job's placement (see the module documentation). The default asks
/// for nothing: every assigner then behaves exactly as without constraints.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Placement {
    /// Replicas of a slice in distinct zones, or racks.
    pub spread: Spread,
    /// A replica of every slice in every zone.
    pub replica_per_zone: bool,
    /// The zones the job is meant to run in. With [`Placement::replica_per_zone`], each of
    /// them must hold a replica of every slice, and one with no serving task makes the
    /// placement infeasible ([`Infeasible::ZoneWithoutTasks`]); empty: the zones of the
    /// serving tasks, whatever they are.
    pub zones: Vec<String>,
}

static NONE: Placement = Placement { spread: Spread::None, replica_per_zone: false, zones: Vec::new() };

impl Placement {
    /// No constraint, as a `'static` reference for [`crate::RunInput::placement`].
    pub fn none() -> &'static Placement {
        &NONE
    }

    /// Whether it asks for nothing.
    pub fn is_none(&self) -> bool {
        self.spread == Spread::None && !self.replica_per_zone
    }

    /// Checks the zone labels (valid, none twice).
    ///
    /// # Errors
    ///
    /// [`AssignError::BadConfig`] naming `zones`.
    pub fn validate(&self) -> Result<(), AssignError> {
        let bad = Err(AssignError::BadConfig {
            field: "zones",
            expected: "distinct labels of 1 to 63 bytes of [A-Za-z0-9._-]",
        });
        for (i, z) in self.zones.iter().enumerate() {
            if !valid_label(z) || self.zones[..i].contains(z) {
                return bad;
            }
        }
        Ok(())
    }
}
