//! Task identity: a task's index in its job, and where it came from.
//!
//! Deterministic subsetting (decimal Rocksteadier, the default, or Rocksteadier) needs
//! every frontend to know its own index, stable while it runs and reused by its
//! replacement, so that the frontend job stays contiguous (`0..M`) and other frontends'
//! subsets never change. [`resolve`] tries the sources in the order given:
//!
//! * [`IdentitySource::Explicit`]: a value from configuration;
//! * [`IdentitySource::Env`]: an environment variable holding the index;
//! * [`IdentitySource::HostnameOrdinal`]: a StatefulSet-style hostname, `name-<ordinal>`
//!   (the first DNS label; `HOSTNAME`, else `/etc/hostname`);
//! * the etcd registry (feature `etcd`, `registry::claim_index`): the lowest free index of
//!   the job, held under a lease.
//!
//! With none of them [`resolve`] falls back to a **random** index and logs a warning:
//! the frontend should then use random subsetting (gRFC A68), which
//! [`Identity::algorithm`] selects. Random subsetting balances worse: on the
//! article's grid (`steady-lab grid --step 1`, 59,148 scenarios) its mean normalised
//! utilisation is 0.650 (worst 0.25) against 0.950 (worst 0.667) for the default,
//! decimal Rocksteadier (0.946 for Rocksteadier), because nothing coordinates the
//! frontends' choices.
//!
//! # Zones
//!
//! A frontend in a zone subsets within its zone, over its index **within** the zone
//! ([`Identity::zone`] set, [`Identity::index`] the zone index). Its zone comes from
//! [`resolve_zone`] (an explicit value, or an environment variable: [`ZONE_ENV`],
//! `STEADY_ZONE`, by convention, set from the node's `topology.kubernetes.io/zone`
//! label or the cloud's metadata), and its zone index from the same sources as a job
//! index (a StatefulSet per zone gives its ordinal), or from the registry's zoned claim
//! (`registry::Registry::claim_index_in_zone`), which sets both:
//!
//! ```
//! use steady_discovery::identity::{self, IdentitySource, ZoneSource};
//!
//! let me = identity::resolve(&[IdentitySource::Explicit(2)])?
//!     .with_zone(identity::resolve_zone(&[ZoneSource::env(), ZoneSource::Explicit("us-east1-b".parse()?)])?);
//! assert_eq!(me.index(), 2); // the index within its zone
//! assert!(me.zone().is_some());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;

use steady_core::{Locality, Zone, ZoneError};
use steady_subset::prng::SplitMix64;
use steady_subset::{Algorithm, Random};

/// Where an index may come from, tried in order by [`resolve`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdentitySource {
    /// This index.
    Explicit(usize),
    /// The index in this environment variable (unset: try the next source).
    Env(String),
    /// The ordinal at the end of the first label of the hostname (`web-3.web.ns` is 3).
    HostnameOrdinal,
}

/// The conventional environment variable holding a task's zone label.
pub const ZONE_ENV: &str = "STEADY_ZONE";

/// Where a zone may come from, tried in order by [`resolve_zone`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ZoneSource {
    /// This zone.
    Explicit(Zone),
    /// The zone label in this environment variable (unset or empty: try the next source).
    Env(String),
}

impl ZoneSource {
    /// The conventional variable, [`ZONE_ENV`] (`STEADY_ZONE`).
    pub fn env() -> Self {
        Self::Env(ZONE_ENV.to_owned())
    }
}

/// Where a task's index came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Configuration.
    Explicit,
    /// The environment variable named.
    Env(String),
    /// The hostname given.
    HostnameOrdinal(String),
    /// An index leased from the etcd registry.
    Registry,
    /// Nothing else was available: a random index, for random subsetting.
    Random,
}

/// A task's index in its job, or in its zone when it has one. When it was leased from a
/// registry, the lease is held as long as this value lives and released when it is
/// dropped.
pub struct Identity {
    index: usize,
    zone: Option<Zone>,
    origin: Origin,
    /// Keeps a registry lease alive; dropped with the identity.
    #[allow(dead_code)]
    guard: Option<Box<dyn Send + Sync>>,
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Identity")
            .field("index", &self.index)
            .field("zone", &self.zone)
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

impl Identity {
    /// An index with no lease behind it.
    pub fn new(index: usize, origin: Origin) -> Self {
        Self { index, zone: None, origin, guard: None }
    }

    /// An index held by `guard` (a registry lease kept alive until the identity drops).
    pub fn leased(index: usize, guard: impl Send + Sync + 'static) -> Self {
        Self { index, zone: None, origin: Origin::Registry, guard: Some(Box::new(guard)) }
    }

    /// The same identity in `zone` (or in none): its index is then read as the index
    /// within that zone. Takes what [`resolve_zone`] gives.
    pub fn with_zone(mut self, zone: Option<Zone>) -> Self {
        self.zone = zone;
        self
    }

    /// The index: within [`Identity::zone`] when it is set, else within the job. A
    /// zone-aware frontend gives it to its balancer as its frontend index within the
    /// zone.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The task's zone, if it has one.
    pub fn zone(&self) -> Option<&Zone> {
        self.zone.as_ref()
    }

    /// The zone and the index within it, if the task has a zone.
    pub fn locality(&self) -> Option<Locality> {
        self.zone.clone().map(|zone| Locality::new(zone, self.index))
    }

    /// Where it came from.
    pub fn origin(&self) -> &Origin {
        &self.origin
    }

    /// The subsetting algorithm a frontend with this identity should use: the default
    /// one (decimal Rocksteadier) when its index is coordinated, random subsetting (gRFC A68) when the index is
    /// random. With the balancer:
    /// `BalanceConfig::new(id.index(), k).with_algorithm(id.algorithm())`.
    ///
    /// (This replaces `balance_config`, which made discovery depend on the balancer.)
    pub fn algorithm(&self) -> Algorithm {
        match self.origin {
            Origin::Random => Algorithm::Random(Random::default()),
            _ => Algorithm::default(),
        }
    }
}

/// Why an identity source gave no index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdentityError {
    /// The environment variable is set but does not hold an index.
    BadEnv {
        /// The variable.
        var: String,
        /// Its value.
        value: String,
    },
    /// The environment variable is set but does not hold a zone label.
    BadZone {
        /// The variable.
        var: String,
        /// Its value (at most its first 80 characters).
        value: String,
        /// What is wrong with it.
        error: ZoneError,
    },
}

impl fmt::Display for IdentityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BadEnv { var, value } => write!(f, "identity: {var}={value:?} is not a task index"),
            Self::BadZone { var, value, error } => {
                write!(f, "identity: {var}={value:?} is not a zone: {error}")
            }
        }
    }
}

impl std::error::Error for IdentityError {}

/// The ordinal of a StatefulSet-style host name: the digits after the last `-` of its
/// first label (`web-12` and `web-12.web.prod.svc.cluster.local` are 12; `web`,
/// `web-`, `web-x1` have none).
pub fn ordinal_of(hostname: &str) -> Option<usize> {
    let label = hostname.split('.').next()?;
    let (_, digits) = label.rsplit_once('-')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) || digits.len() > 9 {
        return None;
    }
    digits.parse().ok()
}

/// This machine's hostname: `HOSTNAME`, else `/etc/hostname`.
pub fn hostname() -> Option<String> {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
}

/// The first source that gives an index, else a random one (logged as a warning).
///
/// # Errors
///
/// [`IdentityError::BadEnv`] when a listed variable is set to something that is not an
/// index: a misconfiguration is reported, not papered over with a random index.
pub fn resolve(sources: &[IdentitySource]) -> Result<Identity, IdentityError> {
    for source in sources {
        match source {
            IdentitySource::Explicit(i) => return Ok(Identity::new(*i, Origin::Explicit)),
            IdentitySource::Env(var) => {
                if let Ok(value) = std::env::var(var) {
                    let index = value
                        .trim()
                        .parse()
                        .map_err(|_| IdentityError::BadEnv { var: var.clone(), value: value.clone() })?;
                    return Ok(Identity::new(index, Origin::Env(var.clone())));
                }
            }
            IdentitySource::HostnameOrdinal => {
                if let Some((host, index)) = hostname().and_then(|h| ordinal_of(&h).map(|i| (h, i))) {
                    return Ok(Identity::new(index, Origin::HostnameOrdinal(host)));
                }
            }
        }
    }
    tracing::warn!(
        "identity: no task index from {sources:?}; using a random index with random subsetting, \
         which balances worse than the default, decimal Rocksteadier"
    );
    Ok(Identity::new(random_index(), Origin::Random))
}

/// The first source that gives a zone, or `None` (a task in no zone: subsetting over the
/// whole job, as without zones). An environment variable that is unset or empty (after
/// trimming) gives none.
///
/// # Errors
///
/// [`IdentityError::BadZone`] when a listed variable is set to something that is not a
/// zone label: a misconfiguration is reported, not taken for "no zone".
pub fn resolve_zone(sources: &[ZoneSource]) -> Result<Option<Zone>, IdentityError> {
    for source in sources {
        match source {
            ZoneSource::Explicit(zone) => return Ok(Some(zone.clone())),
            ZoneSource::Env(var) => {
                let Ok(value) = std::env::var(var) else { continue };
                let label = value.trim();
                if label.is_empty() {
                    continue;
                }
                return Zone::new(label).map(Some).map_err(|error| IdentityError::BadZone {
                    var: var.clone(),
                    value: value.chars().take(80).collect(),
                    error,
                });
            }
        }
    }
    Ok(None)
}

/// A random index for random subsetting: the process id and the clock, mixed.
fn random_index() -> usize {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let mut rng = SplitMix64::new(nanos ^ u64::from(std::process::id()).rotate_left(32));
    (rng.next() >> 33) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statefulset_ordinals_come_from_the_first_label() {
        assert_eq!(ordinal_of("web-0"), Some(0));
        assert_eq!(ordinal_of("web-12.web.prod.svc.cluster.local"), Some(12));
        assert_eq!(ordinal_of("my-db-7"), Some(7));
        for none in ["web", "web-", "web-x1", "web-1x", "", "web-12345678901", "a.b-3"] {
            assert_eq!(ordinal_of(none), None, "{none}");
        }
    }

    #[test]
    fn sources_are_tried_in_order_and_a_bad_variable_is_an_error() {
        let var = format!("STEADY_TEST_INDEX_{}", std::process::id());
        let unset = IdentitySource::Env(format!("{var}_UNSET"));
        let id = resolve(&[unset.clone(), IdentitySource::Explicit(4)]).unwrap();
        assert_eq!((id.index(), id.origin()), (4, &Origin::Explicit));
        // Safety of set_var: this test alone uses this variable.
        std::env::set_var(&var, " 17 ");
        let id = resolve(&[IdentitySource::Env(var.clone()), IdentitySource::Explicit(4)]).unwrap();
        assert_eq!((id.index(), id.origin()), (17, &Origin::Env(var.clone())));
        std::env::set_var(&var, "seventeen");
        assert!(matches!(resolve(&[IdentitySource::Env(var.clone())]), Err(IdentityError::BadEnv { .. })));
        std::env::remove_var(&var);
        let random = resolve(&[unset]).unwrap();
        assert_eq!(random.origin(), &Origin::Random);
        assert!(matches!(random.algorithm(), Algorithm::Random(_)));
        assert_eq!(Identity::new(3, Origin::Explicit).algorithm(), Algorithm::default());
    }

    #[test]
    fn zones_come_from_the_first_source_that_has_one_and_a_bad_label_is_an_error() {
        let var = format!("STEADY_TEST_ZONE_{}", std::process::id());
        let b = Zone::new("us-east1-b").unwrap();
        assert_eq!(resolve_zone(&[]), Ok(None));
        let unset = ZoneSource::Env(format!("{var}_UNSET"));
        assert_eq!(resolve_zone(std::slice::from_ref(&unset)), Ok(None));
        assert_eq!(resolve_zone(&[unset, ZoneSource::Explicit(b.clone())]), Ok(Some(b.clone())));
        // Safety of set_var: this test alone uses this variable.
        std::env::set_var(&var, " eu-west-2a ");
        let from_env = resolve_zone(&[ZoneSource::Env(var.clone()), ZoneSource::Explicit(b.clone())]);
        assert_eq!(from_env, Ok(Some(Zone::new("eu-west-2a").unwrap())));
        std::env::set_var(&var, "");
        assert_eq!(
            resolve_zone(&[ZoneSource::Env(var.clone()), ZoneSource::Explicit(b.clone())]),
            Ok(Some(b.clone()))
        );
        std::env::set_var(&var, "a zone");
        assert!(matches!(
            resolve_zone(&[ZoneSource::Env(var.clone())]),
            Err(IdentityError::BadZone { error: ZoneError::Character(' '), .. })
        ));
        std::env::remove_var(&var);
        assert_eq!(ZoneSource::env(), ZoneSource::Env("STEADY_ZONE".to_owned()));

        // Without a zone an identity is as before; with one, its index is the zone's.
        let plain = Identity::new(3, Origin::Explicit);
        assert_eq!((plain.zone(), plain.locality()), (None, None));
        let zoned = plain.with_zone(Some(b.clone()));
        assert_eq!((zoned.index(), zoned.zone()), (3, Some(&b)));
        assert_eq!(zoned.locality(), Some(Locality::new(b, 3)));
        assert_eq!(zoned.algorithm(), Algorithm::default());
    }
}
