//! The request side: what a request reads and does, without locks or waiting for the
//! control task.
//!
//! The pieces, from the leaves up (each module imports only the ones before it):
//! * [`key_counts`]: keyed requests counted per bin, for assignments made in process.
//! * [`gate`]: which picks may choose a member (open, slow start, probation, broken),
//!   in one atomic word.
//! * [`load`]: the load signals (requests in flight, Peak EWMA) behind the [`load::Load`]
//!   trait the pick asks.
//! * [`calls`]: a member's call counters.
//! * [`endpoint`]: one connection (its gate, load signal and counters), what it tells
//!   the control task, and the in-flight guard a request holds.
//! * [`pick`]: power of two choices with its tie band, and the per-thread generator.
//! * [`load_bound`]: bounded-load keyed routing: where a keyed request goes when its
//!   replica has far more in flight than the mean.
//! * [`slices`]: the keyed half of the table: per slice of the assignment in force, the
//!   replicas this frontend uses and which are ready.
//! * [`spill`]: for a zone-aware frontend whose zone cannot take all its requests, the
//!   other zones' members and their shares.
//! * [`table`]: the immutable routing table the control task publishes, and the state
//!   the request side shares with it ([`table::Shared`]).
//! * [`wait`]: the slow path: waiting for a ready member within the request's one
//!   budget for all its waits.
//! * [`future`]: the response future: the slow path's wait, the chosen backend's
//!   readiness, and a move to another member for a request that was never sent.

pub(crate) mod calls;
pub(crate) mod endpoint;
pub(crate) mod future;
pub(crate) mod gate;
pub(crate) mod key_counts;
pub(crate) mod load;
pub(crate) mod load_bound;
pub(crate) mod pick;
pub(crate) mod slices;
pub(crate) mod spill;
pub(crate) mod table;
pub(crate) mod wait;
