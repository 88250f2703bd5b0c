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

use std::fmt;

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

/// A task's index in its job. When it was leased from a registry, the lease is held as
/// long as this value lives and released when it is dropped.
pub struct Identity {
    index: usize,
    origin: Origin,
    /// Keeps a registry lease alive; dropped with the identity.
    #[allow(dead_code)]
    guard: Option<Box<dyn Send + Sync>>,
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Identity")
            .field("index", &self.index)
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

impl Identity {
    /// An index with no lease behind it.
    pub fn new(index: usize, origin: Origin) -> Self {
        Self { index, origin, guard: None }
    }

    /// An index held by `guard` (a registry lease kept alive until the identity drops).
    pub fn leased(index: usize, guard: impl Send + Sync + 'static) -> Self {
        Self { index, origin: Origin::Registry, guard: Some(Box::new(guard)) }
    }

    /// The index.
    pub fn index(&self) -> usize {
        self.index
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
}

impl fmt::Display for IdentityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BadEnv { var, value } => write!(f, "identity: {var}={value:?} is not a task index"),
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
}
