//! Exclusive ownership in the lab: the safety checker under real faults
//! (`steady-lab checker`, with its hidden `exclusive-node` and `exclusive-mover`
//! processes) and the ownership intervals it checks.

pub(crate) mod checker;
pub(crate) mod intervals;
pub(crate) mod mover;
pub(crate) mod node;
