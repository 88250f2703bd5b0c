//! The JSON form of a [`JobConfig`] (version 1, a contract: see the module
//! documentation of [`super`] and `tests/golden/job-config-*.json`).
//!
//! Reading goes field by field over a parsed JSON object, so that a field of the wrong
//! type is named ([`DocumentError::Field`]) and not only placed by line and column.

use std::collections::BTreeSet;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use steady_assigner::JobSpec;
use steady_slice::guard::Consistency;

use super::{DocumentError, JobConfig, JobConfigError, TaskSource, MAX_SPEC_BYTES};

/// The version this build writes and reads.
pub(super) const VERSION: u64 = 1;

/// The longest unknown field name an error repeats, in bytes.
const MAX_NAMED_FIELD: usize = 64;

/// The document as written: every field, in this order.
#[derive(Serialize)]
struct Written<'a> {
    version: u64,
    job: &'a str,
    algorithm: &'a str,
    cadence_ms: u64,
    consistency: Mode,
    lease_ttl_secs: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    handover_ms: Option<u64>,
    tasks: Source<'a>,
    spec: &'a JobSpec,
    /// Written only when some task is drained, so a document without drains is the one
    /// written before the field existed.
    #[serde(skip_serializing_if = "BTreeSet::is_empty")]
    drained: &'a BTreeSet<u32>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Mode {
    Eventual,
    Exclusive,
}

/// `{"count": 8}`, `{"registry": {"endpoints": [...]}}` or `{"dns": "name"}`.
#[derive(Serialize)]
#[serde(rename_all = "snake_case")]
enum Source<'a> {
    Count(u32),
    Registry { endpoints: &'a [String] },
    Dns(&'a str),
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum SourceRead {
    Count(u32),
    Registry { endpoints: Vec<String> },
    Dns(String),
}

/// `config` as its JSON document (pretty, with a final newline). Validate first: an
/// invalid config writes a document that may not read back (a goal that is not finite
/// is written as `null`).
pub(super) fn to_json(config: &JobConfig) -> String {
    let mut text = serde_json::to_string_pretty(&written(config)).expect("a job config serializes");
    text.push('\n');
    text
}

/// `config` in the document's shape.
fn written(config: &JobConfig) -> Written<'_> {
    Written {
        version: VERSION,
        job: &config.job,
        algorithm: &config.algorithm,
        cadence_ms: millis(config.cadence),
        consistency: match config.consistency {
            Consistency::Eventual => Mode::Eventual,
            Consistency::Exclusive => Mode::Exclusive,
        },
        lease_ttl_secs: config.lease_ttl.as_secs(),
        handover_ms: config.handover.map(millis),
        tasks: match &config.tasks {
            TaskSource::Count(n) => Source::Count(*n),
            TaskSource::Registry { endpoints } => Source::Registry { endpoints },
            TaskSource::Dns(name) => Source::Dns(name),
        },
        spec: &config.spec,
        drained: &config.drained,
    }
}

/// Reads a document: at most [`MAX_SPEC_BYTES`], version 1, every field known, then
/// [`JobConfig::validate`]d.
pub(super) fn from_json(bytes: &[u8]) -> Result<JobConfig, DocumentError> {
    if bytes.len() > MAX_SPEC_BYTES {
        return Err(DocumentError::TooLarge { bytes: bytes.len() });
    }
    let value: Value =
        serde_json::from_slice(bytes).map_err(|e| DocumentError::Malformed { reason: e.to_string() })?;
    from_value(value)
}

/// Reads a document whose key or file names `job`: as [`from_json`], and its `"job"`
/// must be that one.
pub(super) fn from_json_for(job: &str, bytes: &[u8]) -> Result<JobConfig, DocumentError> {
    let config = from_json(bytes)?;
    if config.job != job {
        let expected = format!("{job:?}, the job its key or file names (not {:?})", config.job);
        return Err(DocumentError::Invalid(JobConfigError::new("job", expected)));
    }
    Ok(config)
}

/// Reads a parsed document (no size bound: the caller's).
pub(super) fn from_value(value: Value) -> Result<JobConfig, DocumentError> {
    let Value::Object(mut map) = value else {
        return Err(DocumentError::Malformed { reason: "the document is not a JSON object".to_owned() });
    };
    match map.remove("version") {
        None => return Err(DocumentError::Version { found: None }),
        Some(version) if version.as_u64() == Some(VERSION) => {}
        Some(version) => {
            return Err(DocumentError::Version { found: Some(truncated(&version.to_string())) });
        }
    }
    let job: String = required(&mut map, "job")?;
    let tasks = match required(&mut map, "tasks")? {
        SourceRead::Count(n) => TaskSource::Count(n),
        SourceRead::Registry { endpoints } => TaskSource::Registry { endpoints },
        SourceRead::Dns(name) => TaskSource::Dns(name),
    };
    let mut config = JobConfig::new(job, tasks);
    for (name, value) in map {
        match name.as_str() {
            "algorithm" => config.algorithm = field(&name, value)?,
            "cadence_ms" => config.cadence = Duration::from_millis(field(&name, value)?),
            "consistency" => {
                config.consistency = match field(&name, value)? {
                    Mode::Eventual => Consistency::Eventual,
                    Mode::Exclusive => Consistency::Exclusive,
                }
            }
            "lease_ttl_secs" => config.lease_ttl = Duration::from_secs(field(&name, value)?),
            "handover_ms" => config.handover = field::<Option<u64>>(&name, value)?.map(Duration::from_millis),
            "spec" => config.spec = field(&name, value)?,
            "drained" => config.drained = field(&name, value)?,
            unknown => return Err(unknown_field(unknown)),
        }
    }
    config.validate().map_err(DocumentError::Invalid)?;
    Ok(config)
}

/// An unknown field `name`.
fn unknown_field(name: &str) -> DocumentError {
    DocumentError::Field { field: truncated(name), reason: "unknown field".to_owned() }
}

/// At most the first [`MAX_NAMED_FIELD`] bytes of `text` (whole characters), so an error
/// does not repeat a document's largest string.
fn truncated(text: &str) -> String {
    let mut end = text.len().min(MAX_NAMED_FIELD);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

/// The field `name`, which must be there.
fn required<T: DeserializeOwned>(map: &mut Map<String, Value>, name: &str) -> Result<T, DocumentError> {
    match map.remove(name) {
        Some(value) => field(name, value),
        None => Err(DocumentError::Field { field: name.to_owned(), reason: "missing".to_owned() }),
    }
}

/// The field `name`'s value as a `T`.
fn field<T: DeserializeOwned>(name: &str, value: Value) -> Result<T, DocumentError> {
    serde_json::from_value(value)
        .map_err(|e| DocumentError::Field { field: name.to_owned(), reason: e.to_string() })
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

impl Serialize for JobConfig {
    /// The JSON document's form (see [`JobConfig::to_json`]).
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        written(self).serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for JobConfig {
    /// Reads the JSON document's form and validates it, as [`JobConfig::from_json`]
    /// (without its size bound: the caller's deserializer has its own).
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        from_value(value).map_err(serde::de::Error::custom)
    }
}

impl JobConfig {
    /// The spec as its JSON document (version 1; pretty, with a final newline): what
    /// the stores write. Validate first: an invalid config writes a document that may
    /// not read back.
    pub fn to_json(&self) -> String {
        to_json(self)
    }

    /// Reads a JSON document: at most [`MAX_SPEC_BYTES`], `"version": 1`, no unknown
    /// field, then [`JobConfig::validate`]d.
    ///
    /// # Errors
    ///
    /// [`DocumentError`] naming the field (or `document`, or `version`).
    pub fn from_json(bytes: &[u8]) -> Result<Self, DocumentError> {
        from_json(bytes)
    }
}
