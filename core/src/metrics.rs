//! [`Observed`]: observable OpenTelemetry instruments over counters steady already keeps
//! (feature `metrics`).
//!
//! steady counts on the request path already (atomics per member, per service); what a
//! metrics pipeline needs is to read those counts when it collects, not to be told of
//! every request again. Each instrument registered here is *observable*: its callback runs
//! only when the application's reader collects (a Prometheus scrape, an OTLP export
//! period), reads a fresh snapshot through `source`, and reports one value. Nothing is
//! added to the request path, and a source that returns `None` (its component is gone)
//! reports nothing.
//!
//! steady never installs a meter provider or an exporter: the application passes the
//! [`Meter`] it wants steady's instruments in (or takes `opentelemetry::global::meter`).
//!
//! Label sets stay bounded: the attributes given at [`Observed::new`] (a target, a job)
//! are fixed, and per-item labels are values the component bounds (a task index below the
//! job's size, a state out of a few).

use std::fmt;
use std::sync::Arc;

use opentelemetry::metrics::Meter;
use opentelemetry::KeyValue;

/// Registers observable instruments that read snapshots of type `T` from `source`.
pub struct Observed<T> {
    meter: Meter,
    source: Arc<dyn Fn() -> Option<T> + Send + Sync>,
    attributes: Arc<[KeyValue]>,
}

impl<T> fmt::Debug for Observed<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Observed").field("attributes", &self.attributes).finish_non_exhaustive()
    }
}

impl<T: 'static> Observed<T> {
    /// Instruments in `meter` over the snapshots `source` takes (`None`: the component
    /// is gone, nothing is reported), each with `attributes`.
    pub fn new(
        meter: &Meter,
        attributes: Vec<KeyValue>,
        source: impl Fn() -> Option<T> + Send + Sync + 'static,
    ) -> Self {
        Self { meter: meter.clone(), source: Arc::new(source), attributes: attributes.into() }
    }

    /// A monotonic count (`read` of each snapshot is the total so far).
    pub fn counter(
        &self,
        name: &'static str,
        unit: &'static str,
        description: &'static str,
        read: impl Fn(&T) -> u64 + Send + Sync + 'static,
    ) -> &Self {
        self.counters(name, unit, description, move |t| vec![(Vec::new(), read(t))])
    }

    /// A monotonic count per label set: `read` gives each set's extra labels and total.
    pub fn counters(
        &self,
        name: &'static str,
        unit: &'static str,
        description: &'static str,
        read: impl Fn(&T) -> Vec<(Vec<KeyValue>, u64)> + Send + Sync + 'static,
    ) -> &Self {
        let (source, attributes) = (self.source.clone(), self.attributes.clone());
        self.meter
            .u64_observable_counter(name)
            .with_unit(unit)
            .with_description(description)
            .with_callback(move |observer| {
                if let Some(snapshot) = source() {
                    for (labels, value) in read(&snapshot) {
                        observer.observe(value, &with(&attributes, labels));
                    }
                }
            })
            .build();
        self
    }

    /// A value that goes up and down (`read` of each snapshot is the value now).
    pub fn gauge(
        &self,
        name: &'static str,
        unit: &'static str,
        description: &'static str,
        read: impl Fn(&T) -> f64 + Send + Sync + 'static,
    ) -> &Self {
        self.gauges(name, unit, description, move |t| vec![(Vec::new(), read(t))])
    }

    /// A value per label set; a snapshot may leave out a set (then nothing is reported
    /// for it, as for an optional value not yet known).
    pub fn gauges(
        &self,
        name: &'static str,
        unit: &'static str,
        description: &'static str,
        read: impl Fn(&T) -> Vec<(Vec<KeyValue>, f64)> + Send + Sync + 'static,
    ) -> &Self {
        let (source, attributes) = (self.source.clone(), self.attributes.clone());
        self.meter
            .f64_observable_gauge(name)
            .with_unit(unit)
            .with_description(description)
            .with_callback(move |observer| {
                if let Some(snapshot) = source() {
                    for (labels, value) in read(&snapshot) {
                        observer.observe(value, &with(&attributes, labels));
                    }
                }
            })
            .build();
        self
    }
}

/// The fixed attributes followed by `labels`.
fn with(attributes: &[KeyValue], labels: Vec<KeyValue>) -> Vec<KeyValue> {
    let mut all = attributes.to_vec();
    all.extend(labels);
    all
}
