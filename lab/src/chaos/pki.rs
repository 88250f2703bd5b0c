//! The soak's certificates, when the fleet runs on mutual TLS (`--tls`): one CA in force,
//! a leaf per identity, and the files every process reads, which a `cert-rotate` fault
//! rewrites.
//!
//! The files live in `<dir>/tls/`: `ca.pem`, the bundle every process trusts (for servers'
//! certificates and for clients'), and `<name>.pem` / `<name>.key` per identity. Each file
//! is written whole under a temporary name and renamed into place, as rotation tools do,
//! so a reader never sees half of one.
//!
//! A rotation moves the fleet to a new CA in three steps ([`Step`]), each taken by every
//! process before the next is written: the bundles gain the new CA; every leaf is
//! reissued by it; the bundles drop the old CA. A client that still presents a leaf of
//! the old CA is refused from then on ([`FleetTls::stale`] keeps one to check that).

use std::path::{Path, PathBuf};

use steady_testing::tls::{Leaf, TestPki};
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

type Failure = Box<dyn std::error::Error>;

/// One step of a rotation, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    /// A new CA made; every bundle trusts old and new.
    TrustNew,
    /// Every identity's leaf reissued by the new CA.
    Reissue,
    /// The old CA dropped from every bundle.
    DropOld,
}

impl Step {
    pub(super) const ALL: [Step; 3] = [Step::TrustNew, Step::Reissue, Step::DropOld];

    /// Its name in the schedule's lines.
    pub(super) fn name(self) -> &'static str {
        match self {
            Step::TrustNew => "trust the new CA",
            Step::Reissue => "reissue every leaf",
            Step::DropOld => "drop the old CA",
        }
    }
}

/// The soak's PKI and its files.
pub(super) struct FleetTls {
    dir: PathBuf,
    /// Every identity: `slicer-a`, `chaos-0` (a backend: the name a load report is
    /// accepted for), `frontend`, ...
    names: Vec<String>,
    /// The CA that issues the leaves in force.
    current: TestPki,
    /// The CA being replaced, while a rotation runs.
    old: Option<TestPki>,
    /// A leaf of the CA the last rotation dropped (with its CA, which must outlive it).
    stale: Option<(TestPki, Leaf)>,
    /// CAs made so far (they are named after it).
    made: u32,
}

impl FleetTls {
    /// A CA and a leaf for each of `names`, written under `dir/tls/`. Each leaf names its
    /// identity first, then `127.0.0.1` (every server is reached there).
    pub(super) fn start(dir: &Path, names: &[String]) -> Result<Self, Failure> {
        let dir = dir.join("tls");
        std::fs::create_dir_all(&dir)?;
        let tls = Self {
            dir,
            names: names.to_vec(),
            current: TestPki::new("chaos CA 1"),
            old: None,
            stale: None,
            made: 1,
        };
        tls.write_bundle()?;
        tls.write_leaves()?;
        Ok(tls)
    }

    /// The directory of the files.
    pub(super) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The bundle's file.
    pub(super) fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// The certificate and key files of identity `name`.
    pub(super) fn files(&self, name: &str) -> (PathBuf, PathBuf) {
        files(&self.dir, name)
    }

    /// Rewrites the files for `step` of a rotation.
    pub(super) fn step(&mut self, step: Step) -> Result<(), Failure> {
        match step {
            Step::TrustNew => {
                self.made += 1;
                let new = TestPki::new(&format!("chaos CA {}", self.made));
                self.old = Some(std::mem::replace(&mut self.current, new));
                self.write_bundle()
            }
            Step::Reissue => self.write_leaves(),
            Step::DropOld => {
                if let Some(old) = self.old.take() {
                    let leaf = old.issue(&["frontend", "127.0.0.1"]);
                    self.stale = Some((old, leaf));
                }
                self.write_bundle()
            }
        }
    }

    /// A client identity of the CA the last rotation dropped, trusting the bundle in
    /// force (so that only its own certificate can be refused).
    pub(super) fn stale(&self) -> Option<ClientTlsConfig> {
        let (_, leaf) = self.stale.as_ref()?;
        Some(self.client_config(leaf.cert_pem(), leaf.key_pem()))
    }

    /// The client settings of identity `name` as its files hold them now.
    pub(super) fn client(&self, name: &str) -> Result<ClientTlsConfig, Failure> {
        client_from_files(&self.dir, name)
    }

    fn client_config(&self, cert: &str, key: &str) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificates(self.cas().into_iter().map(|ca| Certificate::from_pem(ca.ca_pem())))
            .identity(Identity::from_pem(cert, key))
    }

    /// The CAs trusted now: the current one, and the old one during a rotation.
    fn cas(&self) -> Vec<&TestPki> {
        std::iter::once(&self.current).chain(&self.old).collect()
    }

    fn write_bundle(&self) -> Result<(), Failure> {
        let bundle: String = self.cas().iter().map(|ca| ca.ca_pem()).collect();
        write_atomically(&self.ca_file(), &bundle)
    }

    fn write_leaves(&self) -> Result<(), Failure> {
        for name in &self.names {
            let leaf = self.current.issue(&[name, "127.0.0.1"]);
            let (cert, key) = self.files(name);
            // The key first: a reader that takes the certificate takes a key that goes
            // with it (the binary reads on SIGHUP, after both are written).
            write_atomically(&key, leaf.key_pem())?;
            write_atomically(&cert, leaf.cert_pem())?;
        }
        Ok(())
    }
}

/// The certificate and key files of identity `name` in `dir`.
pub(crate) fn files(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    (dir.join(format!("{name}.pem")), dir.join(format!("{name}.key")))
}

/// The client settings of identity `name` from its files in `dir`: trusting `ca.pem`,
/// presenting its certificate.
pub(crate) fn client_from_files(dir: &Path, name: &str) -> Result<ClientTlsConfig, Failure> {
    let (cert, key) = files(dir, name);
    let bundle = std::fs::read_to_string(dir.join("ca.pem"))?;
    Ok(ClientTlsConfig::new()
        .ca_certificates(split_bundle(&bundle).into_iter().map(Certificate::from_pem))
        .identity(Identity::from_pem(std::fs::read(cert)?, std::fs::read(key)?)))
}

/// The certificates of a PEM bundle, one PEM each (tonic takes a root a certificate).
fn split_bundle(bundle: &str) -> Vec<String> {
    const END: &str = "-----END CERTIFICATE-----";
    bundle
        .split_inclusive(END)
        .filter(|pem| pem.contains("BEGIN CERTIFICATE"))
        .map(|pem| format!("{}\n", pem.trim()))
        .collect()
}

/// Writes `contents` to `path` through a temporary file renamed into place.
fn write_atomically(path: &Path, contents: &str) -> Result<(), Failure> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bundle_splits_into_its_certificates() {
        let (a, b) = (TestPki::new("a"), TestPki::new("b"));
        let bundle = format!("{}{}", a.ca_pem(), b.ca_pem());
        assert_eq!(split_bundle(&bundle), vec![a.ca_pem().to_owned(), b.ca_pem().to_owned()]);
    }

    #[test]
    fn a_rotation_trusts_both_cas_reissues_then_drops_the_old() {
        let dir = std::env::temp_dir().join(format!("steady-chaos-pki-{}", std::process::id()));
        let names = vec!["slicer-a".to_owned(), "chaos-0".to_owned()];
        let mut tls = FleetTls::start(&dir, &names).unwrap();
        let bundle = || split_bundle(&std::fs::read_to_string(tls_ca(&dir)).unwrap()).len();
        let cert = |name: &str| std::fs::read_to_string(files(&dir.join("tls"), name).0).unwrap();
        assert_eq!(bundle(), 1);
        let before = cert("chaos-0");
        assert!(tls.stale().is_none());
        tls.step(Step::TrustNew).unwrap();
        assert_eq!(bundle(), 2);
        assert_eq!(cert("chaos-0"), before, "leaves change only at the second step");
        tls.step(Step::Reissue).unwrap();
        assert_ne!(cert("chaos-0"), before);
        tls.step(Step::DropOld).unwrap();
        assert_eq!(bundle(), 1);
        assert!(tls.stale().is_some());
        assert!(tls.client("chaos-0").is_ok());
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn tls_ca(dir: &Path) -> PathBuf {
        dir.join("tls").join("ca.pem")
    }
}
