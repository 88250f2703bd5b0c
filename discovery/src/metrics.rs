//! Discovery's OpenTelemetry instruments (feature `metrics`): what a DNS source and an
//! etcd registry watch did, and whether a registration's lease is held. Observable, read
//! when the application's reader collects; labelled with the job (`steady.job`).

use opentelemetry::metrics::Meter;
use opentelemetry::KeyValue;
use steady_core::metrics::Observed;

fn job(name: &str) -> Vec<KeyValue> {
    vec![KeyValue::new("steady.job", name.to_owned())]
}

#[cfg(feature = "dns")]
impl crate::dns::DnsCounters {
    /// Registers the DNS source's instruments in `meter` for `job_name`: resolutions,
    /// failed ones (resolver errors), empty answers, view changes, records skipped.
    pub fn observe_metrics(&self, meter: &Meter, job_name: &str) {
        let counters = self.clone();
        Observed::new(meter, job(job_name), move || Some(counters.snapshot()))
            .counter("steady.discovery.dns.resolutions", "{resolution}", "DNS resolutions attempted", |s| {
                s.resolutions
            })
            .counter(
                "steady.discovery.dns.failures",
                "{resolution}",
                "Resolutions that failed (timeout, refused, server failure); the last view was kept",
                |s| s.failures,
            )
            .counter(
                "steady.discovery.dns.empty_answers",
                "{resolution}",
                "Resolutions with no usable task; the last view was kept",
                |s| s.empty_answers,
            )
            .counter("steady.discovery.view_changes", "{view}", "Views published after the first", |s| {
                s.changes
            })
            .counter(
                "steady.discovery.dns.skipped_records",
                "{record}",
                "Records left out of a view (no ordinal, past the cap, no address)",
                |s| s.skipped_records,
            );
    }
}

#[cfg(feature = "etcd")]
impl crate::registry::WatchCounters {
    /// Registers the registry watch's instruments in `meter` for `job_name`: views
    /// published, etcd events applied, keys or values rejected, errors (failed reads,
    /// broken watches), whole reads of the prefix.
    pub fn observe_metrics(&self, meter: &Meter, job_name: &str) {
        let counters = self.clone();
        Observed::new(meter, job(job_name), move || Some(counters.get()))
            .counter("steady.discovery.view_changes", "{view}", "Views published (the first included)", |s| {
                s.views
            })
            .counter("steady.discovery.registry.events", "{event}", "etcd events applied", |s| s.events)
            .counter(
                "steady.discovery.registry.rejected",
                "{key}",
                "Keys or values rejected (the task treated as absent)",
                |s| s.rejected,
            )
            .counter(
                "steady.discovery.registry.errors",
                "{error}",
                "Failed reads, failed watch openings, watch streams that ended",
                |s| s.errors,
            )
            .counter("steady.discovery.registry.reads", "{read}", "Whole reads of the prefix", |s| s.reads);
    }
}

#[cfg(feature = "etcd")]
impl crate::registry::Registration {
    /// Registers the registration's instrument in `meter`: whether its lease counts as
    /// held (1, then 0 once etcd says it is gone: a lease loss), labelled with the job
    /// and the index. Nothing is reported once the registration is dropped.
    pub fn observe_metrics(&self, meter: &Meter) {
        let held = self.held();
        let labels = vec![
            KeyValue::new("steady.job", self.job().to_owned()),
            KeyValue::new("steady.task", self.index() as i64),
        ];
        // A closed channel: the registration (and its keeper) is gone.
        let source = move || held.has_changed().is_ok().then(|| *held.borrow());
        Observed::new(meter, labels, source).gauge(
            "steady.discovery.registration.held",
            "1",
            "1 while the registration's lease counts as held; 0 once etcd says it is gone",
            |held| f64::from(u8::from(*held)),
        );
    }
}
