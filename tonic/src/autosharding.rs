//! A [`SteadyChannel`] following an A119 server (gRPC's autosharding protocol):
//! [`SteadyChannel::follow_autosharding`].

use std::sync::Arc;

use steady_balance::ConfigError;
use steady_proto::autosharding::{follow_autosharding, AutoshardingConfig};
use steady_proto::WatchEndpoint;

use crate::channel::SteadyChannel;

impl SteadyChannel {
    /// Follows the A119 server at `endpoint` (`AutoshardingService`) for `target`'s
    /// assignments (steady's servers take the job name), and reports this channel's
    /// keyed requests to it, one per request per key, as load on the same stream (see
    /// [`follow_autosharding`] for the stream: acks, reconnection, which refusals end
    /// it). It replaces any source followed before, as
    /// [`follow_assignments`](SteadyChannel::follow_assignments) does.
    ///
    /// What `config` leaves unset, the channel fills in:
    /// * endpoint names ([`AutoshardingConfig::endpoint_names`]): a name is a task's
    ///   address as the channel's job view has it (`"10.0.0.7:50051"`, the host and port
    ///   of its endpoint, or its whole URI), else a task index in decimal (`"7"`). An
    ///   assignment naming an address the view does not hold (yet) for every endpoint of
    ///   a slice is rejected: steady routes every key to a task.
    /// * the load ([`AutoshardingConfig::load_source`]): the channel's keyed requests,
    ///   counted from this call on in a [`KeyTally`](crate::KeyTally) of
    ///   [`DEFAULT_TALLY_KEYS`](crate::DEFAULT_TALLY_KEYS) keys (1 MiB). Counting costs a
    ///   keyed request two relaxed atomic operations; a request routed again after a
    ///   refusal, and a hedged attempt, are not counted again. A channel that follows a
    ///   server twice keeps one tally.
    ///
    /// To follow a server without reporting, give `follow_assignments` the stream of
    /// [`follow_autosharding`] with no load source.
    ///
    /// # Errors
    ///
    /// As [`AutoshardingConfig::validate`]; nothing is started.
    pub fn follow_autosharding(
        &self,
        endpoint: impl Into<WatchEndpoint>,
        target: impl Into<String>,
        mut config: AutoshardingConfig,
    ) -> Result<(), ConfigError> {
        config.validate()?;
        if config.endpoint_names.is_none() {
            let names = self.task_names().clone();
            config.endpoint_names = Some(Arc::new(move |name: &str| names.task(name)));
        }
        if config.load_source.is_none() {
            config.load_source = Some(Arc::new(self.key_tally().clone()));
        }
        self.follow_assignments(follow_autosharding(endpoint, target, config)?);
        Ok(())
    }
}
