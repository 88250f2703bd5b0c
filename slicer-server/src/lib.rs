//! The operator's side of `steady-slicer`: the `steady-slicer` binary, and what it serves
//! besides gRPC.
//!
//! * The `steady-slicer` binary: an instance of a fleet that serves every job of a spec
//!   store (`--fleet`), or one job's Assigner service, Distributor and load collector
//!   (`--job`, a one-job fleet), against a memory or etcd store, from the command line.
//!   `steady-slicer --help` lists its options; `src/bin/steady-slicer.rs` documents them
//!   with examples, `docs/fleet.md` is the operator's guide.
//! * [`fleet`]: the fleet instance itself ([`fleet::Fleet`]): every job followed from the
//!   store into one Distributor and load book, each job's Assigner run where the spread
//!   says, specs, drains and run requests taken as they change.
//! * The `steadyctl` binary: the operator's command line of a fleet of instances (jobs,
//!   instances, leaders, assignments, tasks and their loads; job specs, drains, runs),
//!   in tables or JSON. Its library is [`ctl`]; `docs/steadyctl.md` is its manual.
//! * [`status`]: the HTTP pages (`--metrics-listen`) of a fleet instance: an overview of
//!   every job at `/`, a page per job at `/jobs/<job>` and its tasks as JSON at
//!   `/jobs/<job>.json`, Prometheus text at `/metrics`.
//! * [`cli`]: what steady's command-line tools share: clap's refusals in one line.
//! * [`etcd_flags`]: the `--etcd-*` access flags both binaries take, and their check.
//! * [`tls_files`]: the serving certificate, key and client CA bundle read again from
//!   their files when they change (`--tls-reload-ms`, SIGHUP), without dropping open
//!   streams.
//!
//! A program that embeds the control plane (its own `main`, its own flags) links
//! `steady-slicer` and, for the pages, this crate's library: nothing here is needed to
//! run a Distributor or an Assigner.
//!
//! # Dependencies
//!
//! `steady-slicer` with its `etcd`, `assigner`, `tls` and `metrics` features,
//! `steady-discovery` (etcd registry and DNS), clap, hyper and the OpenTelemetry SDK (a
//! manual reader behind `/metrics`).

#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub, rust_2018_idioms)]

pub mod cli;
pub mod ctl;
pub mod etcd_flags;
pub mod fleet;
pub mod status;
pub mod tls_files;
