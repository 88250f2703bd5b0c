//! [`EndpointTemplate`]: how a [`SteadyChannel`](crate::SteadyChannel) connects to every
//! backend it is given as an address: TLS, the authority, HTTP/2 settings, timeouts.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

use http::Uri;
use steady_core::error_chain;
#[cfg(feature = "tls")]
use steady_proto::tls::ClientTlsSource;
#[cfg(feature = "tls")]
use tonic::transport::ClientTlsConfig;
use tonic::transport::{Channel, Endpoint};

/// The settings every backend connection of a channel is made with, applied to each
/// address a discovery source yields (and to each endpoint given to the channel).
///
/// A discovery source knows only `host:port`; everything else about a connection comes
/// from here, once per channel, so that a backend job of a thousand tasks needs one TLS
/// configuration, not a thousand endpoints:
///
/// ```
/// # #[cfg(feature = "tls")] {
/// use std::time::Duration;
/// use steady_tonic::EndpointTemplate;
/// use tonic::transport::{Certificate, ClientTlsConfig, Identity};
///
/// # fn pem() -> Vec<u8> { Vec::new() }
/// let tls = ClientTlsConfig::new()
///     .ca_certificate(Certificate::from_pem(pem()))          // the backends' CA
///     .identity(Identity::from_pem(pem(), pem()))            // mutual TLS: our certificate
///     .domain_name("users.backend.example");                 // one SNI name for the job
/// let template = EndpointTemplate::new()
///     .tls(tls)
///     .timeout(Duration::from_secs(2))
///     .http2_keep_alive_interval(Duration::from_secs(30));
/// # let _ = template;
/// # }
/// ```
///
/// # Contract
///
/// * **Scheme.** An address without a scheme is reached over `https://` when the
///   template has TLS, else `http://`. An explicit scheme wins: `http://` is plaintext
///   whatever the template says. An `https://` address with no TLS in the template uses
///   the system's trusted roots.
/// * **Precedence.** A setting the template has replaces the endpoint's own; one it does
///   not have leaves the endpoint's. The connect timeout defaults to the balancer's
///   (`BalanceConfig::connect_timeout`).
/// * **Failures.** A handshake that fails (a certificate the channel does not trust, a
///   name that does not match, a server that wants a client certificate it was not
///   given) is a connection failure like any other: the member backs off and the next
///   backend in the order stands in. The error, which the balancer logs, names the cause
///   (for instance `invalid peer certificate: UnknownIssuer`). Nothing panics or hangs:
///   the handshake is bounded by the connect timeout.
/// * **Cost.** Applied when a connection is made, not when a view arrives: a TLS
///   configuration is built per connection attempt, never per request.
/// * **Rotation.** With `EndpointTemplate::tls_source` (feature `tls`) the TLS settings
///   are read from a `ClientTlsSource` at each connection: replace its identity or CA
///   bundle and every connection made after (a new member, a member reconnected after a
///   failure) uses the new one, while connections already made keep theirs and their
///   requests.
///
/// TLS needs the `tls` feature (rustls on ring, the system's roots for `https://`
/// addresses without a configuration). Without it an `https://` address fails to connect
/// with [`TemplateError::TlsNotBuilt`] rather than being spoken to in plaintext.
#[derive(Clone, Debug, Default)]
pub struct EndpointTemplate {
    #[cfg(feature = "tls")]
    tls: Option<Tls>,
    origin: Option<Uri>,
    timeout: Option<Duration>,
    connect_timeout: Option<Duration>,
    tcp_nodelay: Option<bool>,
    tcp_keepalive: Option<Duration>,
    http2_keep_alive_interval: Option<Duration>,
    keep_alive_timeout: Option<Duration>,
    keep_alive_while_idle: Option<bool>,
    initial_stream_window_size: Option<u32>,
    initial_connection_window_size: Option<u32>,
    http2_adaptive_window: Option<bool>,
}

impl EndpointTemplate {
    /// A template that changes nothing: plaintext, tonic's defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Connects with TLS (and mutual TLS when `tls` has an identity). The server name
    /// checked against each backend's certificate is the address's host unless
    /// `ClientTlsConfig::domain_name` names one for the whole job.
    #[cfg(feature = "tls")]
    pub fn tls(mut self, tls: ClientTlsConfig) -> Self {
        self.tls = Some(Tls::Fixed(tls));
        self
    }

    /// Connects with the TLS settings `source` holds when each connection is made
    /// (instead of [`EndpointTemplate::tls`]'s, fixed): a client identity or CA bundle
    /// replaced in the source (`ClientTlsSource::replace`, when rotated certificate
    /// files change) is presented from the next connection on. Connections already made
    /// keep the settings they were made with.
    #[cfg(feature = "tls")]
    pub fn tls_source(mut self, source: ClientTlsSource) -> Self {
        self.tls = Some(Tls::Source(source));
        self
    }

    /// Sends `origin` as every request's authority (`:authority`) instead of the
    /// backend's address, for backends behind a name they route or check by.
    pub fn origin(mut self, origin: Uri) -> Self {
        self.origin = Some(origin);
        self
    }

    /// A deadline for each request on the connection (tonic's `Endpoint::timeout`).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// How long making a connection (TCP and the TLS handshake) may take, instead of
    /// the balancer's `connect_timeout`.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }

    /// Sets `TCP_NODELAY` (tonic's default: on).
    pub fn tcp_nodelay(mut self, enabled: bool) -> Self {
        self.tcp_nodelay = Some(enabled);
        self
    }

    /// TCP keep-alive probes after `idle` without traffic.
    pub fn tcp_keepalive(mut self, idle: Duration) -> Self {
        self.tcp_keepalive = Some(idle);
        self
    }

    /// HTTP/2 PING every `interval`, to find a dead connection without a request.
    pub fn http2_keep_alive_interval(mut self, interval: Duration) -> Self {
        self.http2_keep_alive_interval = Some(interval);
        self
    }

    /// How long an HTTP/2 PING may go unanswered before the connection is closed.
    pub fn keep_alive_timeout(mut self, timeout: Duration) -> Self {
        self.keep_alive_timeout = Some(timeout);
        self
    }

    /// Whether PINGs are sent on a connection with no request open.
    pub fn keep_alive_while_idle(mut self, enabled: bool) -> Self {
        self.keep_alive_while_idle = Some(enabled);
        self
    }

    /// HTTP/2's initial stream window, bytes.
    pub fn initial_stream_window_size(mut self, bytes: u32) -> Self {
        self.initial_stream_window_size = Some(bytes);
        self
    }

    /// HTTP/2's initial connection window, bytes.
    pub fn initial_connection_window_size(mut self, bytes: u32) -> Self {
        self.initial_connection_window_size = Some(bytes);
        self
    }

    /// HTTP/2 adaptive flow control (BDP estimation; overrides the window sizes).
    pub fn http2_adaptive_window(mut self, enabled: bool) -> Self {
        self.http2_adaptive_window = Some(enabled);
        self
    }

    /// Whether connections are made with TLS by default (an address without a scheme
    /// becomes `https://`).
    pub fn has_tls(&self) -> bool {
        #[cfg(feature = "tls")]
        return self.tls.is_some();
        #[cfg(not(feature = "tls"))]
        false
    }

    /// The URI of `address` (`host:port` or a URI): see "Scheme" above.
    pub fn uri_of(&self, address: &str) -> String {
        if address.contains("://") {
            address.to_owned()
        } else if self.has_tls() {
            format!("https://{address}")
        } else {
            format!("http://{address}")
        }
    }

    /// The endpoint for `address`, with the template applied.
    ///
    /// # Errors
    ///
    /// [`TemplateError::Address`] for an address that is not a URI; the errors of
    /// [`EndpointTemplate::apply`].
    pub fn endpoint(&self, address: &str) -> Result<Endpoint, TemplateError> {
        let uri = self.uri_of(address);
        let endpoint = Endpoint::from_shared(uri.clone())
            .map_err(|error| TemplateError::Address { address: uri, reason: error_chain(&error) })?;
        self.apply(endpoint)
    }

    /// `endpoint` with the template's settings in place of its own.
    ///
    /// # Errors
    ///
    /// [`TemplateError::Tls`] when the TLS configuration cannot be built for this URI
    /// (an unreadable certificate or key); [`TemplateError::TlsNotBuilt`] for an
    /// `https://` endpoint without the `tls` feature.
    pub fn apply(&self, endpoint: Endpoint) -> Result<Endpoint, TemplateError> {
        let mut endpoint = endpoint;
        if let Some(origin) = &self.origin {
            endpoint = endpoint.origin(origin.clone());
        }
        if let Some(timeout) = self.timeout {
            endpoint = endpoint.timeout(timeout);
        }
        if let Some(timeout) = self.connect_timeout {
            endpoint = endpoint.connect_timeout(timeout);
        }
        if let Some(enabled) = self.tcp_nodelay {
            endpoint = endpoint.tcp_nodelay(enabled);
        }
        if let Some(idle) = self.tcp_keepalive {
            endpoint = endpoint.tcp_keepalive(Some(idle));
        }
        if let Some(interval) = self.http2_keep_alive_interval {
            endpoint = endpoint.http2_keep_alive_interval(interval);
        }
        if let Some(timeout) = self.keep_alive_timeout {
            endpoint = endpoint.keep_alive_timeout(timeout);
        }
        if let Some(enabled) = self.keep_alive_while_idle {
            endpoint = endpoint.keep_alive_while_idle(enabled);
        }
        if let Some(bytes) = self.initial_stream_window_size {
            endpoint = endpoint.initial_stream_window_size(bytes);
        }
        if let Some(bytes) = self.initial_connection_window_size {
            endpoint = endpoint.initial_connection_window_size(bytes);
        }
        if let Some(enabled) = self.http2_adaptive_window {
            endpoint = endpoint.http2_adaptive_window(enabled);
        }
        self.apply_tls(endpoint)
    }

    /// Connects to `address` as the channel connects to a member (the template applied,
    /// the connection and any TLS handshake made now), for a probe or a one-off client
    /// with the channel's settings.
    ///
    /// # Errors
    ///
    /// A [`ConnectError`] that names every cause: the template's ([`TemplateError`]), the
    /// TCP connection's, or the handshake's (e.g. `invalid peer certificate: UnknownIssuer`).
    pub async fn connect(&self, address: &str) -> Result<Channel, ConnectError> {
        let uri = self.uri_of(address);
        let endpoint = self.endpoint(address).map_err(|error| ConnectError::new(&uri, &error))?;
        connect(endpoint).await
    }

    #[cfg(feature = "tls")]
    fn apply_tls(&self, endpoint: Endpoint) -> Result<Endpoint, TemplateError> {
        let https = endpoint.uri().scheme_str() == Some("https");
        let tls = match &self.tls {
            Some(Tls::Fixed(tls)) => tls.clone(),
            // Read now, for this connection: a replaced identity shows from here on.
            Some(Tls::Source(source)) => source.current(),
            None if https => ClientTlsConfig::new().with_native_roots(),
            None => return Ok(endpoint),
        };
        let uri = endpoint.uri().to_string();
        endpoint.tls_config(tls).map_err(|error| TemplateError::Tls { uri, reason: error_chain(&error) })
    }

    #[cfg(not(feature = "tls"))]
    fn apply_tls(&self, endpoint: Endpoint) -> Result<Endpoint, TemplateError> {
        if endpoint.uri().scheme_str() == Some("https") {
            return Err(TemplateError::TlsNotBuilt { uri: endpoint.uri().to_string() });
        }
        Ok(endpoint)
    }
}

/// A template's TLS: fixed, or read from a source at each connection.
#[cfg(feature = "tls")]
#[derive(Clone, Debug)]
enum Tls {
    Fixed(ClientTlsConfig),
    Source(ClientTlsSource),
}

/// Why an [`EndpointTemplate`] could not make an endpoint: each is a connection failure
/// of the member concerned (it backs off; the next backend stands in).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplateError {
    /// The address is not a URI.
    Address {
        /// The address, with the scheme the template gave it.
        address: String,
        /// Why not.
        reason: String,
    },
    /// The TLS configuration could not be built for this endpoint.
    Tls {
        /// The endpoint.
        uri: String,
        /// Why not.
        reason: String,
    },
    /// An `https://` endpoint, but `steady-tonic` was built without its `tls` feature.
    TlsNotBuilt {
        /// The endpoint.
        uri: String,
    },
}

impl fmt::Display for TemplateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Address { address, reason } => write!(f, "invalid backend address {address}: {reason}"),
            Self::Tls { uri, reason } => write!(f, "TLS configuration for {uri}: {reason}"),
            Self::TlsNotBuilt { uri } => {
                write!(f, "{uri} needs TLS, and steady-tonic was built without its `tls` feature")
            }
        }
    }
}

impl StdError for TemplateError {}

/// Connects to `endpoint` now, naming every cause of a failure.
pub(crate) async fn connect(endpoint: Endpoint) -> Result<Channel, ConnectError> {
    let uri = endpoint.uri().to_string();
    endpoint.connect().await.map_err(|error| ConnectError::new(&uri, &error))
}

/// A connection to a backend that could not be made, with every cause in one line:
/// tonic's own message is only "transport error"; the reason (refused, timed out, a
/// certificate not trusted) is in its sources, and this error's text names them all.
#[derive(Debug, Clone)]
pub struct ConnectError {
    uri: String,
    reason: String,
}

impl ConnectError {
    fn new(uri: &str, error: &(dyn StdError + 'static)) -> Self {
        Self { uri: uri.to_owned(), reason: error_chain(error) }
    }

    /// The endpoint it was connecting to.
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// Why it failed: every cause, outermost first, joined by ": ".
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "connecting to {}: {}", self.uri, self.reason)
    }
}

impl StdError for ConnectError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_without_a_scheme_is_plaintext_unless_the_template_has_tls() {
        let plain = EndpointTemplate::new();
        assert_eq!(plain.uri_of("10.0.0.1:50051"), "http://10.0.0.1:50051");
        assert_eq!(plain.uri_of("https://b:1"), "https://b:1", "an explicit scheme wins");
        #[cfg(feature = "tls")]
        {
            let tls = EndpointTemplate::new().tls(ClientTlsConfig::new());
            assert_eq!(tls.uri_of("10.0.0.1:50051"), "https://10.0.0.1:50051");
            assert_eq!(tls.uri_of("http://b:1"), "http://b:1", "an explicit scheme wins");
        }
    }

    #[test]
    fn settings_of_the_template_replace_the_endpoint_s_and_the_rest_stay() {
        let template = EndpointTemplate::new().connect_timeout(Duration::from_millis(250)).tcp_nodelay(false);
        let endpoint = template.endpoint("127.0.0.1:1").unwrap();
        assert_eq!(endpoint.get_connect_timeout(), Some(Duration::from_millis(250)));
        assert!(!endpoint.get_tcp_nodelay());
        let kept = EndpointTemplate::new()
            .apply(Endpoint::from_static("http://127.0.0.1:1").connect_timeout(Duration::from_secs(3)))
            .unwrap();
        assert_eq!(kept.get_connect_timeout(), Some(Duration::from_secs(3)));
    }

    #[test]
    fn a_bad_address_is_a_typed_error_that_names_it() {
        let error = EndpointTemplate::new().endpoint("not a uri").unwrap_err();
        assert!(matches!(&error, TemplateError::Address { address, .. } if address == "http://not a uri"));
        assert!(error.to_string().starts_with("invalid backend address http://not a uri: "), "{error}");
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn https_without_the_tls_feature_fails_instead_of_speaking_plaintext() {
        let error = EndpointTemplate::new().endpoint("https://127.0.0.1:1").unwrap_err();
        assert_eq!(error, TemplateError::TlsNotBuilt { uri: "https://127.0.0.1:1/".into() });
    }
}
