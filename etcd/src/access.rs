//! How steady's etcd clients reach a cluster that runs with TLS, client certificates,
//! users and passwords, and what a connection that cannot be made says at start.

use std::fmt;
use std::net::ToSocketAddrs;
use std::time::Duration;

use etcd_client::{Certificate, Client, Error as EtcdError, GetOptions, Identity, TlsOptions};

use crate::{bounded, CallError};

/// TLS to etcd: the CA that signed the servers' certificates, and optionally this
/// client's certificate (for `--client-cert-auth`) and the server name to check.
///
/// Built from PEM contents; reading files is the caller's (a binary names the flag and
/// the file when one cannot be read).
#[derive(Clone)]
pub struct EtcdTls {
    ca_pem: Vec<u8>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
    domain: Option<String>,
}

impl fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdTls")
            .field("client_certificate", &self.identity.is_some())
            .field("domain", &self.domain)
            .finish_non_exhaustive()
    }
}

impl EtcdTls {
    /// Trust the servers whose certificates `ca_pem` (PEM, one or more certificates) signed.
    pub fn new(ca_pem: impl Into<Vec<u8>>) -> Self {
        Self { ca_pem: ca_pem.into(), identity: None, domain: None }
    }

    /// Present this certificate and key (PEM) to the servers (etcd's `--client-cert-auth`).
    pub fn identity(mut self, cert_pem: impl Into<Vec<u8>>, key_pem: impl Into<Vec<u8>>) -> Self {
        self.identity = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// Check the servers' certificates against `name` instead of each endpoint's host.
    pub fn domain_name(mut self, name: impl Into<String>) -> Self {
        self.domain = Some(name.into());
        self
    }

    fn options(&self) -> TlsOptions {
        let mut tls = TlsOptions::new().ca_certificate(Certificate::from_pem(&self.ca_pem));
        if let Some((cert, key)) = &self.identity {
            tls = tls.identity(Identity::from_pem(cert, key));
        }
        if let Some(domain) = &self.domain {
            tls = tls.domain_name(domain.clone());
        }
        tls
    }
}

/// How a client authenticates to etcd: TLS (with or without a client certificate) and
/// a user and password, each optional. The default is neither: plaintext, no user.
#[derive(Clone, Default)]
pub struct EtcdAccess {
    tls: Option<EtcdTls>,
    user: Option<(String, String)>,
}

impl fmt::Debug for EtcdAccess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the password.
        f.debug_struct("EtcdAccess")
            .field("tls", &self.tls)
            .field("user", &self.user.as_ref().map(|(user, _)| user))
            .finish()
    }
}

impl EtcdAccess {
    /// Plaintext, no user.
    pub fn new() -> Self {
        Self::default()
    }

    /// Connect with TLS. Endpoints must then be `https://` URLs (or `host:port`).
    pub fn tls(mut self, tls: EtcdTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Authenticate as `user` with `password` (etcd's auth; the token is renewed by the
    /// client as etcd expires it).
    pub fn user(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some((user.into(), password.into()));
        self
    }

    /// Whether TLS is configured.
    pub fn has_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The user, if any.
    pub fn user_name(&self) -> Option<&str> {
        self.user.as_ref().map(|(user, _)| user.as_str())
    }
}

/// Why a connection to etcd could not be made at start: one line, naming the cause.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnectError {
    /// The configuration cannot work: an `https://` endpoint without TLS, TLS with an
    /// `http://` endpoint, a certificate or key that does not parse.
    InvalidConfig {
        /// What etcd-client or the TLS library said.
        reason: String,
    },
    /// TCP reached the server but TLS did not: a CA that did not sign the server's
    /// certificate, a server name that does not match, a client certificate the server
    /// requires and was not given (or does not trust), or a server that does not speak
    /// TLS.
    Tls {
        /// The endpoint tried.
        endpoint: String,
        /// The handshake's error, or what the first call saw.
        reason: String,
    },
    /// etcd refused the user and password, or requires one and none was given (or auth
    /// is not enabled for a user to log in).
    Unauthenticated {
        /// The user (empty when none was given).
        user: String,
        /// etcd's message.
        reason: String,
    },
    /// Authenticated, but the user may not read the keys this client is for.
    PermissionDenied {
        /// The key probed.
        key: String,
        /// etcd's message.
        reason: String,
    },
    /// No endpoint could be reached (refused, unresolvable, or no answer in time).
    Unreachable {
        /// The endpoints.
        endpoints: Vec<String>,
        /// Why not.
        reason: String,
    },
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidConfig { reason } => write!(f, "etcd connection settings: {reason}"),
            Self::Tls { endpoint, reason } => write!(
                f,
                "etcd at {endpoint}: TLS failed (check the CA, the client certificate and the server name): {reason}"
            ),
            Self::Unauthenticated { user, reason } if user.is_empty() => {
                write!(f, "etcd requires a user and password (none given): {reason}")
            }
            Self::Unauthenticated { user, reason } => write!(f, "etcd refused user {user:?}: {reason}"),
            Self::PermissionDenied { key, reason } => {
                write!(f, "etcd: the user may not read {key:?}: {reason}")
            }
            Self::Unreachable { endpoints, reason } => {
                write!(f, "etcd unreachable at {}: {reason}", endpoints.join(", "))
            }
        }
    }
}

impl std::error::Error for ConnectError {}

/// A client of the cluster at `endpoints` with `access`, bounded as [`crate::connect`]
/// is, whose first call has been made: one read of `probe_key` (a key of the prefix the
/// caller works under; it need not exist).
///
/// So a setting that cannot work fails here, once, with the cause, instead of in every
/// later call: a wrong CA, a client certificate missing or not trusted, a wrong password,
/// a user without access to the prefix, a server that is not there.
///
/// # Errors
///
/// A [`ConnectError`]; each takes at most about two `timeout`s.
pub async fn connect_with(
    endpoints: &[String],
    timeout: Duration,
    access: &EtcdAccess,
    probe_key: &str,
) -> Result<Client, ConnectError> {
    let mut options = crate::connect_options(timeout);
    if let Some(tls) = &access.tls {
        options = options.with_tls(tls.options());
    }
    if let Some((user, password)) = &access.user {
        options = options.with_user(user.clone(), password.clone());
    }
    let client = match bounded(timeout, "connect", crate::connect_client(endpoints, options)).await {
        Ok(client) => client,
        Err(error) => return Err(diagnose(endpoints, timeout, access, probe_key, &error).await),
    };
    let mut kv = client.kv_client();
    let probe = kv.get(probe_key, Some(GetOptions::new().with_count_only()));
    match bounded(timeout, "get", probe).await {
        Ok(_) => Ok(client),
        Err(error) => Err(diagnose(endpoints, timeout, access, probe_key, &error).await),
    }
}

/// What a failed first call means.
async fn diagnose(
    endpoints: &[String],
    timeout: Duration,
    access: &EtcdAccess,
    probe_key: &str,
    error: &CallError,
) -> ConnectError {
    let reason = chain(error);
    if let CallError::Failed { error: etcd, .. } = error {
        match etcd {
            EtcdError::InvalidArgs(_) | EtcdError::InvalidUri(_) => {
                return ConnectError::InvalidConfig { reason };
            }
            EtcdError::GRpcStatus(status) => {
                let user = access.user_name().unwrap_or_default().to_owned();
                match status.code() {
                    tonic::Code::PermissionDenied => {
                        return ConnectError::PermissionDenied { key: probe_key.to_owned(), reason }
                    }
                    tonic::Code::Unauthenticated => return ConnectError::Unauthenticated { user, reason },
                    // etcd answers a wrong password, a missing user and a login while
                    // auth is off with InvalidArgument / FailedPrecondition
                    // ("authentication failed", "user name is empty", "auth is not
                    // enabled").
                    tonic::Code::InvalidArgument | tonic::Code::FailedPrecondition
                        if status.message().contains("auth") || status.message().contains("user") =>
                    {
                        return ConnectError::Unauthenticated { user, reason }
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }
    // The transport names a certificate: TLS is the cause, whatever the call saw.
    if ["certificate", "tls", "TLS", "handshake"].iter().any(|word| reason.contains(word)) {
        return ConnectError::Tls { endpoint: endpoints.join(", "), reason };
    }
    // A transport failure or no answer: is the server there at all?
    let Some(endpoint) = endpoints.first() else {
        return ConnectError::InvalidConfig { reason: "no endpoint".to_owned() };
    };
    if let Err(unreachable) = tcp_reachable(endpoint, timeout).await {
        return ConnectError::Unreachable { endpoints: endpoints.to_vec(), reason: unreachable };
    }
    match &access.tls {
        // TCP works; TLS is the difference. Ask for the handshake's own reason on a
        // connection of our own (the client's balanced channel only times out).
        Some(tls) => {
            let reason = handshake(endpoint, tls, timeout).await.err().unwrap_or(reason);
            ConnectError::Tls { endpoint: endpoint.clone(), reason }
        }
        None => ConnectError::Unreachable { endpoints: endpoints.to_vec(), reason },
    }
}

/// Whether a TCP connection to `endpoint`'s host and port can be made within `timeout`.
async fn tcp_reachable(endpoint: &str, timeout: Duration) -> Result<(), String> {
    let authority = endpoint.split("://").last().unwrap_or(endpoint).trim_end_matches('/');
    let addrs: Vec<_> = authority.to_socket_addrs().map_err(|e| format!("{authority}: {e}"))?.collect();
    let first = addrs.first().ok_or_else(|| format!("{authority}: no address"))?;
    match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(first)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(format!("{authority}: {e}")),
        Err(_) => Err(format!("{authority}: no TCP connection in {timeout:?}")),
    }
}

/// A TLS handshake with `endpoint` as etcd-client would make it, and one call (in TLS
/// 1.3 a server refuses a client certificate only after the client's side is done).
async fn handshake(endpoint: &str, tls: &EtcdTls, timeout: Duration) -> Result<(), String> {
    let url = if endpoint.contains("://") { endpoint.to_owned() } else { format!("https://{endpoint}") };
    let endpoint = tonic::transport::Endpoint::from_shared(url)
        .map_err(|e| chain(&e))?
        .connect_timeout(timeout)
        .timeout(timeout)
        .tls_config(tls.options())
        .map_err(|e| chain(&e))?;
    let mut channel = endpoint.connect().await.map_err(|e| chain(&e))?;
    // Any HTTP/2 request will do: whatever etcd answers, the session is up; a refused
    // client certificate fails it.
    use tonic::codegen::{http, Service};
    std::future::poll_fn(|cx| channel.poll_ready(cx)).await.map_err(|e| chain(&e))?;
    let request = http::Request::post("/etcdserverpb.Maintenance/Status")
        .header("content-type", "application/grpc")
        .body(tonic::body::Body::empty())
        .map_err(|e| e.to_string())?;
    channel.call(request).await.map(drop).map_err(|e| chain(&e))
}

/// `error` and its sources in one line, each message once.
fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(error);
    while let Some(e) = next {
        let text = e.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        next = e.source();
    }
    parts.join(": ")
}
