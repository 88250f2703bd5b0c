//! The Slicelet's and its reporter's OpenTelemetry instruments (feature `metrics`).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use opentelemetry::metrics::Meter;
use opentelemetry::KeyValue;
use steady_core::metrics::Observed;

use crate::{LoadReporter, Slicelet};

fn labels(job: &str, task: u32) -> Vec<KeyValue> {
    vec![KeyValue::new("steady.job", job.to_owned()), KeyValue::new("steady.task", i64::from(task))]
}

impl Slicelet {
    /// Registers the Slicelet's instruments in `meter`, labelled with `job` and this
    /// task's index: keyed requests recorded, misrouted ones, and what became of those
    /// (refused, forwarded, served within the grace). Observable: read when
    /// the application's reader collects, nothing added per request; nothing reported
    /// once every clone of the Slicelet is dropped.
    pub fn observe_metrics(&self, meter: &Meter, job: &str) {
        let state = Arc::downgrade(&self.state);
        let source = move || {
            state.upgrade().map(|s| {
                let m = &s.misroutes;
                [&s.keyed, &s.misrouted, &m.rejected, &m.forwarded, &m.in_grace]
                    .map(|counter| counter.load(Ordering::Relaxed))
            })
        };
        Observed::new(meter, labels(job, self.task), source)
            .counter(
                "steady.slicelet.keyed_requests",
                "{request}",
                "Keyed requests this task recorded",
                |s| s[0],
            )
            .counter(
                "steady.slicelet.misrouted",
                "{request}",
                "Keyed requests whose key this task did not hold in the assignment in force",
                |s| s[1],
            )
            .counter(
                "steady.slicelet.misroutes.rejected",
                "{request}",
                "Misrouted requests refused with the newer generation",
                |s| s[2],
            )
            .counter(
                "steady.slicelet.misroutes.forwarded",
                "{request}",
                "Misrouted requests forwarded to their key's owner",
                |s| s[3],
            )
            .counter(
                "steady.slicelet.misroutes.in_grace",
                "{request}",
                "Misrouted requests served within the grace period after their key moved away",
                |s| s[4],
            );
    }
}

impl LoadReporter {
    /// Registers the reporter's instruments in `meter`, labelled with `job` and the
    /// task: reports sent, connections and streams that failed, streams opened.
    pub fn observe_metrics(&self, meter: &Meter, job: &str, task: u32) {
        let counters = Arc::downgrade(&self.counters);
        let source = move || {
            counters
                .upgrade()
                .map(|c| [&c.sent, &c.failed, &c.streams].map(|counter| counter.load(Ordering::Relaxed)))
        };
        Observed::new(meter, labels(job, task), source)
            .counter("steady.slicelet.reports.sent", "{report}", "Load reports handed to a stream", |c| c[0])
            .counter(
                "steady.slicelet.reports.failed",
                "{failure}",
                "Connections to the collector that failed and report streams that broke",
                |c| c[1],
            )
            .counter("steady.slicelet.reports.streams", "{stream}", "Report streams opened", |c| c[2]);
    }
}
