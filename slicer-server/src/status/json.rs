//! A job's tasks as JSON (`/jobs/<job>.json`): the contract is in the module
//! documentation of [`super`].

use std::collections::BTreeMap;
use std::fmt::Write as _;

use steady_assigner::TaskState;

use super::view::{Here, Row};

/// What the JSON says of a job.
#[derive(Debug, Clone)]
pub(crate) struct JobJson<'a> {
    pub(crate) job: &'a str,
    /// The generation in force; 0 before the first.
    pub(crate) generation: u64,
    pub(crate) owner: Option<&'a str>,
    pub(crate) here: Here,
    pub(crate) rows: &'a BTreeMap<u32, Row>,
}

/// The document, on one line.
pub(crate) fn render(j: &JobJson<'_>) -> String {
    let mut out = String::with_capacity(128 + 96 * j.rows.len());
    let _ = write!(
        out,
        "{{\"job\":{},\"generation\":{},\"owner\":{},\"here\":\"{}\",\"tasks\":[",
        string(j.job),
        j.generation,
        j.owner.map_or("null".to_owned(), string),
        j.here.as_str(),
    );
    for (i, (task, row)) in j.rows.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let state = match row.state {
            Some(TaskState::Serving) => "serving",
            Some(TaskState::Draining) => "draining",
            Some(TaskState::Gone) | None => "gone",
        };
        let _ = write!(
            out,
            "{{\"task\":{task},\"state\":\"{state}\",\"slices\":{},\"key_share\":{},\"load\":{}}}",
            row.slices,
            number(row.share),
            row.load.map_or("null".to_owned(), number),
        );
    }
    out.push_str("]}");
    out
}

/// `text` as a JSON string.
fn string(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_else(|_| "\"\"".to_owned())
}

/// `value` as a JSON number (`null` if it is not finite).
fn number(value: f64) -> String {
    serde_json::to_string(&value).unwrap_or_else(|_| "null".to_owned())
}
