//! Slicer's data model, as steady uses it: where a key falls, and which backend tasks
//! serve it.
//!
//! * [`SliceKey`]: a request key hashed into the 64-bit key space (XXH3-64, seed 0: the
//!   same value in any language).
//! * [`Assignment`]: one *generation* of the key space's division into slices, each a
//!   start key and the backend tasks (replicas) that serve it. A slice runs from its
//!   start up to the next slice's start, the first starts at 0: every key is in exactly
//!   one slice. Generations start at 1: 0 means "no assignment" wherever generations
//!   are exchanged, so no assignment carries it. Built only through validation
//!   ([`Assignment::new`], or slice by slice with an [`AssignmentBuilder`] as decoders
//!   do), so an `Assignment` value is always valid; [`AssignmentError`] names the first
//!   problem of one that is not.
//! * [`Slice`]: a start key, its replicas and its warming tasks, in 32 bytes with no
//!   allocation of its own for up to five tasks (an assignment of [`MAX_SLICES`] such
//!   slices takes 32 MiB).
//! * The frozen binary wire format ([`Assignment::encode`], [`Assignment::decode`]);
//!   decoding errors are [`DecodeError`]s that name the byte offset and the cause,
//!   apart from the validation errors of well-formed bytes. Decoding takes less than
//!   3 times its input, whatever count the input announces. With the `serde` feature,
//!   JSON: `{"generation": 7, "slices": [{"start": 0, "replicas": [1, 2]}, ...]}`,
//!   validated on the way in.
//! * [`KeyRange`]s: the keys of a slice ([`Assignment::range`]) or of a task
//!   ([`Assignment::slices_of`]), and [`AssignmentDiff`]: which key ranges change owners
//!   between two assignments, and the fraction of the key space they cover (the *key
//!   churn* assigners are measured by).
//! * [`guard`]: exclusive ownership's records (a job's [`guard::Consistency`], the
//!   Assigner's [`guard::Guard`] and each Slicelet's [`guard::Hold`]), frozen like the
//!   wire format.
//!
//! # Dependencies
//!
//! std and `xxhash-rust` (the key hash), plus `serde` when its feature is on. This crate
//! is what the balancer, the tonic channel, the assigner and the control plane share, so
//! it must never depend on any of them, nor on an async runtime, tonic or an etcd client.
//!
//! # Frozen contracts
//!
//! The key hash and the wire format are read by every client and server of a fleet,
//! whatever version each runs: golden vectors in `tests/golden/slicing.txt` pin them.
//!
//! # Example
//!
//! ```
//! use steady_slice::{Assignment, Slice, SliceKey};
//!
//! // Two slices: keys below 2^63 on tasks 1 and 2, the rest on task 3.
//! let a = Assignment::new(7, vec![
//!     Slice::new(SliceKey::MIN, vec![1, 2]),
//!     Slice::new(SliceKey(1 << 63), vec![3]),
//! ])?;
//! let key = SliceKey::of("user:42");
//! assert!(!a.slice_for(key).replicas().is_empty());
//! assert_eq!(a.slices_of(3).map(|r| r.fraction()).sum::<f64>(), 0.5);
//! assert_eq!(Assignment::decode(&a.encode()), Ok(a));
//! # Ok::<(), steady_slice::AssignmentError>(())
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub, rust_2018_idioms)]

mod assignment;
mod codec;
mod diff;
pub mod guard;
mod key;
mod range;
mod slice;

pub use assignment::{Assignment, AssignmentBuilder, AssignmentError, MAX_REPLICAS, MAX_SLICES, MAX_TASK};
pub use codec::{DecodeError, Malformed};
pub use diff::AssignmentDiff;
pub use key::SliceKey;
pub use range::KeyRange;
pub use slice::Slice;
