//! [`BalanceLayer`]: a tower `Layer` that turns a connector into a [`Balance`].

use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;
use tower::{Layer, Service};

use crate::config::BalanceConfig;
use crate::connector::{Address, Connector};
use crate::service::Balance;
use steady_core::ConfigError;
use steady_core::JobView;

/// Wraps a connector (a `Service` from a task address to a connection) into a
/// [`Balance`] over the backend job that `views` describes.
///
/// Each `layer` call starts a balancer with its own control task (so it must run
/// inside a tokio runtime) that follows the same job views. The configuration is
/// validated when the layer is made, so `layer` cannot fail.
#[derive(Debug, Clone)]
pub struct BalanceLayer<T> {
    config: BalanceConfig,
    views: watch::Receiver<JobView<T>>,
}

impl<T> BalanceLayer<T> {
    /// A layer for `config`, following the job views published on `views`.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] for the first value of `config` out of its range (see
    /// [`BalanceConfig::validate`]).
    pub fn new(config: BalanceConfig, views: watch::Receiver<JobView<T>>) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Self { config, views })
    }
}

impl<T, C, S> Layer<C> for BalanceLayer<T>
where
    T: Address,
    // `Response = S` ties `S` to `C` (a generic parameter alone would not).
    C: Connector<T, S> + Service<T, Response = S>,
    S: Send + Sync + 'static,
{
    type Service = Balance<S>;

    fn layer(&self, connector: C) -> Balance<S> {
        Balance::new(self.config.clone(), connector, WatchStream::new(self.views.clone()))
            .expect("the configuration was validated when the layer was made")
    }
}
