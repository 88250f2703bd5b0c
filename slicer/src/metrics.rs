//! The control plane's OpenTelemetry instruments (feature `metrics`): the Distributor's,
//! the load collector's and the Assigner service's. Each is observable: it reads counters
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
    pub fn observe_metrics(&self, meter: &Meter, job: &str, candidate: &str) {
        let stats = Arc::downgrade(&self.shared_stats());
        let source = move || stats.upgrade();
        let last = |s: &crate::assigner_service::AssignerStats| s.history().last().cloned();
        let labels = vec![
            KeyValue::new("steady.job", job.to_owned()),
            KeyValue::new("steady.candidate", candidate.to_owned()),
        ];
        Observed::new(meter, labels, source)
            .counter("steady.assigner.runs", "{run}", "Assigner runs", |s| s.runs())
            .counter(
                "steady.assigner.publications",
                "{assignment}",
                "Generations written and published",
                |s| s.published(),
            )
            .counter(
                "steady.assigner.handovers",
                "{handover}",
                "Moves made in two steps: warming steps published",
                |s| s.handovers(),
            )
            .counter(
                "steady.assigner.conflicts",
                "{write}",
                "Writes that lost a race (re-read and retried)",
                |s| s.conflicts(),
            )
            .counter(
                "steady.assigner.errors",
                "{error}",
                "Store errors, refused or panicked runs and failed campaigns",
                |s| s.errors(),
            )
            .counter("steady.assigner.terms", "{term}", "Times this service became the job's leader", |s| {
                s.terms()
            })
            .gauge("steady.assigner.leader", "1", "1 while this service leads the job", |s| {
                f64::from(u8::from(s.is_leading()))
            })
            .gauge("steady.assigner.generation", "1", "The last generation this service published", |s| {
                s.generation() as f64
            })
            .gauge("steady.assigner.run_time", "s", "Time spent in assigner runs so far", |s| {
                s.run_time().as_secs_f64()
            })
            .gauges(
                "steady.assigner.imbalance",
                "1",
                "The last published run's imbalance (busiest task's load / mean), before and after",
                move |s| {
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
                },
            )
            .gauges(
                "steady.assigner.key_churn",
                "1",
                "The share of the key space the last published run moved",
                move |s| last(s).map(|r| vec![(Vec::new(), r.key_churn)]).unwrap_or_default(),
            )
            .counters("steady.assigner.moves", "{move}", "Changes made by published runs, by kind", |s| {
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
            })
            .counter(
                "steady.assigner.recalls",
                "{recall}",
                "Recalls completed in exclusive mode (the guard granted the new generation)",
                |s| s.recalls(),
            )
            .gauge(
                "steady.assigner.recall_pending",
                "1",
                "1 while a recall is pending (exclusive mode: a Slicelet still holds the generation replaced)",
                |s| f64::from(u8::from(s.recall_pending())),
            )
            .gauges(
                "steady.assigner.recall_time",
                "s",
                "Exclusive mode: the last and the longest recall's time, from publishing the generation to granting it",
                |s| {
                    [("last", s.last_recall()), ("longest", s.longest_recall())]
                        .into_iter()
                        .filter_map(|(which, took)| {
                            Some((vec![KeyValue::new("steady.which", which)], took?.as_secs_f64()))
                        })
                        .collect()
                },
            )
            .gauges(
                "steady.assigner.placement.violations",
                "{slice}",
                "Slices of the last run's assignment that miss each placement constraint (0: met)",
                |s| {
                    let placement = s.placement();
                    steady_assigner::Constraint::ALL
                        .into_iter()
                        .map(|c| {
                            let slices = placement.violations.iter().find(|v| v.constraint == c).map_or(0, |v| v.slices);
                            (vec![KeyValue::new("steady.constraint", c.name())], slices as f64)
                        })
                        .collect()
                },
            )
            .gauges(
                "steady.assigner.placement.infeasible",
                "1",
                "1 for the constraint the task set cannot meet (the run publishes the best assignment it allows)",
                |s| {
                    let why = s.placement().infeasible.map(|i| i.constraint());
                    steady_assigner::Constraint::ALL
                        .into_iter()
                        .map(|c| {
                            (vec![KeyValue::new("steady.constraint", c.name())], f64::from(u8::from(why == Some(c))))
                        })
                        .collect()
                },
            );
    }
}
