//! The one error type of the crate.

use std::fmt;

/// Why a subset could not be computed or an algorithm could not be configured.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SubsetError {
    /// The backend job is larger than [`crate::MAX_BACKENDS`].
    TooManyBackends {
        /// The number of backends asked for.
        backends: usize,
        /// The largest number accepted.
        max: usize,
    },
    /// A Rocksteadier lot size outside `1..=max`.
    InvalidLotSize {
        /// The lot size asked for.
        lot_size: usize,
        /// The largest lot size accepted.
        max: usize,
    },
    /// A Rocksteadier row permutation that is not a permutation of `0..lot_size`.
    InvalidRowPermutation {
        /// The lot size the permutation must cover.
        lot_size: usize,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// An algorithm name that [`crate::Algorithm::from_name`] does not know.
    UnknownAlgorithm(String),
}

impl fmt::Display for SubsetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooManyBackends { backends, max } => {
                write!(f, "backend job of {backends} tasks exceeds the limit of {max}")
            }
            Self::InvalidLotSize { lot_size, max } => {
                write!(f, "lot size {lot_size} is outside 1..={max}")
            }
            Self::InvalidRowPermutation { lot_size, reason } => {
                write!(f, "row permutation is not a permutation of 0..{lot_size}: {reason}")
            }
            Self::UnknownAlgorithm(name) => write!(
                f,
                "unknown subsetting algorithm {name:?} (known: {})",
                crate::Algorithm::NAMES.join(", ")
            ),
        }
    }
}

impl std::error::Error for SubsetError {}
