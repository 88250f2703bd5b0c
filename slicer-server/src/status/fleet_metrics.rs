//! [`observe_fleet`]: an instance's instruments over its fleet, registered once.

use std::sync::Arc;

use opentelemetry::metrics::Meter;
use opentelemetry::KeyValue;
use steady_core::metrics::Observed;
use steady_slicer::assigner_service::AssignerStats;
use steady_slicer::fleet::MAX_INSTANCES;
use steady_slicer::specs::MAX_JOBS;
use tokio::sync::watch;

use super::view::Here;
use crate::fleet::FleetStatus;

/// Registers an instance's instruments over its fleet in `meter`, once: each is read at
/// collection from the [`FleetStatus`] in force then, so Assigners that start and stop
/// here as jobs move add no callback.
///
/// * The Assigner service's instruments (`steady.assigner.runs`, `publications`,
///   `handovers`, `conflicts`, `errors`, `terms`, `leader`, `generation`, `run_time`,
///   `imbalance`, `key_churn`, `moves`, the placement's and exclusive mode's recalls: the
///   names, units and descriptions of `AssignerHandle::observe_metrics`), one series set
///   per job whose Assigner runs here, labelled `steady.job` and `steady.candidate` (=
///   `instance`). A job whose Assigner stops here reports nothing from the next
///   collection on: its series end.
/// * `steady.fleet.jobs` (gauge, `{job}`): the jobs the fleet serves (each one's Watch
///   and load reports are served here).
/// * `steady.fleet.instances` (gauge, `{instance}`): the live instances.
/// * `steady.fleet.assigners` (gauge, `{assigner}`, label `steady.state`: `leading`,
///   `campaigning`): the Assigners running here.
///
/// Bounds: at most `steady_slicer::specs::MAX_JOBS` jobs are read (the fleet holds no
/// more), so the Assigner's series are at most that many times each instrument's own
/// label sets; the fleet's instruments have at most two series. The Distributor's and
/// the collector's instruments are theirs (`Distributor::observe_metrics`,
/// `LoadCollector::observe_metrics`): register them once beside these.
pub fn observe_fleet(meter: &Meter, fleet: watch::Receiver<Arc<FleetStatus>>, instance: &str) {
    let candidate = KeyValue::new("steady.candidate", instance.to_owned());
    let read = fleet.clone();
    AssignerStats::observe_services(meter, move || {
        let fleet = read.borrow().clone();
        fleet
            .jobs
            .iter()
            .take(MAX_JOBS)
            .filter_map(|(job, status)| {
                let stats = status.assigner.clone()?;
                Some((vec![KeyValue::new("steady.job", job.clone()), candidate.clone()], stats))
            })
            .collect()
    });
    Observed::new(meter, Vec::new(), move || Some(fleet.borrow().clone()))
        .gauge(
            "steady.fleet.jobs",
            "{job}",
            "Jobs the fleet serves (every instance serves their Watch and load reports)",
            |f| f.jobs.len().min(MAX_JOBS) as f64,
        )
        .gauge("steady.fleet.instances", "{instance}", "Live instances of the fleet", |f| {
            f.instances.len().min(MAX_INSTANCES) as f64
        })
        .gauges(
            "steady.fleet.assigners",
            "{assigner}",
            "Assigners running on this instance, leading their job or campaigning",
            |f| {
                let (mut leading, mut campaigning) = (0, 0);
                for job in f.jobs.values().take(MAX_JOBS) {
                    match Here::of(job) {
                        Here::Leading => leading += 1,
                        Here::Campaigning => campaigning += 1,
                        Here::None => {}
                    }
                }
                [("leading", leading), ("campaigning", campaigning)]
                    .into_iter()
                    .map(|(state, n)| (vec![KeyValue::new("steady.state", state)], f64::from(n)))
                    .collect()
            },
        );
}
