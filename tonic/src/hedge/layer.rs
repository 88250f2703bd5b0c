//! [`HedgeLayer`]: hedging as a tower layer over a [`SteadyChannel`].

use tower::Layer;

use super::policy::HedgeConfig;
use super::service::Hedge;
use crate::channel::SteadyChannel;

/// Wraps a [`SteadyChannel`] in a [`Hedge`] configured by a [`HedgeConfig`].
///
/// Each service the layer builds has a budget of its own (clones of one [`Hedge`]
/// share theirs): layer a channel once and clone the result.
#[derive(Debug, Clone)]
pub struct HedgeLayer {
    config: HedgeConfig,
}

impl HedgeLayer {
    /// A layer hedging as `config` says.
    pub fn new(config: HedgeConfig) -> Self {
        Self { config }
    }
}

impl Layer<SteadyChannel> for HedgeLayer {
    type Service = Hedge;

    fn layer(&self, channel: SteadyChannel) -> Hedge {
        Hedge::new(channel, self.config.clone())
    }
}
