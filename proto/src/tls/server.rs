//! The serving side: a certificate resolver and a client-certificate verifier whose
//! material can be replaced, and the rustls `ServerConfig` made of them.

use std::fmt;
use std::sync::Arc;

use arc_swap::ArcSwap;
use tokio_rustls::rustls::client::danger::HandshakeSignatureValid;
use tokio_rustls::rustls::crypto::CryptoProvider;
use tokio_rustls::rustls::pki_types::{CertificateDer, UnixTime};
use tokio_rustls::rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use tokio_rustls::rustls::sign::CertifiedKey;
use tokio_rustls::rustls::{
    self, DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig, SignatureScheme,
};

use super::{certificates, private_key, provider, TlsError};

/// A server's certificate chain and key, replaceable while it serves: a rustls
/// [`ResolvesServerCert`] that answers every handshake with the current pair.
///
/// Clones share the pair: keep one to [`ServerIdentity::replace_pem`], hand another
/// (as `Arc<dyn ResolvesServerCert>`) to [`server_config`].
#[derive(Clone)]
pub struct ServerIdentity {
    current: Arc<ArcSwap<CertifiedKey>>,
    provider: Arc<CryptoProvider>,
}

impl fmt::Debug for ServerIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerIdentity")
            .field("chain_len", &self.current.load().cert.len())
            .finish_non_exhaustive()
    }
}

impl ServerIdentity {
    /// The chain in `cert_pem` (leaf first) with the key in `key_pem` (PKCS#8, PKCS#1 or
    /// SEC1).
    ///
    /// # Errors
    ///
    /// [`TlsError::NoCertificate`], [`TlsError::Pem`], [`TlsError::NoKey`], or
    /// [`TlsError::Key`] for a key rustls cannot use or one that is not the leaf's.
    pub fn from_pem(cert_pem: &[u8], key_pem: &[u8]) -> Result<Self, TlsError> {
        let provider = provider();
        let key = certified_key(cert_pem, key_pem, &provider)?;
        Ok(Self { current: Arc::new(ArcSwap::new(key)), provider })
    }

    /// Serves `cert_pem` with `key_pem` from the next handshake on; connections already
    /// made keep theirs.
    ///
    /// # Errors
    ///
    /// As [`ServerIdentity::from_pem`]; the current pair then stays.
    pub fn replace_pem(&self, cert_pem: &[u8], key_pem: &[u8]) -> Result<(), TlsError> {
        let key = certified_key(cert_pem, key_pem, &self.provider)?;
        self.current.store(key);
        Ok(())
    }

    /// The leaf certificate served now (DER), e.g. to log which one.
    pub fn leaf(&self) -> CertificateDer<'static> {
        self.current.load().cert[0].clone()
    }
}

impl ResolvesServerCert for ServerIdentity {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

/// A checked chain and key.
fn certified_key(
    cert_pem: &[u8],
    key_pem: &[u8],
    provider: &CryptoProvider,
) -> Result<Arc<CertifiedKey>, TlsError> {
    let chain = certificates("certificate", cert_pem)?;
    let key = private_key(key_pem)?;
    let key =
        CertifiedKey::from_der(chain, key, provider).map_err(|e| TlsError::Key { reason: e.to_string() })?;
    // `from_der` lets a key whose public half it cannot read pass; refuse that too, so a
    // key that is not the certificate's never reaches a handshake.
    key.keys_match().map_err(|e| TlsError::Key { reason: e.to_string() })?;
    Ok(Arc::new(key))
}

/// Whether a peer must present a client certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    /// Every peer must present one the CA bundle trusts.
    Required,
    /// A peer may present none (and is then anonymous); one it presents must be trusted.
    Optional,
}

/// The CAs a server trusts for client certificates, replaceable while it serves: a
/// rustls [`ClientCertVerifier`] that checks each handshake against the current bundle
/// (WebPKI, as tonic's `ServerTlsConfig::client_ca_root`).
///
/// To rotate the client CA: replace the bundle with old and new CAs together, move the
/// clients to certificates of the new CA, then replace it with the new CA alone. From
/// then on a client presenting a certificate of the old CA fails its next handshake.
///
/// The CertificateRequest names no CAs (rustls asks a verifier for the names by
/// reference, which a replaceable bundle cannot lend): a client with one identity, as
/// tonic's, presents it regardless.
#[derive(Clone)]
pub struct ClientCas {
    current: Arc<ArcSwap<Verifier>>,
    auth: ClientAuth,
    provider: Arc<CryptoProvider>,
}

/// One bundle's verifier.
struct Verifier(Arc<dyn ClientCertVerifier>);

impl fmt::Debug for ClientCas {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientCas").field("auth", &self.auth).finish_non_exhaustive()
    }
}

impl ClientCas {
    /// Trusts the CAs in `ca_pem` (one or more certificates).
    ///
    /// # Errors
    ///
    /// [`TlsError::NoCertificate`], [`TlsError::Pem`], or [`TlsError::Ca`] when no
    /// certificate in it can be a trust anchor.
    pub fn from_pem(ca_pem: &[u8], auth: ClientAuth) -> Result<Self, TlsError> {
        let provider = provider();
        let verifier = verifier(ca_pem, auth, &provider)?;
        Ok(Self { current: Arc::new(ArcSwap::from_pointee(verifier)), auth, provider })
    }

    /// Trusts the CAs in `ca_pem` from the next handshake on (the old ones no longer,
    /// unless the bundle holds them); connections already made keep theirs.
    ///
    /// # Errors
    ///
    /// As [`ClientCas::from_pem`]; the current bundle then stays.
    pub fn replace_pem(&self, ca_pem: &[u8]) -> Result<(), TlsError> {
        let verifier = verifier(ca_pem, self.auth, &self.provider)?;
        self.current.store(Arc::new(verifier));
        Ok(())
    }

    /// Whether peers must present a certificate.
    pub fn auth(&self) -> ClientAuth {
        self.auth
    }
}

fn verifier(ca_pem: &[u8], auth: ClientAuth, provider: &Arc<CryptoProvider>) -> Result<Verifier, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in certificates("CA bundle", ca_pem)? {
        roots.add(cert).map_err(|e| TlsError::Ca { reason: e.to_string() })?;
    }
    let mut builder = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone());
    if auth == ClientAuth::Optional {
        builder = builder.allow_unauthenticated();
    }
    builder.build().map(Verifier).map_err(|e| TlsError::Ca { reason: e.to_string() })
}

impl ClientCertVerifier for ClientCas {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        self.auth == ClientAuth::Required
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, tokio_rustls::rustls::Error> {
        self.current.load().0.verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, tokio_rustls::rustls::Error> {
        self.current.load().0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, tokio_rustls::rustls::Error> {
        self.current.load().0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.current.load().0.supported_verify_schemes()
    }
}

/// A rustls `ServerConfig` for gRPC (ALPN `h2`, the safe protocol versions, no session
/// resumption: every connection is verified against the material in force) that takes
/// its certificate from `identity` at every handshake and, with `clients`, verifies
/// client certificates with it. Any resolver or verifier will do: [`ServerIdentity`]
/// and [`ClientCas`], or an application's own (a SPIFFE source, several certificates
/// chosen by SNI).
///
/// # Errors
///
/// [`TlsError::Provider`] when the process's crypto provider supports no safe protocol
/// version.
pub fn server_config(
    identity: Arc<dyn ResolvesServerCert>,
    clients: Option<Arc<dyn ClientCertVerifier>>,
) -> Result<Arc<ServerConfig>, TlsError> {
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Provider { reason: e.to_string() })?;
    let builder = match clients {
        Some(verifier) => builder.with_client_cert_verifier(verifier),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(identity);
    config.alpn_protocols = vec![b"h2".to_vec()];
    // No session resumption: a resumed session skips the certificates, so a client whose
    // CA was dropped from the bundle would get back in on a session from before, and a
    // client would keep seeing the server's old certificate. gRPC connections are long
    // lived: a full handshake per connection costs little.
    config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
    Ok(Arc::new(config))
}
