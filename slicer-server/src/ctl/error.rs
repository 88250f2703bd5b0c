//! Why a `steadyctl` command failed: [`CtlError`], one line each.

use std::fmt;
use std::path::PathBuf;

use steady_slicer::fleet::FleetError;
use steady_slicer::specs::{DocumentError, SpecStoreError};
use steady_slicer::store::StoreError;

/// Why a command did nothing (or, for a store that did not answer, may have done it:
/// read again). Each prints as one line; the program prefixes `steadyctl: ` and exits 1.
#[derive(Debug)]
#[non_exhaustive]
pub enum CtlError {
    /// The job has no spec in the store (for a spec directory: no `<job>.json`).
    UnknownJob(String),
    /// The command reads what only the fleet's etcd holds (leaders, assignments,
    /// instances, run requests), and `--specs-dir` was given.
    NeedsEndpoints(&'static str),
    /// The `--etcd-*` flags: a file that cannot be read, a flag without its pair.
    Flags(String),
    /// `spec put FILE`: the file could not be read.
    File {
        /// The file (`-`: standard input).
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// `spec put FILE`: the document is not a valid spec (naming the field).
    Document {
        /// The file.
        path: PathBuf,
        /// Why, with the field.
        error: DocumentError,
    },
    /// The spec store refused or failed: a spec refused by field, a stored spec that
    /// does not read, etcd or the directory unavailable.
    Specs(SpecStoreError),
    /// The assignment store (connecting to etcd, reading an assignment).
    Store(StoreError),
    /// The fleet's keys (instances, leaders, run requests).
    Fleet(FleetError),
}

impl fmt::Display for CtlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownJob(job) => write!(f, "no job {job:?} (no spec of it in the store)"),
            Self::NeedsEndpoints(command) => write!(
                f,
                "{command} needs --endpoints (the fleet's etcd): a memory-store fleet keeps its leaders, \
                 assignments and instances in its process; --specs-dir serves spec, drain and undrain only"
            ),
            Self::Flags(line) => f.write_str(line),
            Self::File { path, error } => write!(f, "{}: {error}", shown(path)),
            Self::Document { path, error } => write!(f, "{}: spec refused: {error}", shown(path)),
            Self::Specs(error) => error.fmt(f),
            Self::Store(error) => write!(f, "assignment store: {error}"),
            Self::Fleet(error) => error.fmt(f),
        }
    }
}

fn shown(path: &std::path::Path) -> String {
    if path.as_os_str() == "-" {
        "standard input".to_owned()
    } else {
        path.display().to_string()
    }
}

impl std::error::Error for CtlError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::File { error, .. } => Some(error),
            Self::Document { error, .. } => Some(error),
            Self::Specs(error) => Some(error),
            Self::Store(error) => Some(error),
            Self::Fleet(error) => Some(error),
            _ => None,
        }
    }
}

impl From<SpecStoreError> for CtlError {
    fn from(error: SpecStoreError) -> Self {
        Self::Specs(error)
    }
}

impl From<StoreError> for CtlError {
    fn from(error: StoreError) -> Self {
        Self::Store(error)
    }
}

impl From<FleetError> for CtlError {
    fn from(error: FleetError) -> Self {
        Self::Fleet(error)
    }
}

/// `text` on one line: each line break (and the indentation after it) becomes one
/// space, so that an error that quotes a remote answer still prints as one line.
pub fn one_line(text: &str) -> String {
    text.split(['\n', '\r']).map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_is_one_line() {
        assert_eq!(
            CtlError::UnknownJob("users".into()).to_string(),
            "no job \"users\" (no spec of it in the store)"
        );
        let needs = CtlError::NeedsEndpoints("run").to_string();
        assert!(needs.starts_with("run needs --endpoints"), "{needs}");
        let file = CtlError::File { path: "-".into(), error: std::io::ErrorKind::NotFound.into() };
        assert!(file.to_string().starts_with("standard input: "), "{file}");
        assert_eq!(
            one_line("status: Unavailable\n  message: \"down\"\r\n"),
            "status: Unavailable message: \"down\""
        );
    }
}
