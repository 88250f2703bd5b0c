//! [`ClientTlsSource`]: a client's TLS settings, replaceable, read at each connection.

use std::fmt;
use std::sync::Arc;

use arc_swap::ArcSwap;
use steady_core::error_chain;
use tonic::transport::{ClientTlsConfig, Endpoint};

use super::TlsError;

/// A client's TLS settings (its CA bundle, its identity for mutual TLS, the server name)
/// that may be replaced while it runs; each new connection made through it reads the
/// current ones.
///
/// Clones share the settings: keep one to [`ClientTlsSource::replace`] when the
/// certificate files change, give others to what connects
/// (`steady_tonic::EndpointTemplate::tls_source`,
/// `steady_slicelet::Slicelet::report_to_tls`, or [`ClientTlsSource::apply`] for an
/// endpoint of your own). A connection already made keeps the identity it presented:
/// the new one is shown at the next connection (a member reconnected after a failure,
/// a new member, a report stream reopened).
#[derive(Clone)]
pub struct ClientTlsSource {
    current: Arc<ArcSwap<ClientTlsConfig>>,
}

impl fmt::Debug for ClientTlsSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTlsSource").finish_non_exhaustive()
    }
}

impl ClientTlsSource {
    /// Starts with `tls`.
    ///
    /// # Errors
    ///
    /// [`TlsError::Client`] when tonic cannot build a connection with it (a CA or an
    /// identity that does not parse, a key that is not the certificate's).
    pub fn new(tls: ClientTlsConfig) -> Result<Self, TlsError> {
        check(&tls)?;
        Ok(Self { current: Arc::new(ArcSwap::from_pointee(tls)) })
    }

    /// Connects with `tls` from the next connection on.
    ///
    /// # Errors
    ///
    /// As [`ClientTlsSource::new`]; the current settings then stay.
    pub fn replace(&self, tls: ClientTlsConfig) -> Result<(), TlsError> {
        check(&tls)?;
        self.current.store(Arc::new(tls));
        Ok(())
    }

    /// The settings in force now.
    pub fn current(&self) -> ClientTlsConfig {
        ClientTlsConfig::clone(&self.current.load())
    }

    /// `endpoint` with the settings in force now (for one connection: a later one
    /// should call this again).
    ///
    /// # Errors
    ///
    /// tonic's, for an endpoint that cannot take TLS (a Unix socket).
    pub fn apply(&self, endpoint: Endpoint) -> Result<Endpoint, tonic::transport::Error> {
        endpoint.tls_config(self.current())
    }
}

/// Whether tonic builds a connector of `tls` (it parses the CA and the identity, and
/// checks the key is the certificate's).
fn check(tls: &ClientTlsConfig) -> Result<(), TlsError> {
    Endpoint::from_static("https://steady.invalid")
        .tls_config(tls.clone())
        .map(drop)
        .map_err(|e| TlsError::Client { reason: error_chain(&e) })
}
