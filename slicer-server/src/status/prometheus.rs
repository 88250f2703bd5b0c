//! [`MetricsRegistry`]: an OpenTelemetry meter provider whose instruments are read on
//! demand and written as Prometheus text (exposition format 0.0.4).

use std::fmt::Write as _;
use std::sync::{Arc, Weak};
use std::time::Duration;

use opentelemetry::metrics::{Meter, MeterProvider as _};
use opentelemetry::{KeyValue, Value};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, Histogram, Metric, MetricData, ResourceMetrics};
use opentelemetry_sdk::metrics::reader::MetricReader;
use opentelemetry_sdk::metrics::{
    Instrument, InstrumentKind, ManualReader, Pipeline, SdkMeterProvider, Stream, Temporality,
};
use steady_assigner::Constraint;
use steady_slicer::specs::MAX_JOBS;

/// A meter provider of its own (never the global one) and the reader behind its
/// `/metrics` page: instruments registered in [`MetricsRegistry::meter`] are read when
/// [`MetricsRegistry::render`] is called, and only then.
///
/// Names are written as Prometheus wants them: dots become underscores, counters end in
/// `_total`, and the unit is appended when it is a real unit (`s`, not `{request}`):
/// `grpc.subchannel.connection_attempts_succeeded` is scraped as
/// `grpc_subchannel_connection_attempts_succeeded_total`.
///
/// An instrument keeps at most 2,000 series (label sets; the SDK's default: past it
/// the rest are summed in one series labelled `otel.metric.overflow`), except the
/// Assigner's (`steady.assigner.*`), which a fleet instance reports for up to
/// `steady_slicer::specs::MAX_JOBS` jobs: each keeps that many times its own label sets
/// per job (1; 2 for `imbalance` and `recall_time`; 4 for the placement's; 7 for
/// `moves`). The SDK reserves room for an instrument's series when it is registered
/// (a hash table of the limit's size): for the Assigner's instruments, 524,288 entries
/// of 33 bytes, about 17 MB of address space, resident as series fill it (the counters'
/// tables are given back at the first collection and grow as needed).
#[derive(Debug, Clone)]
pub struct MetricsRegistry {
    provider: SdkMeterProvider,
    reader: SharedReader,
}

impl Default for MetricsRegistry {
    fn default() -> Self {
        Self::new()
    }
}

impl MetricsRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        let reader = SharedReader(Arc::new(ManualReader::builder().build()));
        let provider =
            SdkMeterProvider::builder().with_reader(reader.clone()).with_view(series_limit).build();
        Self { provider, reader }
    }

    /// The meter steady's components register their instruments in.
    pub fn meter(&self) -> Meter {
        self.provider.meter("steady")
    }

    /// Every instrument's value now, as Prometheus text.
    pub fn render(&self) -> String {
        let mut metrics = ResourceMetrics::default();
        if let Err(error) = self.reader.collect(&mut metrics) {
            tracing::warn!(%error, "metrics: collection failed");
        }
        encode(&metrics)
    }
}

/// The Assigner's instruments keep a series per label set of every job a fleet instance
/// may run ([`MAX_JOBS`]); the rest keep the SDK's default.
fn series_limit(instrument: &Instrument) -> Option<Stream> {
    let per_job = match instrument.name() {
        "steady.assigner.moves" => 7,
        "steady.assigner.placement.violations" | "steady.assigner.placement.infeasible" => {
            Constraint::ALL.len()
        }
        "steady.assigner.imbalance" | "steady.assigner.recall_time" => 2,
        name if name.starts_with("steady.assigner.") => 1,
        _ => return None,
    };
    Stream::builder().with_cardinality_limit(MAX_JOBS * per_job).build().ok()
}

/// The manual reader, shared between the provider (which owns its reader) and us.
#[derive(Debug, Clone)]
struct SharedReader(Arc<ManualReader>);

impl MetricReader for SharedReader {
    fn register_pipeline(&self, pipeline: Weak<Pipeline>) {
        self.0.register_pipeline(pipeline);
    }
    fn collect(&self, rm: &mut ResourceMetrics) -> OTelSdkResult {
        self.0.collect(rm)
    }
    fn force_flush(&self) -> OTelSdkResult {
        self.0.force_flush()
    }
    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }
    fn temporality(&self, _kind: InstrumentKind) -> Temporality {
        Temporality::Cumulative
    }
}

/// `metrics` in the Prometheus text format.
pub(crate) fn encode(metrics: &ResourceMetrics) -> String {
    let mut out = String::new();
    for scope in metrics.scope_metrics() {
        for metric in scope.metrics() {
            match metric.data() {
                AggregatedMetrics::F64(data) => write_metric(&mut out, metric, data, |v| *v),
                AggregatedMetrics::U64(data) => write_metric(&mut out, metric, data, |v| *v as f64),
                AggregatedMetrics::I64(data) => write_metric(&mut out, metric, data, |v| *v as f64),
            }
        }
    }
    out
}

fn write_metric<T: Copy>(out: &mut String, metric: &Metric, data: &MetricData<T>, value: impl Fn(&T) -> f64) {
    let base = name(metric.name(), metric.unit());
    let (kind, name, points): (&str, String, Vec<(Vec<&KeyValue>, f64)>) = match data {
        MetricData::Gauge(g) => {
            ("gauge", base, g.data_points().map(|p| (p.attributes().collect(), value(&p.value()))).collect())
        }
        MetricData::Sum(s) if s.is_monotonic() => (
            "counter",
            format!("{base}_total"),
            s.data_points().map(|p| (p.attributes().collect(), value(&p.value()))).collect(),
        ),
        MetricData::Sum(s) => {
            ("gauge", base, s.data_points().map(|p| (p.attributes().collect(), value(&p.value()))).collect())
        }
        MetricData::Histogram(h) => return write_histogram(out, metric, &base, h, value),
        // Only an application's own views make exponential histograms; Prometheus text
        // has no form for them.
        MetricData::ExponentialHistogram(_) => return,
    };
    if points.is_empty() {
        return;
    }
    write_header(out, &name, metric.description(), kind);
    for (attributes, v) in points {
        write_sample(out, &name, &attributes, None, v);
    }
}

/// A histogram as Prometheus wants it: cumulative `_bucket` series (one per bound, and
/// `le="+Inf"`), `_sum` and `_count`.
fn write_histogram<T: Copy>(
    out: &mut String,
    metric: &Metric,
    name: &str,
    histogram: &Histogram<T>,
    value: impl Fn(&T) -> f64,
) {
    let mut points = histogram.data_points().peekable();
    if points.peek().is_none() {
        return;
    }
    write_header(out, name, metric.description(), "histogram");
    let bucket = format!("{name}_bucket");
    for point in points {
        let attributes: Vec<&KeyValue> = point.attributes().collect();
        let mut cumulative = 0;
        // The SDK gives one count per bound and one more above the last.
        for (bound, count) in point.bounds().zip(point.bucket_counts()) {
            cumulative += count;
            write_sample(out, &bucket, &attributes, Some(&number(bound)), cumulative as f64);
        }
        write_sample(out, &bucket, &attributes, Some("+Inf"), point.count() as f64);
        write_sample(out, &format!("{name}_sum"), &attributes, None, value(&point.sum()));
        write_sample(out, &format!("{name}_count"), &attributes, None, point.count() as f64);
    }
}

fn write_header(out: &mut String, name: &str, description: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {}", escape_help(description));
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// One sample line; `le` is a histogram bucket's bound, written last.
fn write_sample(out: &mut String, name: &str, attributes: &[&KeyValue], le: Option<&str>, v: f64) {
    out.push_str(name);
    if !attributes.is_empty() || le.is_some() {
        out.push('{');
        for (i, kv) in attributes.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let _ =
                write!(out, "{}=\"{}\"", sanitize(kv.key.as_str()), escape_label(&label_value(&kv.value)));
        }
        if let Some(le) = le {
            if !attributes.is_empty() {
                out.push(',');
            }
            let _ = write!(out, "le=\"{le}\"");
        }
        out.push('}');
    }
    let _ = writeln!(out, " {}", number(v));
}

/// The Prometheus name of an instrument: dots to underscores, and the unit appended when
/// it is one (annotations in braces, and the dimensionless `1`, are not).
fn name(name: &str, unit: &str) -> String {
    let mut name = sanitize(name);
    let suffix = match unit {
        "s" => Some("seconds"),
        "ms" => Some("milliseconds"),
        "By" => Some("bytes"),
        _ => None,
    };
    if let Some(suffix) = suffix {
        if !name.ends_with(suffix) {
            name.push('_');
            name.push_str(suffix);
        }
    }
    name
}

/// Letters, digits and underscores (and not a digit first).
fn sanitize(name: &str) -> String {
    let mut out: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect();
    if out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    out
}

fn label_value(value: &Value) -> String {
    match value {
        Value::String(s) => s.as_str().to_owned(),
        other => other.to_string(),
    }
}

fn escape_label(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn escape_help(text: &str) -> String {
    text.replace('\\', "\\\\").replace('\n', "\\n")
}

fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".to_owned()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.to_owned()
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observed_instruments_are_read_at_render_and_named_for_prometheus() {
        let registry = MetricsRegistry::new();
        let meter = registry.meter();
        let reads = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let seen = reads.clone();
        let _counter = meter
            .u64_observable_counter("grpc.subchannel.connection_attempts_succeeded")
            .with_unit("{attempt}")
            .with_description("Connections \"opened\"")
            .with_callback(move |o| {
                let n = seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                o.observe(7 * n, &[KeyValue::new("grpc.target", "users \"a\"")]);
            })
            .build();
        let _gauge = meter
            .f64_observable_gauge("steady.lb.assignment.age")
            .with_unit("s")
            .with_callback(|o| o.observe(1.5, &[]))
            .build();
        assert_eq!(reads.load(std::sync::atomic::Ordering::Relaxed), 0, "nothing is read before a scrape");
        let text = registry.render();
        assert!(
            text.contains("# TYPE grpc_subchannel_connection_attempts_succeeded_total counter"),
            "{text}"
        );
        assert!(
            text.contains(
                "grpc_subchannel_connection_attempts_succeeded_total{grpc_target=\"users \\\"a\\\"\"} 7"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "# TYPE steady_lb_assignment_age_seconds gauge\nsteady_lb_assignment_age_seconds 1.5"
            ),
            "{text}"
        );
        // The next scrape reads again.
        assert!(registry.render().contains("grpc_target=\"users \\\"a\\\"\"} 14"));
    }

    #[test]
    fn a_histogram_is_written_as_cumulative_buckets_with_sum_and_count() {
        let registry = MetricsRegistry::new();
        let histogram = registry
            .meter()
            .f64_histogram("grpc.client.call.duration")
            .with_unit("s")
            .with_boundaries(vec![0.01, 0.1, 1.0])
            .build();
        let ok = [KeyValue::new("grpc.status", "OK")];
        for v in [0.005, 0.05, 0.05, 5.0] {
            histogram.record(v, &ok);
        }
        histogram.record(0.5, &[KeyValue::new("grpc.status", "UNAVAILABLE")]);
        let text = registry.render();
        let name = "grpc_client_call_duration_seconds";
        assert_eq!(text.matches(&format!("# TYPE {name} histogram\n")).count(), 1, "{text}");
        for line in [
            "_bucket{grpc_status=\"OK\",le=\"0.01\"} 1",
            "_bucket{grpc_status=\"OK\",le=\"0.1\"} 3",
            "_bucket{grpc_status=\"OK\",le=\"1\"} 3",
            "_bucket{grpc_status=\"OK\",le=\"+Inf\"} 4",
            "_sum{grpc_status=\"OK\"} 5.105",
            "_count{grpc_status=\"OK\"} 4",
            "_bucket{grpc_status=\"UNAVAILABLE\",le=\"0.1\"} 0",
            "_bucket{grpc_status=\"UNAVAILABLE\",le=\"1\"} 1",
            "_count{grpc_status=\"UNAVAILABLE\"} 1",
        ] {
            assert!(text.contains(&format!("{name}{line}\n")), "{line} missing in {text}");
        }
    }

    #[test]
    fn names_are_sanitized_and_units_appended_once() {
        assert_eq!(name("steady.lb.requests", "{request}"), "steady_lb_requests");
        assert_eq!(name("steady.assigner.run_time", "s"), "steady_assigner_run_time_seconds");
        assert_eq!(name("x.seconds", "s"), "x_seconds");
        assert_eq!(sanitize("9a-b"), "_9a_b");
        assert_eq!(number(f64::INFINITY), "+Inf");
    }
}
