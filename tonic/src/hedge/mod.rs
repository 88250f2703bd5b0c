//! Hedging for a [`SteadyChannel`](crate::SteadyChannel), as gRFC A6's hedging policy
//! describes it, throttled by a retry budget as Finagle's and linkerd's are.
//!
//! A request to a hedged method goes to one member; if no answer has come after the
//! policy's delay, a copy goes to another member, and so on up to the policy's most
//! attempts. The first answer wins and the other attempts are cancelled. Each attempt
//! after the first goes to a member none of the earlier attempts went to (for a keyed
//! request, another ready replica of its slice); when there is none, it is not sent.
//! Every attempt after the first withdraws from a [`RetryBudget`] (a share of the
//! requests plus a floor per second), so an incident across the fleet, when every
//! request is slow, is not made worse by hedging: past the budget, requests are sent
//! once.
//!
//! * [`HedgingPolicy`]: a method's delay, most attempts (2 to 5) and non-fatal codes.
//! * [`HedgeConfig`]: the policies by method path (`/package.Service/Method`) and the
//!   budget. A method not named is sent once, untouched.
//! * [`RetryBudget`]: the budget (default 10% of requests plus 10 a second over 10 s;
//!   tower's `TpsBudget` keeps it).
//! * [`Hedge`] / [`HedgeLayer`]: a channel that hedges, and the layer that builds one;
//!   [`HedgeStats`] counts what it did.
//!
//! Only requests whose body could be kept are hedged: unary and server-streaming calls
//! of at most [`MAX_REPLAY_BYTES`](crate::MAX_REPLAY_BYTES). A client stream, or a larger
//! body, is sent once (counted in [`HedgeStats::sent_once`]).
//!
//! # A layer over the channel, not a builder option
//!
//! Hedging wraps the channel ([`HedgeLayer`] over a [`SteadyChannel`](crate::SteadyChannel))
//! rather than being a setting of its builder: a channel that hedges nothing runs no
//! code of hedging at all, its request path is the same instructions; a channel that
//! hedges some methods pays, for the others, one binary search of the method's path
//! over the hedged ones. Other layers compose around it as a caller expects: a
//! timeout or `CallMetricsLayer` outside the hedge sees the request as a whole, its
//! attempts being the hedge's business. The attempts still go through the channel's
//! balancer, which is what lets each pick a different member.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use steady_balance::BalanceConfig;
//! use steady_tonic::hedge::{HedgeConfig, HedgeLayer, HedgingPolicy, RetryBudget};
//! use steady_tonic::SteadyChannel;
//! use tonic::transport::Endpoint;
//! use tonic::Code;
//! use tower::Layer;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let backends: Vec<Endpoint> = (0..8)
//!     .map(|i| Endpoint::from_shared(format!("http://backend-{i}:50051")))
//!     .collect::<Result<_, _>>()?;
//! let channel = SteadyChannel::builder(BalanceConfig::new(0, 4)).from_endpoints(backends)?;
//! // An idempotent read: a second attempt after 3 ms without an answer (a little above
//! // its p99), a third after 6; an UNAVAILABLE answer sends the next one at once.
//! let policy = HedgingPolicy::new(3, Duration::from_millis(3))?.with_non_fatal_codes([Code::Unavailable])?;
//! let config = HedgeConfig::new()
//!     .method("/shop.Catalog/GetItem", policy)?
//!     .budget(RetryBudget::new(0.05, 10, Duration::from_secs(10))?);
//! let hedged = HedgeLayer::new(config).layer(channel);
//! // let client = CatalogClient::new(hedged.clone());
//! println!("{:?}", hedged.stats());
//! # Ok(())
//! # }
//! ```
//!
//! The guide, with what it costs and what was measured: `docs/hedging.md` in the
//! repository.

mod budget;
mod future;
mod layer;
mod policy;
mod service;
mod stats;

pub use budget::RetryBudget;
pub use future::ResponseFuture;
pub use layer::HedgeLayer;
pub use policy::{HedgeConfig, HedgingPolicy, MAX_ATTEMPTS, MAX_DELAY};
pub use service::Hedge;
pub use stats::HedgeStats;
