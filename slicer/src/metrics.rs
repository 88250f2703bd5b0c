//! The control plane's OpenTelemetry instruments (feature `metrics`): the Distributor's,
//! the A119 server's, the load collector's and the Assigner service's. Each is observable: it reads counters
//! the component keeps anyway when the application's reader collects.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use opentelemetry::metrics::Meter;
use opentelemetry::KeyValue;
use steady_core::metrics::Observed;

use crate::load::LoadCollector;
use crate::Distributor;

impl Distributor {
    /// Registers the Distributor's instruments in `meter`: watch streams open, jobs
    /// held, assignments published.
    pub fn observe_metrics(&self, meter: &Meter) {
        let jobs = Arc::downgrade(&self.jobs);
        let source = move || {
            jobs.upgrade().map(|jobs| {
                let jobs = jobs.lock().unwrap_or_else(|p| p.into_inner());
                (jobs.watchers, jobs.by_name.len(), jobs.publications)
            })
        };
        Observed::new(meter, Vec::new(), source)
            .gauge("steady.distributor.watchers", "{stream}", "Watch streams open, over all jobs", |s| {
                s.0 as f64
            })
            .gauge(
                "steady.distributor.jobs",
                "{job}",
                "Jobs held: published ones and unpublished ones with watchers",
                |s| s.1 as f64,
            )
            .counter(
                "steady.distributor.publications",
                "{assignment}",
                "Assignments published (each newer than the one it replaced)",
                |s| s.2,
            );
    }
}

impl crate::autosharding::Autosharding {
    /// Registers the A119 server's instruments in `meter`: streams open, acks by outcome
    /// (accepted, rejected, invalid), clients' load reports by outcome (accepted,
    /// invalid), generations encoded.
    pub fn observe_metrics(&self, meter: &Meter) {
        let shared = Arc::downgrade(&self.shared);
        let source = move || shared.upgrade().map(|shared| shared.figures());
        let by_outcome = |outcomes: &'static [&'static str]| {
            move |n: &[u64]| {
                outcomes
                    .iter()
                    .zip(n)
                    .map(|(outcome, n)| (vec![KeyValue::new("steady.outcome", *outcome)], *n))
                    .collect::<Vec<_>>()
            }
        };
        let (acks, reports) =
            (by_outcome(&["accepted", "rejected", "invalid"]), by_outcome(&["accepted", "invalid"]));
        Observed::new(meter, Vec::new(), source)
            .gauge("steady.autosharding.streams", "{stream}", "A119 streams open", |f| f.0 as f64)
            .counters(
                "steady.autosharding.acks",
                "{ack}",
                "Clients' acks of assignments by outcome: accepted, rejected (the client keeps the one it had), invalid (a generation not sent)",
                move |f| acks(&f.1),
            )
            .counters(
                "steady.autosharding.reports",
                "{report}",
                "Clients' load reports by outcome: accepted, invalid",
                move |f| reports(&f.2),
            )
            .counter(
                "steady.autosharding.encodings",
                "{generation}",
                "Generations encoded as A119 responses (once per job and generation, for every stream)",
                |f| f.3,
            );
    }
}

impl LoadCollector {
    /// Registers the collector's instruments in `meter`: reports by outcome (accepted
    /// and dropped by the book, invalid, refused for their sender), streams open.
    pub fn observe_metrics(&self, meter: &Meter) {
        let (counters, book) = (Arc::downgrade(&self.counters), self.book().clone());
        let source = move || {
            counters.upgrade().map(|c| {
                (
                    [
                        book.accepted(),
                        book.dropped(),
                        c.invalid.load(Ordering::Relaxed),
                        c.refused.load(Ordering::Relaxed),
                    ],
                    c.open_streams.load(Ordering::Relaxed),
                )
            })
        };
        Observed::new(meter, Vec::new(), source)
            .counters(
                "steady.collector.reports",
                "{report}",
                "Load reports by outcome: accepted, dropped (unknown job, task or generation), invalid, refused (sender not authorized for the task)",
                |(n, _)| {
                    ["accepted", "dropped", "invalid", "refused"]
                        .into_iter()
                        .zip(n)
                        .map(|(outcome, n)| (vec![KeyValue::new("steady.outcome", outcome)], *n))
                        .collect()
                },
            )
            .gauge("steady.collector.streams", "{stream}", "Report streams open", |(_, open)| *open as f64);
    }
}

#[cfg(feature = "assigner")]
impl crate::assigner_service::AssignerHandle {
    /// Registers the Assigner service's instruments in `meter`, labelled with `job` and
    /// `candidate` (its name in the election, so that several services of one process,
    /// a leader and its standby, are told apart):
    /// runs, publications, conflicts, errors, terms, whether it leads, the generation,
    /// run time, the last run's imbalance before and after and key churn, moves by kind,
    /// the placement constraints the last run misses (slices per constraint, and which
    /// one the task set cannot meet), and exclusive mode's recalls (completed, pending
    /// now, the last and the longest recall's time).
    ///
    /// Each call registers the instruments again, for this service: a program whose
    /// services come and go (a fleet instance, whose jobs move) registers them once
    /// over all of its services with [`AssignerStats::observe_services`].
    ///
    /// [`AssignerStats::observe_services`]: crate::assigner_service::AssignerStats::observe_services
    pub fn observe_metrics(&self, meter: &Meter, job: &str, candidate: &str) {
        let stats = Arc::downgrade(&self.shared_stats());
        let labels = vec![
            KeyValue::new("steady.job", job.to_owned()),
            KeyValue::new("steady.candidate", candidate.to_owned()),
        ];
        crate::assigner_service::AssignerStats::observe_services(meter, move || {
            stats.upgrade().map(|s| vec![(labels.clone(), s)]).unwrap_or_default()
        });
    }
}

/// The services an [`AssignerStats::observe_services`] collection reports: each one's
/// labels and statistics.
///
/// [`AssignerStats::observe_services`]: crate::assigner_service::AssignerStats::observe_services
#[cfg(feature = "assigner")]
type Services = Vec<(Vec<KeyValue>, Arc<crate::assigner_service::AssignerStats>)>;

/// A reading of one service's statistics (its extra labels and values) as a reading of
/// every service's, each series labelled with its service's labels first.
#[cfg(feature = "assigner")]
fn each<V: 'static>(
    read: impl Fn(&crate::assigner_service::AssignerStats) -> Vec<(Vec<KeyValue>, V)> + Send + Sync + 'static,
) -> impl Fn(&Services) -> Vec<(Vec<KeyValue>, V)> + Send + Sync + 'static {
    move |services| {
        let mut series = Vec::with_capacity(services.len());
        for (labels, stats) in services {
            for (extra, value) in read(stats) {
                let mut all = Vec::with_capacity(labels.len() + extra.len());
                all.extend(labels.iter().cloned());
                all.extend(extra);
                series.push((all, value));
            }
        }
        series
    }
}

/// [`each`] for a reading of one value per service.
#[cfg(feature = "assigner")]
fn one<V: 'static>(
    read: impl Fn(&crate::assigner_service::AssignerStats) -> V + Send + Sync + 'static,
) -> impl Fn(&Services) -> Vec<(Vec<KeyValue>, V)> + Send + Sync + 'static {
    each(move |s| vec![(Vec::new(), read(s))])
}

#[cfg(feature = "assigner")]
impl crate::assigner_service::AssignerStats {
    /// Registers the Assigner service's instruments (those of
    /// [`AssignerHandle::observe_metrics`], under the same names, units and
    /// descriptions) once in `meter`, over every service `services` names at each
    /// collection, each series labelled with its service's labels (then the
    /// instrument's own, `steady.kind` and the like).
    ///
    /// For a program whose services start and stop (a fleet instance: a job's Assigner
    /// runs where the spread puts it): registering per service would keep every callback
    /// ever registered. A service `services` leaves out reports nothing from then on, so
    /// its series end. `services` is called once per instrument per collection; the
    /// series are as many as the services it names times each instrument's own label
    /// sets (at most 7, `steady.assigner.moves`' kinds), so the caller bounds them by
    /// bounding the services.
    ///
    /// [`AssignerHandle::observe_metrics`]: crate::assigner_service::AssignerHandle::observe_metrics
    pub fn observe_services(meter: &Meter, services: impl Fn() -> Services + Send + Sync + 'static) {
        let last = |s: &crate::assigner_service::AssignerStats| s.history().last().cloned();
        Observed::new(meter, Vec::new(), move || Some(services()))
            .counters("steady.assigner.runs", "{run}", "Assigner runs", one(|s| s.runs()))
            .counters(
                "steady.assigner.publications",
                "{assignment}",
                "Generations written and published",
                one(|s| s.published()),
            )
            .counters(
                "steady.assigner.handovers",
                "{handover}",
                "Moves made in two steps: warming steps published",
                one(|s| s.handovers()),
            )
            .counters(
                "steady.assigner.conflicts",
                "{write}",
                "Writes that lost a race (re-read and retried)",
                one(|s| s.conflicts()),
            )
            .counters(
                "steady.assigner.errors",
                "{error}",
                "Store errors, refused or panicked runs and failed campaigns",
                one(|s| s.errors()),
            )
            .counters(
                "steady.assigner.terms",
                "{term}",
                "Times this service became the job's leader",
                one(|s| s.terms()),
            )
            .gauges(
                "steady.assigner.leader",
                "1",
                "1 while this service leads the job",
                one(|s| f64::from(u8::from(s.is_leading()))),
            )
            .gauges(
                "steady.assigner.generation",
                "1",
                "The last generation this service published",
                one(|s| s.generation() as f64),
            )
            .gauges(
                "steady.assigner.run_time",
                "s",
                "Time spent in assigner runs so far",
                one(|s| s.run_time().as_secs_f64()),
            )
            .gauges(
                "steady.assigner.imbalance",
                "1",
                "The last published run's imbalance (busiest task's load / mean), before and after",
                each(move |s| {
                    last(s)
                        .map(|r| {
                            let mut v =
                                vec![(vec![KeyValue::new("steady.when", "after")], r.imbalance_after)];
                            if let Some(before) = r.imbalance_before {
                                v.push((vec![KeyValue::new("steady.when", "before")], before));
                            }
                            v
                        })
                        .unwrap_or_default()
                }),
            )
            .gauges(
                "steady.assigner.key_churn",
                "1",
                "The share of the key space the last published run moved",
                each(move |s| last(s).map(|r| vec![(Vec::new(), r.key_churn)]).unwrap_or_default()),
            )
            .counters(
                "steady.assigner.moves",
                "{move}",
                "Changes made by published runs, by kind",
                each(|s| {
                    let m = s.moves();
                    [
                        ("forced", m.forced),
                        ("moved", m.moved),
                        ("split", m.split),
                        ("merged", m.merged),
                        ("replica_added", m.replicas_added),
                        ("replica_removed", m.replicas_removed),
                        ("swapped", m.swapped),
                    ]
                    .into_iter()
                    .map(|(kind, n)| (vec![KeyValue::new("steady.kind", kind)], n as u64))
                    .collect()
                }),
            )
            .counters(
                "steady.assigner.recalls",
                "{recall}",
                "Recalls completed in exclusive mode (the guard granted the new generation)",
                one(|s| s.recalls()),
            )
            .gauges(
                "steady.assigner.recall_pending",
                "1",
                "1 while a recall is pending (exclusive mode: a Slicelet still holds the generation replaced)",
                one(|s| f64::from(u8::from(s.recall_pending()))),
            )
            .gauges(
                "steady.assigner.recall_time",
                "s",
                "Exclusive mode: the last and the longest recall's time, from publishing the generation to granting it",
                each(|s| {
                    [("last", s.last_recall()), ("longest", s.longest_recall())]
                        .into_iter()
                        .filter_map(|(which, took)| {
                            Some((vec![KeyValue::new("steady.which", which)], took?.as_secs_f64()))
                        })
                        .collect()
                }),
            )
            .gauges(
                "steady.assigner.placement.violations",
                "{slice}",
                "Slices of the last run's assignment that miss each placement constraint (0: met)",
                each(|s| {
                    let placement = s.placement();
                    steady_assigner::Constraint::ALL
                        .into_iter()
                        .map(|c| {
                            let slices = placement.violations.iter().find(|v| v.constraint == c).map_or(0, |v| v.slices);
                            (vec![KeyValue::new("steady.constraint", c.name())], slices as f64)
                        })
                        .collect()
                }),
            )
            .gauges(
                "steady.assigner.placement.infeasible",
                "1",
                "1 for the constraint the task set cannot meet (the run publishes the best assignment it allows)",
                each(|s| {
                    let why = s.placement().infeasible.map(|i| i.constraint());
                    steady_assigner::Constraint::ALL
                        .into_iter()
                        .map(|c| {
                            (vec![KeyValue::new("steady.constraint", c.name())], f64::from(u8::from(why == Some(c))))
                        })
                        .collect()
                }),
            );
    }
}
