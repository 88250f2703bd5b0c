//! Certificates for TLS tests (feature `tls`): a certificate authority made for one test,
//! and leaf certificates it signs, as PEM and as files.
//!
//! Every leaf is valid for both server and client authentication, so one [`Leaf`] can
//! serve a TLS listener or present itself as a client. Its names (DNS names or IP
//! addresses) go into the subject alternative names; the first is also the common name.
//!
//! ```no_run
//! let pki = steady_testing::tls::TestPki::new("test CA");
//! let server = pki.issue(&["localhost", "127.0.0.1"]);
//! let client = pki.issue(&["backend-3.users"]);
//! let (ca, cert, key) = (pki.ca_pem(), server.cert_pem(), server.key_pem());
//! # let _ = (ca, cert, key, client);
//! ```

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// A certificate authority for one test, with a temporary directory for the files it
/// writes (removed on drop).
pub struct TestPki {
    ca_pem: String,
    issuer: Issuer<'static, KeyPair>,
    dir: PathBuf,
    issued: AtomicU32,
}

impl std::fmt::Debug for TestPki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestPki").field("dir", &self.dir).finish_non_exhaustive()
    }
}

impl TestPki {
    /// A new self-signed authority whose common name is `name`.
    ///
    /// # Panics
    ///
    /// When a key cannot be generated or its directory created (a broken test machine).
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("no names");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("generate the CA's key");
        let ca_pem = params.self_signed(&key).expect("self-sign the CA").pem();
        let dir = crate::temp_dir("steady-pki");
        std::fs::create_dir_all(&dir).expect("create the PKI's directory");
        let pki = Self { ca_pem, issuer: Issuer::new(params, key), dir, issued: AtomicU32::new(0) };
        std::fs::write(pki.ca_file(), &pki.ca_pem).expect("write the CA certificate");
        pki
    }

    /// The authority's certificate, PEM: what a peer trusts to accept this PKI's leaves.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The file holding [`TestPki::ca_pem`].
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// The directory the files are in (removed on drop).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A new key and a certificate for it, signed by this authority, naming `names` (DNS
    /// names or IP addresses; the first is also the common name), valid for server and
    /// client authentication. Its PEM files are written under [`TestPki::dir`].
    ///
    /// # Panics
    ///
    /// When `names` is empty or holds a name that is not a valid DNS name or IP address.
    pub fn issue(&self, names: &[&str]) -> Leaf {
        assert!(!names.is_empty(), "a leaf certificate needs a name");
        let owned: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(owned).expect("valid names");
        params.distinguished_name.push(DnType::CommonName, names[0]);
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages =
            vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate().expect("generate a leaf key");
        let cert = params.signed_by(&key, &self.issuer).expect("sign the leaf");
        let n = self.issued.fetch_add(1, Ordering::Relaxed);
        let leaf = Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            cert_file: self.dir.join(format!("leaf-{n}.pem")),
            key_file: self.dir.join(format!("leaf-{n}.key")),
        };
        std::fs::write(&leaf.cert_file, &leaf.cert_pem).expect("write the leaf certificate");
        std::fs::write(&leaf.key_file, &leaf.key_pem).expect("write the leaf key");
        leaf
    }
}

impl Drop for TestPki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A certificate and its private key, as PEM and as files (which live as long as the
/// [`TestPki`] that issued them).
#[derive(Debug, Clone)]
pub struct Leaf {
    cert_pem: String,
    key_pem: String,
    cert_file: PathBuf,
    key_file: PathBuf,
}

impl Leaf {
    /// The certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The private key, PEM (PKCS#8).
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// The file holding [`Leaf::cert_pem`].
    pub fn cert_file(&self) -> &Path {
        &self.cert_file
    }

    /// The file holding [`Leaf::key_pem`].
    pub fn key_file(&self) -> &Path {
        &self.key_file
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leaf_is_written_as_pem_files_beside_the_authority() {
        let pki = TestPki::new("test CA");
        let leaf = pki.issue(&["localhost", "127.0.0.1"]);
        assert!(pki.ca_pem().starts_with("-----BEGIN CERTIFICATE-----"));
        assert_eq!(std::fs::read_to_string(pki.ca_file()).unwrap(), pki.ca_pem());
        assert_eq!(std::fs::read_to_string(leaf.cert_file()).unwrap(), leaf.cert_pem());
        assert!(std::fs::read_to_string(leaf.key_file()).unwrap().contains("PRIVATE KEY"));
        let other = pki.issue(&["backend-1.users"]);
        assert_ne!(other.cert_file(), leaf.cert_file(), "each leaf has files of its own");
        let dir = pki.dir().to_path_buf();
        drop(pki);
        assert!(!dir.exists(), "the files go with the authority");
    }
}
