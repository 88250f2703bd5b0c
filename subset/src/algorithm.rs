//! Choosing an algorithm at run time, by value or by name.

use std::fmt;
use std::str::FromStr;

use crate::{
    Consistent, DecimalRocksteadier, DecimalRocksteadierOrder, Deterministic, DeterministicBalanced,
    PreferenceOrder, Random, Ringsteady, RingsteadyOrder, Rocksteadier, RocksteadierOrder, RoundRobin,
    SubsetError, Subsetting,
};

/// Any of the crate's algorithms, for configuration and command lines.
///
/// The default, from the first release, is [`DecimalRocksteadier`] with lots of 10
/// (`rocksteadier-decimal`): exact on every production-like fleet, where [`Rocksteadier`]
/// drops to 0.5, and a little better on the article's grid, with the same churn, spread and
/// cost (`docs/rocksteadier-decimal.md`). [`Rocksteadier`] keeps its name and its frozen
/// order; a fleet already on it pins it with `Algorithm::Rocksteadier(Rocksteadier::default())`
/// (or the name `rocksteadier`), since switching algorithms moves most subsets once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Algorithm {
    /// See [`RoundRobin`].
    RoundRobin(RoundRobin),
    /// See [`Deterministic`].
    Deterministic(Deterministic),
    /// See [`DeterministicBalanced`].
    DeterministicBalanced(DeterministicBalanced),
    /// See [`Random`].
    Random(Random),
    /// See [`Consistent`].
    Consistent(Consistent),
    /// See [`Ringsteady`] (scaled or unscaled).
    Ringsteady(Ringsteady),
    /// See [`Rocksteadier`].
    Rocksteadier(Rocksteadier),
    /// See [`DecimalRocksteadier`].
    DecimalRocksteadier(DecimalRocksteadier),
}

impl Default for Algorithm {
    fn default() -> Self {
        Self::DecimalRocksteadier(DecimalRocksteadier::default())
    }
}

impl Algorithm {
    /// Every algorithm's name, in the order of [`Algorithm::all`].
    pub const NAMES: [&'static str; 9] = [
        "round-robin",
        "deterministic",
        "deterministic-balanced",
        "random",
        "consistent",
        "ringsteady",
        "ringsteady-unscaled",
        "rocksteadier",
        "rocksteadier-decimal",
    ];

    /// Every algorithm with its default configuration, in the order of [`Algorithm::NAMES`].
    pub fn all() -> Vec<Algorithm> {
        Self::NAMES.iter().map(|n| Self::from_name(n).expect("every listed name parses")).collect()
    }

    /// The algorithm called `name` (see [`Algorithm::NAMES`]), with its default configuration.
    ///
    /// # Errors
    ///
    /// [`SubsetError::UnknownAlgorithm`] for any other name.
    pub fn from_name(name: &str) -> Result<Self, SubsetError> {
        Ok(match name {
            "round-robin" => Self::RoundRobin(RoundRobin),
            "deterministic" => Self::Deterministic(Deterministic::default()),
            "deterministic-balanced" => Self::DeterministicBalanced(DeterministicBalanced::default()),
            "random" => Self::Random(Random::default()),
            "consistent" => Self::Consistent(Consistent::default()),
            "ringsteady" => Self::Ringsteady(Ringsteady::new()),
            "ringsteady-unscaled" => Self::Ringsteady(Ringsteady::unscaled()),
            "rocksteadier" => Self::Rocksteadier(Rocksteadier::default()),
            "rocksteadier-decimal" => Self::DecimalRocksteadier(DecimalRocksteadier::default()),
            other => return Err(SubsetError::UnknownAlgorithm(other.to_owned())),
        })
    }

    fn as_subsetting(&self) -> &dyn Subsetting {
        match self {
            Self::RoundRobin(a) => a,
            Self::Deterministic(a) => a,
            Self::DeterministicBalanced(a) => a,
            Self::Random(a) => a,
            Self::Consistent(a) => a,
            Self::Ringsteady(a) => a,
            Self::Rocksteadier(a) => a,
            Self::DecimalRocksteadier(a) => a,
        }
    }

    /// Whether this algorithm's subsets nest (it has a [`PreferenceOrder`]).
    pub fn has_order(&self) -> bool {
        !matches!(self, Self::RoundRobin(_) | Self::Deterministic(_) | Self::DeterministicBalanced(_))
    }

    /// Frontend `frontend`'s preference order, or `None` for the algorithms whose
    /// subsets do not nest (round-robin and the deterministic family).
    ///
    /// # Errors
    ///
    /// [`SubsetError::TooManyBackends`] when `backends > MAX_BACKENDS`.
    pub fn order(&self, frontend: usize, backends: usize) -> Result<Option<AlgorithmOrder>, SubsetError> {
        Ok(Some(match self {
            Self::Random(a) => AlgorithmOrder::Sorted(a.order(frontend, backends)?),
            Self::Consistent(a) => AlgorithmOrder::Sorted(a.order(frontend, backends)?),
            Self::Ringsteady(a) => AlgorithmOrder::Ringsteady(a.order(frontend, backends)?),
            Self::Rocksteadier(a) => AlgorithmOrder::Rocksteadier(a.order(frontend, backends)?),
            Self::DecimalRocksteadier(a) => AlgorithmOrder::DecimalRocksteadier(a.order(frontend, backends)?),
            Self::RoundRobin(_) | Self::Deterministic(_) | Self::DeterministicBalanced(_) => return Ok(None),
        }))
    }
}

impl Subsetting for Algorithm {
    fn name(&self) -> &'static str {
        self.as_subsetting().name()
    }

    fn subset_into(
        &self,
        frontend: usize,
        backends: usize,
        size: usize,
        out: &mut Vec<usize>,
    ) -> Result<(), SubsetError> {
        self.as_subsetting().subset_into(frontend, backends, size, out)
    }

    fn job_subsets(
        &self,
        frontends: usize,
        backends: usize,
        size: usize,
    ) -> Result<Vec<Vec<usize>>, SubsetError> {
        self.as_subsetting().job_subsets(frontends, backends, size)
    }
}

impl FromStr for Algorithm {
    type Err = SubsetError;

    fn from_str(s: &str) -> Result<Self, SubsetError> {
        Self::from_name(s)
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The preference order of an [`Algorithm`] chosen at run time.
#[derive(Debug, Clone)]
pub enum AlgorithmOrder {
    /// An order computed up front by sorting (Random, Consistent).
    Sorted(std::vec::IntoIter<usize>),
    /// A lazy Ringsteady order.
    Ringsteady(RingsteadyOrder),
    /// A lazy Rocksteadier order.
    Rocksteadier(RocksteadierOrder),
    /// A lazy decimal Rocksteadier order.
    DecimalRocksteadier(DecimalRocksteadierOrder),
}

impl Iterator for AlgorithmOrder {
    type Item = usize;

    #[inline]
    fn next(&mut self) -> Option<usize> {
        match self {
            Self::Sorted(it) => it.next(),
            Self::Ringsteady(it) => it.next(),
            Self::Rocksteadier(it) => it.next(),
            Self::DecimalRocksteadier(it) => it.next(),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match self {
            Self::Sorted(it) => it.size_hint(),
            Self::Ringsteady(it) => it.size_hint(),
            Self::Rocksteadier(it) => it.size_hint(),
            Self::DecimalRocksteadier(it) => it.size_hint(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for (name, alg) in Algorithm::NAMES.iter().zip(Algorithm::all()) {
            assert_eq!(alg.name(), *name);
            assert_eq!(name.parse::<Algorithm>().unwrap(), alg);
        }
        assert!(matches!("ringsteadier".parse::<Algorithm>(), Err(SubsetError::UnknownAlgorithm(_))));
    }

    #[test]
    fn default_is_decimal_rocksteadier_with_lots_of_ten() {
        assert_eq!(Algorithm::default(), Algorithm::DecimalRocksteadier(DecimalRocksteadier::default()));
        assert_eq!(Algorithm::default().name(), "rocksteadier-decimal");
        assert_eq!(Algorithm::default(), Algorithm::from_name("rocksteadier-decimal").unwrap());
        // The original keeps its name.
        assert_eq!(
            Algorithm::from_name("rocksteadier").unwrap(),
            Algorithm::Rocksteadier(Rocksteadier::default())
        );
    }
}
