//! The baselines every evaluation shows beside the load-aware assigners.

pub(crate) mod consistent;
pub(crate) mod static_ranges;
