//! Where `steadyctl` finds the fleet: its etcd (`--endpoints`: specs, assignments,
//! leaders, instances, run requests) or a memory-store fleet's spec directory
//! (`--specs-dir`: specs only).

use std::time::Duration;

use steady_slicer::fleet::EtcdFleet;
use steady_slicer::specs::{EtcdSpecs, JobConfig, SpecDirectory, SpecStore};
use steady_slicer::store::{EtcdConfig, EtcdStore};

use super::args::Cli;
use super::CtlError;

/// How often a spec directory's watches would read it: `steadyctl` never watches, so any
/// period the directory store accepts.
const DIRECTORY_POLL: Duration = Duration::from_secs(1);

/// The fleet's stores, as the command line names them: the specs (on etcd, or in a
/// directory), and with `--endpoints` the assignment store and the fleet's keys.
#[derive(Debug)]
pub struct Stores {
    specs: SpecStore,
    /// Boxed: an etcd client is a few KiB.
    etcd: Option<Box<(EtcdStore, EtcdFleet)>>,
}

impl Stores {
    /// Connects to `--endpoints` (with the `--etcd-*` settings and `--timeout-ms` per
    /// request), or opens `--specs-dir`.
    ///
    /// # Errors
    ///
    /// [`CtlError::Flags`] for `--etcd-*` flags that cannot work (or given with
    /// `--specs-dir`); [`CtlError::Store`] when etcd cannot be reached or refuses the
    /// settings; [`CtlError::Specs`] for a directory that cannot be read.
    pub async fn open(cli: &Cli) -> Result<Self, CtlError> {
        if let Some(dir) = &cli.specs_dir {
            if let Some(flag) = cli.etcd.first_given() {
                return Err(CtlError::Flags(format!("{flag} is for --endpoints (an etcd to reach)")));
            }
            let specs = SpecStore::Directory(SpecDirectory::open(dir, DIRECTORY_POLL)?);
            return Ok(Self { specs, etcd: None });
        }
        let access = cli.etcd.access().map_err(CtlError::Flags)?;
        let config =
            EtcdConfig::new(cli.endpoints.iter().cloned()).access(access).request_timeout(cli.timeout());
        let store = EtcdStore::connect(config).await?;
        let specs = SpecStore::Etcd(EtcdSpecs::of(&store));
        let fleet = EtcdFleet::new(&store);
        Ok(Self { specs, etcd: Some(Box::new((store, fleet))) })
    }

    /// The specs.
    pub fn specs(&self) -> &SpecStore {
        &self.specs
    }

    /// The assignment store and the fleet's keys, which `command` needs.
    ///
    /// # Errors
    ///
    /// [`CtlError::NeedsEndpoints`] on a spec directory.
    pub fn etcd(&self, command: &'static str) -> Result<(&EtcdStore, &EtcdFleet), CtlError> {
        match self.etcd.as_deref() {
            Some((store, fleet)) => Ok((store, fleet)),
            None => Err(CtlError::NeedsEndpoints(command)),
        }
    }

    /// `job`'s spec.
    ///
    /// # Errors
    ///
    /// [`CtlError::UnknownJob`] when none is stored; the store's own.
    pub async fn spec(&self, job: &str) -> Result<JobConfig, CtlError> {
        self.specs().get(job).await?.ok_or_else(|| CtlError::UnknownJob(job.to_owned()))
    }
}
