//! TLS whose certificates can be rotated while serving and connecting (feature `tls`):
//! what a fleet needs when certificates live for hours (cert-manager, SPIFFE) and no
//! process may drop its open streams to take a new one.
//!
//! * **Serving.** [`ServerIdentity`] is a rustls certificate resolver
//!   ([`rustls::server::ResolvesServerCert`]) whose certificate and key can be replaced;
//!   [`ClientCas`] is a client-certificate verifier
//!   ([`rustls::server::danger::ClientCertVerifier`]) whose CA bundle can be replaced.
//!   [`server_config`] makes a rustls `ServerConfig` of any resolver and verifier (these,
//!   or an application's own, such as a SPIFFE workload-API source), and
//!   [`TlsIncoming`] accepts connections on a listener with it, for tonic's
//!   `Router::serve_with_incoming`:
//!
//!   ```no_run
//!   # async fn run(cert: &[u8], key: &[u8], ca: &[u8]) -> Result<(), Box<dyn std::error::Error>> {
//!   use std::sync::Arc;
//!   use steady_proto::tls::{server_config, ClientAuth, ClientCas, ServerIdentity, TlsIncoming};
//!
//!   let identity = ServerIdentity::from_pem(cert, key)?;
//!   let clients = ClientCas::from_pem(ca, ClientAuth::Optional)?;
//!   let config = server_config(Arc::new(identity.clone()), Some(Arc::new(clients.clone())))?;
//!   let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//!   let incoming = TlsIncoming::new(listener, config);
//!   // tonic::transport::Server::builder().add_service(..).serve_with_incoming(incoming).await?;
//!   // Later, when the files change (new handshakes use the new material; open
//!   // connections keep theirs):
//!   identity.replace_pem(cert, key)?;
//!   clients.replace_pem(ca)?;
//!   # let _ = incoming; Ok(()) }
//!   ```
//!
//!   tonic's own `ServerTlsConfig` is fixed once the server is built; serving through
//!   [`TlsIncoming`] instead keeps everything else tonic does (peer certificates in
//!   `Request::peer_certs`, so `LoadCollector::authorize_reporters` works unchanged).
//! * **Connecting.** [`ClientTlsSource`] holds a tonic `ClientTlsConfig` that can be
//!   replaced (a new client identity, a new CA bundle); whoever connects reads it at
//!   each new connection: `steady_tonic::EndpointTemplate::tls_source` for a channel's
//!   backends, `steady_slicelet::Slicelet::report_to_tls` for a Slicelet's load reports.
//!
//! # Contract
//!
//! * **What a replacement changes.** Handshakes after it use the new material;
//!   connections already established keep the session they have, with every open stream
//!   (a Watch, a report stream) on them. A certificate that a new CA bundle no longer
//!   trusts is refused at its holder's next handshake, never by closing a connection
//!   it already has.
//! * **Bad input loses nothing.** Every replacement is checked in full before anything
//!   changes (certificates and key parse, the key is the certificate's, the CA bundle
//!   makes a verifier, the client configuration builds); a refused one returns a
//!   [`TlsError`] and the previous material stays in use.
//! * **Costs.** A replacement parses PEM once; a handshake reads the current material
//!   with one atomic load (no lock).
//!
//! rustls on ring, as tonic's: the crate re-exports the `rustls` it uses ([`rustls`]),
//! so an application's resolver implements the same trait.

mod client;
mod incoming;
mod server;

pub use client::ClientTlsSource;
pub use incoming::{HandshakeCounts, TlsIncoming, HANDSHAKE_TIMEOUT, MAX_HANDSHAKES};
pub use server::{server_config, ClientAuth, ClientCas, ServerIdentity};
pub use tokio_rustls::rustls;

use std::fmt;
use std::sync::Arc;

use tokio_rustls::rustls::crypto::CryptoProvider;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Why TLS material was refused. The previous material, if any, stays in use.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TlsError {
    /// PEM that holds no certificate (`what`: "certificate", "CA bundle").
    NoCertificate {
        /// Which input.
        what: &'static str,
    },
    /// PEM that does not parse.
    Pem {
        /// Which input.
        what: &'static str,
        /// The parser's reason.
        reason: String,
    },
    /// PEM that holds no private key.
    NoKey,
    /// A private key rustls cannot sign with, or one that is not the certificate's.
    Key {
        /// rustls's reason (`InconsistentKeys(KeyMismatch)` for another certificate's key).
        reason: String,
    },
    /// A CA bundle no client-certificate verifier can be built on.
    Ca {
        /// rustls's reason.
        reason: String,
    },
    /// A client configuration tonic cannot build (its CA, its identity).
    Client {
        /// tonic's reason, with every cause.
        reason: String,
    },
    /// The crypto provider supports none of the safe protocol versions.
    Provider {
        /// rustls's reason.
        reason: String,
    },
}

impl fmt::Display for TlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoCertificate { what } => write!(f, "the {what} holds no PEM certificate"),
            Self::Pem { what, reason } => write!(f, "the {what} is not valid PEM: {reason}"),
            Self::NoKey => f.write_str("the key holds no PEM private key"),
            Self::Key { reason } => write!(f, "the key does not go with the certificate: {reason}"),
            Self::Ca { reason } => write!(f, "no verifier can be built on the CA bundle: {reason}"),
            Self::Client { reason } => write!(f, "the client TLS configuration does not build: {reason}"),
            Self::Provider { reason } => write!(f, "the crypto provider: {reason}"),
        }
    }
}

impl std::error::Error for TlsError {}

/// The crypto provider: the process's default when one is installed, else ring (as
/// tonic chooses).
fn provider() -> Arc<CryptoProvider> {
    CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(tokio_rustls::rustls::crypto::ring::default_provider()))
}

/// Every certificate in `pem`, at least one.
fn certificates(what: &'static str, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem { what, reason: e.to_string() })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate { what });
    }
    Ok(certs)
}

/// The first private key in `pem`.
fn private_key(pem: &[u8]) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| match e {
        tokio_rustls::rustls::pki_types::pem::Error::NoItemsFound => TlsError::NoKey,
        other => TlsError::Pem { what: "key", reason: other.to_string() },
    })
}
