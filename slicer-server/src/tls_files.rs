//! The binary's serving TLS from files that rotate: the certificate, key and client CA
//! bundle read again when they change (checked on a period and on demand, as on
//! SIGHUP), each change checked in full before it replaces anything.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use steady_proto::tls::rustls::server::danger::ClientCertVerifier;
use steady_proto::tls::rustls::ServerConfig;
use steady_proto::tls::{server_config, ClientAuth, ClientCas, ServerIdentity, TlsError};

/// Where the serving TLS material is: `--tls-cert`, `--tls-key` and, optionally,
/// `--tls-client-ca`.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The certificate chain (PEM, leaf first).
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
    /// The CAs client certificates are verified against (PEM), if any.
    pub client_ca: Option<PathBuf>,
    /// Whether every peer must present a client certificate (with `client_ca`).
    pub client_auth: ClientAuth,
}

/// Why the files could not be used at start: names the flag and the file.
#[derive(Debug)]
pub struct StartError(String);

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for StartError {}

/// What one look at the files found (see [`ReloadingTls::check`]); its `Display` is the
/// line the binary logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reload {
    /// The certificate and key changed and are served from the next handshake.
    Identity {
        /// The certificate file.
        cert: PathBuf,
    },
    /// The client CA bundle changed and verifies from the next handshake.
    ClientCa {
        /// The bundle file.
        ca: PathBuf,
    },
    /// A changed file was refused; the material in force stays.
    Refused {
        /// The flags concerned (`--tls-cert/--tls-key`, `--tls-client-ca`).
        flags: &'static str,
        /// Why.
        reason: String,
    },
}

impl fmt::Display for Reload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Identity { cert } => {
                write!(
                    f,
                    "TLS: reloaded the certificate and key ({}); new connections use them",
                    cert.display()
                )
            }
            Self::ClientCa { ca } => {
                write!(
                    f,
                    "TLS: reloaded the client CA bundle ({}); new connections are verified with it",
                    ca.display()
                )
            }
            Self::Refused { flags, reason } => {
                write!(f, "TLS: refused the new {flags}: {reason}; still serving with the previous ones")
            }
        }
    }
}

/// The serving TLS of the binary: a [`ServerIdentity`] and, with a client CA, a
/// [`ClientCas`], kept in line with their files.
///
/// A file is read again at each [`ReloadingTls::check`]; what changed since the last
/// look (by content, so a file rewritten in place and a symlink swapped to a new target,
/// as Kubernetes mounts secrets, both count) is checked and, if good, replaces the
/// material for new handshakes. The certificate and key change as a pair: while only
/// one of them is new (a rotation half written), the pair is refused and the old one
/// stays; the next look after the other is written takes both. A refusal is reported
/// once per content, not at every look.
#[derive(Debug)]
pub struct ReloadingTls {
    files: TlsFiles,
    identity: ServerIdentity,
    clients: Option<ClientCas>,
    /// The contents last looked at (applied or refused): cert, key, client CA.
    seen: [Vec<u8>; 3],
}

impl ReloadingTls {
    /// Reads and checks the files now.
    ///
    /// # Errors
    ///
    /// A [`StartError`] naming the flag and file that cannot be read, or the flags whose
    /// contents are refused and why.
    pub fn load(files: TlsFiles) -> Result<Self, StartError> {
        let cert = read("--tls-cert", &files.cert)?;
        let key = read("--tls-key", &files.key)?;
        let identity = ServerIdentity::from_pem(&cert, &key)
            .map_err(|e| StartError(format!("--tls-cert/--tls-key: {e}")))?;
        let (clients, ca) = match &files.client_ca {
            Some(path) => {
                let ca = read("--tls-client-ca", path)?;
                let clients = ClientCas::from_pem(&ca, files.client_auth)
                    .map_err(|e| StartError(format!("--tls-client-ca: {e}")))?;
                (Some(clients), ca)
            }
            None => (None, Vec::new()),
        };
        Ok(Self { files, identity, clients, seen: [cert, key, ca] })
    }

    /// The rustls configuration to serve with: it reads the current material at every
    /// handshake.
    ///
    /// # Errors
    ///
    /// As [`server_config`].
    pub fn server_config(&self) -> Result<Arc<ServerConfig>, TlsError> {
        let clients = self.clients.clone().map(|c| Arc::new(c) as Arc<dyn ClientCertVerifier>);
        server_config(Arc::new(self.identity.clone()), clients)
    }

    /// The certificate served now.
    pub fn identity(&self) -> &ServerIdentity {
        &self.identity
    }

    /// Reads the files and applies what changed since the last look; returns what it
    /// did (nothing when no file changed). A file that cannot be read is refused like
    /// bad contents (a rotation may remove and recreate it): the material in force
    /// stays.
    pub fn check(&mut self) -> Vec<Reload> {
        let mut done = Vec::new();
        let pair = (read("--tls-cert", &self.files.cert), read("--tls-key", &self.files.key));
        match pair {
            (Ok(cert), Ok(key)) => {
                if cert != self.seen[0] || key != self.seen[1] {
                    done.push(match self.identity.replace_pem(&cert, &key) {
                        Ok(()) => Reload::Identity { cert: self.files.cert.clone() },
                        Err(e) => Reload::Refused { flags: "--tls-cert/--tls-key", reason: e.to_string() },
                    });
                    self.seen[0] = cert;
                    self.seen[1] = key;
                }
            }
            (Err(e), _) | (_, Err(e)) => {
                // Reported once per unreadable state: remember it as empty contents.
                if !self.seen[0].is_empty() || !self.seen[1].is_empty() {
                    done.push(Reload::Refused { flags: "--tls-cert/--tls-key", reason: e.0 });
                    self.seen[0].clear();
                    self.seen[1].clear();
                }
            }
        }
        if let (Some(path), Some(clients)) = (&self.files.client_ca, &self.clients) {
            match read("--tls-client-ca", path) {
                Ok(ca) if ca != self.seen[2] => {
                    done.push(match clients.replace_pem(&ca) {
                        Ok(()) => Reload::ClientCa { ca: path.clone() },
                        Err(e) => Reload::Refused { flags: "--tls-client-ca", reason: e.to_string() },
                    });
                    self.seen[2] = ca;
                }
                Ok(_) => {}
                Err(e) => {
                    if !self.seen[2].is_empty() {
                        done.push(Reload::Refused { flags: "--tls-client-ca", reason: e.0 });
                        self.seen[2].clear();
                    }
                }
            }
        }
        done
    }
}

/// The contents of the file `flag` names, or why not, naming both.
fn read(flag: &str, path: &Path) -> Result<Vec<u8>, StartError> {
    std::fs::read(path).map_err(|e| StartError(format!("{flag} {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use steady_testing::tls::TestPki;

    fn der(pem: &str) -> Vec<u8> {
        use steady_proto::tls::rustls::pki_types::{pem::PemObject, CertificateDer};
        CertificateDer::from_pem_slice(pem.as_bytes()).unwrap().to_vec()
    }

    #[test]
    fn a_half_written_rotation_is_refused_once_and_the_pair_is_taken_when_complete() {
        let ca = TestPki::new("CA");
        let (old, new) = (ca.issue(&["127.0.0.1"]), ca.issue(&["127.0.0.1"]));
        let (cert, key) = (ca.dir().join("serving.pem"), ca.dir().join("serving.key"));
        std::fs::write(&cert, old.cert_pem()).unwrap();
        std::fs::write(&key, old.key_pem()).unwrap();
        let files = TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: None,
            client_auth: ClientAuth::Optional,
        };
        let mut tls = ReloadingTls::load(files).unwrap();
        assert_eq!(tls.check(), [], "nothing changed");

        // The certificate is written first: the pair does not match, the old one stays.
        std::fs::write(&cert, new.cert_pem()).unwrap();
        let refused = tls.check();
        assert!(
            matches!(&refused[..], [Reload::Refused { flags: "--tls-cert/--tls-key", reason }] if reason.contains("KeyMismatch")),
            "{refused:?}"
        );
        assert_eq!(tls.identity().leaf().to_vec(), der(old.cert_pem()));
        assert_eq!(tls.check(), [], "a refusal is reported once");
        // Then the key: both are taken.
        std::fs::write(&key, new.key_pem()).unwrap();
        assert_eq!(tls.check(), [Reload::Identity { cert: cert.clone() }]);
        assert_eq!(tls.identity().leaf().to_vec(), der(new.cert_pem()));

        // A file removed (a rotation that recreates it) is refused; the material stays.
        std::fs::remove_file(&key).unwrap();
        assert!(matches!(&tls.check()[..], [Reload::Refused { .. }]));
        assert_eq!(tls.identity().leaf().to_vec(), der(new.cert_pem()));
        assert_eq!(tls.check(), []);
        std::fs::write(&key, new.key_pem()).unwrap();
        assert_eq!(tls.check(), [Reload::Identity { cert }]);
    }

    #[test]
    fn a_bad_client_ca_bundle_is_refused_and_a_good_one_taken() {
        let ca = TestPki::new("CA");
        let leaf = ca.issue(&["127.0.0.1"]);
        let bundle = ca.dir().join("clients.pem");
        std::fs::write(&bundle, ca.ca_pem()).unwrap();
        let files = TlsFiles {
            cert: leaf.cert_file().to_path_buf(),
            key: leaf.key_file().to_path_buf(),
            client_ca: Some(bundle.clone()),
            client_auth: ClientAuth::Required,
        };
        let mut tls = ReloadingTls::load(files).unwrap();
        std::fs::write(&bundle, "-----BEGIN CERTIFICATE-----\nnot base64\n").unwrap();
        let refused = tls.check();
        assert!(matches!(&refused[..], [Reload::Refused { flags: "--tls-client-ca", .. }]), "{refused:?}");
        let other = TestPki::new("other CA");
        std::fs::write(&bundle, format!("{}{}", ca.ca_pem(), other.ca_pem())).unwrap();
        assert_eq!(tls.check(), [Reload::ClientCa { ca: bundle }]);
    }
}
