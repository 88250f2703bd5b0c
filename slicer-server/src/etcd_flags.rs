//! How steady's command-line tools reach etcd: the five flags `steady-slicer` and
//! `steadyctl` share (`--etcd-ca`, `--etcd-cert`, `--etcd-key`, `--etcd-user`,
//! `--etcd-password-file`), and the one check that turns them into an [`EtcdAccess`].
//!
//! ```
//! use clap::Parser;
//! use steady_slicer_server::etcd_flags::EtcdFlags;
//!
//! #[derive(Parser)]
//! struct Cli {
//!     #[command(flatten)]
//!     etcd: EtcdFlags,
//! }
//!
//! let cli = Cli::parse_from(["tool", "--etcd-user", "ops"]);
//! assert_eq!(cli.etcd.access().unwrap_err(), "--etcd-user needs --etcd-password-file");
//! ```

use std::path::{Path, PathBuf};

use steady_slicer::store::{EtcdAccess, EtcdTls};

/// The etcd access flags, for `#[command(flatten)]`. Each is optional; they go in pairs
/// (a certificate with its key, a user with a password file), and the certificate and key
/// need the CA (TLS to etcd). The password is never a flag, which `ps` would show: it is
/// the first line of `--etcd-password-file`.
///
/// The flags are global: with subcommands they may come before or after the subcommand.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct EtcdFlags {
    /// Connect to etcd over TLS (`https://` endpoints), trusting this CA (PEM).
    #[arg(long, value_name = "FILE", global = true)]
    pub etcd_ca: Option<PathBuf>,
    /// Present this client certificate to etcd (PEM; with `--etcd-key` and `--etcd-ca`).
    #[arg(long, value_name = "FILE", global = true)]
    pub etcd_cert: Option<PathBuf>,
    /// The private key of `--etcd-cert` (PEM).
    #[arg(long, value_name = "FILE", global = true)]
    pub etcd_key: Option<PathBuf>,
    /// Log in to etcd as this user (with `--etcd-password-file`); its role must cover
    /// the key prefix (`/steady/jobs/`).
    #[arg(long, value_name = "USER", global = true)]
    pub etcd_user: Option<String>,
    /// The password of `--etcd-user`: the file's first line.
    #[arg(long, value_name = "FILE", global = true)]
    pub etcd_password_file: Option<PathBuf>,
}

impl EtcdFlags {
    /// The first of the five flags given, by its name (`"--etcd-ca"`), if any: for a
    /// program to refuse them where no etcd is reached, in its own words.
    pub fn first_given(&self) -> Option<&'static str> {
        [
            ("--etcd-ca", self.etcd_ca.is_some()),
            ("--etcd-cert", self.etcd_cert.is_some()),
            ("--etcd-key", self.etcd_key.is_some()),
            ("--etcd-user", self.etcd_user.is_some()),
            ("--etcd-password-file", self.etcd_password_file.is_some()),
        ]
        .into_iter()
        .find_map(|(flag, given)| given.then_some(flag))
    }

    /// The access settings the flags give: files read now, so that a missing or
    /// unreadable one is one line before anything starts. No flag: plaintext, no user.
    ///
    /// # Errors
    ///
    /// One line naming the flag: a file that cannot be read (`--etcd-ca PATH: ...`), a
    /// password file that is not UTF-8 or whose first line is empty, a flag without its
    /// pair (`--etcd-cert needs --etcd-key`, `--etcd-user needs --etcd-password-file`),
    /// a certificate or key without the CA. Settings etcd refuses are found when
    /// connecting, not here.
    pub fn access(&self) -> Result<EtcdAccess, String> {
        let mut access = EtcdAccess::new();
        match (&self.etcd_ca, &self.etcd_cert, &self.etcd_key) {
            (None, None, None) => {}
            (Some(ca), cert, key) => {
                let mut tls = EtcdTls::new(read("--etcd-ca", ca)?);
                match (cert, key) {
                    (Some(cert), Some(key)) => {
                        tls = tls.identity(read("--etcd-cert", cert)?, read("--etcd-key", key)?);
                    }
                    (None, None) => {}
                    (Some(_), None) => return Err("--etcd-cert needs --etcd-key".into()),
                    (None, Some(_)) => return Err("--etcd-key needs --etcd-cert".into()),
                }
                access = access.tls(tls);
            }
            (None, _, _) => return Err("--etcd-cert and --etcd-key need --etcd-ca (TLS to etcd)".into()),
        }
        match (&self.etcd_user, &self.etcd_password_file) {
            (Some(user), Some(file)) => {
                let password = String::from_utf8(read("--etcd-password-file", file)?)
                    .map_err(|_| format!("--etcd-password-file {}: not UTF-8", file.display()))?;
                let password = password.lines().next().unwrap_or_default();
                if password.is_empty() {
                    return Err(format!("--etcd-password-file {}: the first line is empty", file.display()));
                }
                access = access.user(user.as_str(), password);
            }
            (None, None) => {}
            (Some(_), None) => return Err("--etcd-user needs --etcd-password-file".into()),
            (None, Some(_)) => return Err("--etcd-password-file needs --etcd-user".into()),
        }
        Ok(access)
    }
}

/// The bytes of `path`, or one line naming `flag` and the path.
fn read(flag: &str, path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{flag} {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        etcd: EtcdFlags,
    }

    fn flags(args: &[&str]) -> EtcdFlags {
        Cli::try_parse_from([&["tool"], args].concat()).unwrap().etcd
    }

    #[test]
    fn no_flag_is_plaintext_without_a_user() {
        let access = flags(&[]).access().unwrap();
        assert!(!access.has_tls());
        assert_eq!(access.user_name(), None);
        assert_eq!(flags(&[]).first_given(), None);
    }

    #[test]
    fn a_flag_without_its_pair_is_one_line_naming_both() {
        let cases: [(&[&str], &str); 5] = [
            (&["--etcd-user", "ops"], "--etcd-user needs --etcd-password-file"),
            (&["--etcd-password-file", "p"], "--etcd-password-file needs --etcd-user"),
            (&["--etcd-cert", "c"], "--etcd-cert and --etcd-key need --etcd-ca (TLS to etcd)"),
            (&["--etcd-ca", "Cargo.toml", "--etcd-cert", "c"], "--etcd-cert needs --etcd-key"),
            (&["--etcd-ca", "Cargo.toml", "--etcd-key", "k"], "--etcd-key needs --etcd-cert"),
        ];
        for (args, expected) in cases {
            assert_eq!(flags(args).access().unwrap_err(), expected, "{args:?}");
        }
        assert_eq!(flags(&["--etcd-key", "k", "--etcd-user", "u"]).first_given(), Some("--etcd-key"));
    }

    #[test]
    fn files_are_read_now_and_a_password_is_the_first_line() {
        let missing = flags(&["--etcd-ca", "/nonexistent/ca.pem"]).access().unwrap_err();
        assert!(missing.starts_with("--etcd-ca /nonexistent/ca.pem: "), "{missing}");
        let dir = std::env::temp_dir().join(format!("steady-etcd-flags-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (good, empty) = (dir.join("good"), dir.join("empty"));
        std::fs::write(&good, "s3cret\nignored\n").unwrap();
        std::fs::write(&empty, "\nsecond").unwrap();
        let access =
            flags(&["--etcd-user", "ops", "--etcd-password-file", good.to_str().unwrap()]).access().unwrap();
        assert_eq!(access.user_name(), Some("ops"));
        let refused = flags(&["--etcd-user", "ops", "--etcd-password-file", empty.to_str().unwrap()])
            .access()
            .unwrap_err();
        assert_eq!(refused, format!("--etcd-password-file {}: the first line is empty", empty.display()));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
