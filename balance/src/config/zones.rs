//! [`ZoneRouting`]: what a frontend needs to route zone-aware (its zone, how many
//! frontends each zone has, and when its zone counts as down).

use steady_core::{ConfigError, Zone, ZoneSizes};

use super::check;

/// Zone-aware routing: this frontend's zone, and the frontend job's size in each zone.
///
/// With it, [`BalanceConfig::frontend`](super::BalanceConfig::frontend) is the
/// frontend's index *within its zone*, and the subset is drawn from the frontend's own
/// zone's serving backends (the view's tasks carry their [`Locality`](steady_core::Locality)),
/// so each zone's backends share their zone's frontends evenly and a resize in one zone
/// churns only that zone's connections. Requests stay in the zone while the zone's share
/// of the job's serving backends covers its share of the frontends (its share of the
/// demand); otherwise the excess spills to the zones with a surplus, in proportion to
/// it, over a subset of each kept only while something spills. `docs/zones.md` has the
/// rule with a worked example and the measurements.
///
/// A job view without zones (no task has a locality) routes as without this setting,
/// with the frontend's index in the whole frontend job (the zones before its own, by
/// label, then its zone index). A task without a zone in a view
/// that has zones is not a member of any zone's subset (keyed requests still reach it
/// when an assignment names it).
///
/// ```
/// use steady_balance::{BalanceConfig, Zone, ZoneRouting, ZoneSizes};
///
/// let a = Zone::new("us-east1-a")?;
/// let frontends = ZoneSizes::new().with(a.clone(), 6).with(Zone::new("us-east1-b")?, 3);
/// // Frontend 2 of zone a, keeping 10 connections in its zone.
/// let config = BalanceConfig::new(2, 10).with_zones(ZoneRouting::new(a, frontends));
/// config.validate()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ZoneRouting {
    /// This frontend's zone.
    pub zone: Zone,
    /// How many frontends each zone has, this one's included (changeable at run time
    /// with [`crate::Balance::set_frontend_zones`]). Each zone's share of them is its
    /// share of the demand. This frontend's zone counts at least `frontend + 1`
    /// frontends (when it is missing here, or the sizes lag behind).
    pub frontends: ZoneSizes,
    /// Below this share of the local subset's `k` members usable (a member not failed,
    /// backing off or ejected; a stand-in only once connected), the zone counts as down
    /// and every request spills (default 0.5, the panic threshold of ejection, applied
    /// per zone). 0 spills only when no local backend serves at all.
    pub min_healthy_share: f64,
}

impl ZoneRouting {
    /// Routing for a frontend in `zone`, with `frontends` per zone and the defaults.
    pub fn new(zone: Zone, frontends: ZoneSizes) -> Self {
        Self { zone, frontends, min_healthy_share: 0.5 }
    }

    /// Sets the share of the local subset that must be usable for requests to stay in
    /// the zone.
    pub fn with_min_healthy_share(mut self, share: f64) -> Self {
        self.min_healthy_share = share;
        self
    }

    /// How many frontends this zone has, for frontend `frontend` of it: the size given,
    /// or `frontend + 1` when that is larger (sizes that lag behind a new frontend).
    pub(crate) fn local_frontends(&self, frontend: usize) -> usize {
        self.frontends.get(&self.zone).max(frontend.saturating_add(1))
    }

    /// This zone's share of the frontend job (of the demand), for frontend `frontend` of it.
    pub(crate) fn demand_share(&self, frontend: usize) -> f64 {
        let local = self.local_frontends(frontend);
        let total = self.frontends.total() - self.frontends.get(&self.zone) + local;
        local as f64 / total as f64
    }

    /// Frontend `frontend` of this zone's index in the whole frontend job: the zones
    /// before this one (by label) first, then this zone's. Distinct for every frontend
    /// of the job, so whole-job choices (a view without zones, the subsets of the zones
    /// requests spill to, the replicas of other zones) spread over all of them.
    pub(crate) fn job_index(&self, frontend: usize) -> usize {
        let before: usize = self.frontends.iter().filter(|(z, _)| **z < self.zone).map(|(_, n)| n).sum();
        before.saturating_add(frontend)
    }

    /// Checks the values.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] when `min_healthy_share` is not a number in `0.0..=1.0`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.min_healthy_share.is_nan() {
            return Err(ConfigError::new("zones.min_healthy_share", self.min_healthy_share, "0.0..=1.0"));
        }
        check("zones.min_healthy_share", self.min_healthy_share, 0.0, 1.0, "0.0..=1.0")
    }
}
