//! Backend subsetting: which `k` of a backend job's `N` tasks each frontend task connects to.
//!
//! A frontend job of `M` tasks calling a backend job of `N` tasks would need `M × N`
//! connections; with subsetting each frontend task keeps only `k`. *Which* `k` matters:
//! the choice decides how evenly connections (and so load) spread over the backends
//! (**balance**), how many distinct subsets exist (**diversity**: one bad frontend
//! should not share its fate with many others), how many connections move when a job
//! resizes (**churn**) and how much of a subset a rolling restart takes down at once
//! (**spread**). The [`quality`] module measures all four.
//!
//! Frontend tasks are numbered `0..M` and backend tasks `0..N`. Every algorithm here
//! implements [`Subsetting`]: `(frontend m, backends N, size k) -> ` an ordered list of
//! `min(k, N)` distinct backends below `N`. The algorithms whose subsets nest also
//! implement [`PreferenceOrder`]: they expose the frontend's whole order of the `N`
//! backends, and the subset of size `k` is its first `k` entries, so growing `k` never
//! drops a connection and an unhealthy member is replaced by the next one in the order.
//!
//! | algorithm | order | balance | churn when N changes by one | notes |
//! |---|---|---|---|---|
//! | [`RoundRobin`] | no | ideal | large | only `N / gcd(k, N)` distinct subsets |
//! | [`Deterministic`] | no | good | whole subsets | the SRE book's algorithm |
//! | [`DeterministicBalanced`] | no | very good | whole subsets | leftovers rotated |
//! | [`Random`] | yes | poor | at most 1 | gRPC's random subsetting (gRFC A68) |
//! | [`Consistent`] | yes | poor | at most 1 | hashed ring; at most `N` subsets |
//! | [`Ringsteady`] | yes | good | small | van der Corput ring |
//! | [`Rocksteadier`] | yes | good | at most 1 | lots of 10, shuffled |
//! | [`DecimalRocksteadier`] | yes | better; exact at round sizes | at most 1 | **the default**: Rocksteadier on the decimal ring |
//!
//! [`Algorithm::default()`] is [`DecimalRocksteadier`] from the first release: it balances
//! every production-like fleet exactly (worst utilisation 1.0 where [`Rocksteadier`] has
//! 0.5), a little better on the article's grid, with the same churn, spread and cost. Each
//! algorithm's order is its own frozen contract, so a fleet that wants [`Rocksteadier`]
//! names it (`Algorithm::Rocksteadier(Rocksteadier::default())`, or `rocksteadier` on a
//! command line) and keeps its subsets. `docs/rocksteadier-decimal.md` has the figures.
//!
//! # Dependencies
//!
//! None but std, and it must stay so: every frontend of a fleet computes the same orders
//! with this code, and nothing a dependency changes may change them.
//!
//! # The order is a contract
//!
//! Every frontend of a fleet must compute the same subsets, whichever version of this
//! crate it runs. The hashes ([`hash`]), the generator, bounded draw and shuffle
//! ([`prng`]) and each algorithm's use of them are specified in these docs and pinned
//! by golden vectors in the tests; no dependency can change them (this crate has none).
//!
//! # Example
//!
//! ```
//! use steady_subset::{Algorithm, DecimalRocksteadier, PreferenceOrder, Subsetting};
//!
//! // The default algorithm (`Algorithm::default()` is the same, chosen at run time).
//! let decimal = DecimalRocksteadier::default();
//! // Frontend task 13 of its job, a backend job of 55 tasks, 10 connections.
//! let subset = decimal.subset(13, 55, 10)?;
//! assert_eq!(subset.len(), 10);
//! assert_eq!(Algorithm::default().subset(13, 55, 10)?, subset);
//! // The subset is the start of the frontend's preference order.
//! let order: Vec<usize> = decimal.order(13, 55)?.collect();
//! assert_eq!(order.len(), 55);
//! assert_eq!(&order[..10], &subset[..]);
//! # Ok::<(), steady_subset::SubsetError>(())
//! ```
//!
//! # Sources
//!
//! * P. Ward, P. Wankadia, K. Guliani, "Reinventing Backend Subsetting at Google",
//!   ACM Queue 20(5), 2022: the metrics, round-robin, the balanced deterministic variant,
//!   consistent, Ringsteady and Rocksteadier subsetting. It does not publish a PRNG, a
//!   shuffle or every detail of Rocksteadier; the choices here are this crate's own and
//!   are documented on each type.
//! * B. Beyer et al., *Site Reliability Engineering*, O'Reilly 2016, chapter 20:
//!   deterministic subsetting.
//! * gRPC proposal A68, random subsetting: ordering backends by a seeded hash.
//!
//! # Costs
//!
//! Ringsteady answers one frontend in `O(log N + k)` time, Rocksteadier in
//! `O(log N + k × L)` (lots of `L = 10`) and decimal Rocksteadier in `O(log N + k)`,
//! all in `O(k)` memory, without building the ring. Random, Consistent and the deterministic family touch every backend: `O(N)`
//! (or `O(N log N)` to sort) per call.

#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub, rust_2018_idioms)]

mod algorithm;
mod consistent;
pub mod decimal_ring;
mod decimal_rocksteadier;
mod deterministic;
mod error;
pub mod hash;
mod lot_table;
pub mod prng;
pub mod quality;
mod random;
pub mod ring;
mod ringsteady;
mod rocksteadier;
mod round_robin;

pub use algorithm::{Algorithm, AlgorithmOrder};
pub use consistent::Consistent;
pub use decimal_rocksteadier::{DecimalRocksteadier, DecimalRocksteadierOrder, DECIMAL_ROW_PERMUTATION};
pub use deterministic::{Deterministic, DeterministicBalanced};
pub use error::SubsetError;
pub use lot_table::{DEFAULT_LOT_SIZE, MAX_LOT_SIZE};
pub use random::Random;
pub use ringsteady::{Ringsteady, RingsteadyOrder};
pub use rocksteadier::{Rocksteadier, RocksteadierOrder, ARTICLE_ROW_PERMUTATION};
pub use round_robin::RoundRobin;

/// The largest backend job any algorithm accepts: 2^24 = 16,777,216 tasks.
///
/// Far above any real job, and low enough that the algorithms that touch every
/// backend (`O(N)` memory) cannot be asked to allocate without bound.
pub const MAX_BACKENDS: usize = 1 << 24;

/// A subsetting algorithm: which backends frontend `m` connects to.
///
/// # Contract
///
/// For any `frontend`, `backends = N <= MAX_BACKENDS` and `size = k`, the subset is a
/// list of exactly `min(k, N)` distinct backend indices, each below `N`, the same on
/// every call, on every machine and in every version of the crate. The list is in the
/// frontend's preference order (first is most preferred). `N = 0` or `k = 0` gives an
/// empty list.
///
/// The frontend job's size `M` is not an input: a frontend's subset cannot depend on
/// how many other frontends there are, so no algorithm here has frontend churn.
///
/// # Errors
///
/// [`SubsetError::TooManyBackends`] when `N > MAX_BACKENDS`. No input panics.
pub trait Subsetting {
    /// The algorithm's stable name, as the lab CLI spells it (e.g. `"rocksteadier"`).
    fn name(&self) -> &'static str;

    /// Writes frontend `frontend`'s subset of `backends` tasks, of size `size`, into
    /// `out` (which is cleared first). Lets a caller reuse one buffer across frontends.
    fn subset_into(
        &self,
        frontend: usize,
        backends: usize,
        size: usize,
        out: &mut Vec<usize>,
    ) -> Result<(), SubsetError>;

    /// Frontend `frontend`'s subset of `backends` tasks, of size `size`.
    fn subset(&self, frontend: usize, backends: usize, size: usize) -> Result<Vec<usize>, SubsetError> {
        check_backends(backends)?;
        let mut out = Vec::with_capacity(size.min(backends));
        self.subset_into(frontend, backends, size, &mut out)?;
        Ok(out)
    }

    /// The subsets of every frontend `0..frontends`: element `m` equals
    /// `self.subset(m, backends, size)`.
    ///
    /// Algorithms override it when frontends can share work (one shuffle per
    /// deterministic round, one sorted ring for consistent hashing); the lab and the
    /// quality metrics use it to evaluate whole fleets.
    fn job_subsets(
        &self,
        frontends: usize,
        backends: usize,
        size: usize,
    ) -> Result<Vec<Vec<usize>>, SubsetError> {
        (0..frontends).map(|m| self.subset(m, backends, size)).collect()
    }
}

/// An algorithm whose subsets nest: the subset of size `k` is the first `k` entries of
/// the frontend's preference order over all `N` backends.
///
/// Consequences users can rely on: growing `k` opens connections and never closes
/// one (no subset-size churn beyond the growth), and when a member is unhealthy the
/// next backend in the order is the natural stand-in.
pub trait PreferenceOrder: Subsetting {
    /// The iterator over the order: yields each of the `N` backends exactly once.
    type Order: Iterator<Item = usize>;

    /// Frontend `frontend`'s preference order over `backends` tasks.
    ///
    /// # Errors
    ///
    /// [`SubsetError::TooManyBackends`] when `backends > MAX_BACKENDS`.
    fn order(&self, frontend: usize, backends: usize) -> Result<Self::Order, SubsetError>;
}

/// Rejects backend counts above [`MAX_BACKENDS`].
fn check_backends(backends: usize) -> Result<(), SubsetError> {
    if backends > MAX_BACKENDS {
        Err(SubsetError::TooManyBackends { backends, max: MAX_BACKENDS })
    } else {
        Ok(())
    }
}

/// `subset_into` for a [`PreferenceOrder`]: the first `size` entries of the order.
fn take_prefix<A: PreferenceOrder + ?Sized>(
    algorithm: &A,
    frontend: usize,
    backends: usize,
    size: usize,
    out: &mut Vec<usize>,
) -> Result<(), SubsetError> {
    out.clear();
    out.extend(algorithm.order(frontend, backends)?.take(size));
    Ok(())
}
