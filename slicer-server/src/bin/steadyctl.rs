//! `steadyctl`: the operator's command line of a fleet of `steady-slicer` instances (jobs,
//! instances, leaders, assignments, tasks and their loads; job specs, drains, runs).
//!
//! ```text
//! steadyctl --endpoints http://etcd-0:2379 jobs
//! steadyctl --endpoints http://etcd-0:2379 show users --json
//! steadyctl --endpoints https://etcd-0:2379 --etcd-ca etcd-ca.pem \
//!     --etcd-user ops --etcd-password-file /run/secrets/etcd-password drain users 3
//! steadyctl --specs-dir /etc/steady/jobs spec put users.json
//! ```
//!
//! Everything is in the library, `steady_slicer_server::ctl` (`docs/steadyctl.md` is the
//! manual): exit 0 with the output on stdout, 1 with one line on stderr when the command
//! fails, 2 with one line when the command line is refused.

fn main() -> std::process::ExitCode {
    steady_slicer_server::ctl::main()
}
