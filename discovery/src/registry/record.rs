//! The registry's value format (a contract): `<state> <address>`, optionally followed by
//! ` zone=<zone>/<zone-index>`, and task keys.

use std::fmt;

use steady_core::{Locality, TaskState, Zone, ZoneError};

use super::MAX_TASKS;

/// The longest value a reader accepts, in bytes; longer values are rejected.
pub const MAX_VALUE_BYTES: usize = 1024;

/// The longest address (or member name) a task may register, in bytes.
pub const MAX_ADDRESS_BYTES: usize = 512;

/// The zone field's tag: the third field is `zone=<zone>/<zone-index>`.
const ZONE_TAG: &str = "zone=";

/// What one task key holds: where the task is, whether it takes new requests, and
/// (optionally) its zone and index within the zone.
///
/// # Format (frozen)
///
/// UTF-8 text, `<state> <address>` or `<state> <address> zone=<zone>/<zone-index>`:
/// fields separated by one space each, nothing else (no trailing space or newline), at
/// most [`MAX_VALUE_BYTES`] bytes:
///
/// * `<state>` is `serving` (taking new requests) or `draining` (shutting down: no new
///   requests; those in flight finish);
/// * `<address>` is 1 to [`MAX_ADDRESS_BYTES`] bytes with no whitespace or control
///   characters: a backend's `host:port` (what the channel connects to), or a
///   frontend's member name (frontends are not connected to, the name only tells
///   operators who holds the index);
/// * the optional third field is the task's [`Locality`]: `zone=`, a zone label (1 to
///   63 bytes of `[A-Za-z0-9._-]`, see [`Zone`]), `/`, and the task's index within the
///   zone in canonical decimal (`3`, never `03`) below [`MAX_TASKS`](super::MAX_TASKS).
///   A record without it is a task in no zone (every record written before zones
///   existed reads so).
///
/// For example `serving 10.0.0.7:50051`, `draining web-3.web.prod:8080` or
/// `serving 10.0.0.7:50051 zone=us-east1-b/3`. Any etcd client may write it
/// (`etcdctl put --lease=<id> /steady/jobs/api/tasks/3 "serving 10.0.0.7:50051"`).
/// Readers reject anything else (an unknown state word, a fourth field, a third field
/// that is not a well-formed zone included): the task is then treated as absent, and
/// the rejection is counted. Each record has exactly one stored form, so a value that
/// decodes encodes back to the same bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskRecord {
    /// Where the task is.
    pub address: String,
    /// Whether it takes new requests: [`TaskState::Serving`] or [`TaskState::Draining`]
    /// ([`TaskState::Gone`] is never stored: a gone task has no key).
    pub state: TaskState,
    /// Its zone and index within the zone; `None` for a task in no zone.
    pub locality: Option<Locality>,
}

/// Why a stored value is not a [`TaskRecord`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordError {
    /// Longer than [`MAX_VALUE_BYTES`].
    TooLong(usize),
    /// Not UTF-8.
    NotUtf8,
    /// No space between the state and the address.
    NoAddress,
    /// The state word is neither `serving` nor `draining`.
    UnknownState(String),
    /// The address is empty, too long, or holds whitespace or control characters.
    BadAddress,
    /// A third field that is not `zone=<zone>/<zone-index>` (an empty one, from a
    /// trailing space, included); its first 32 characters.
    UnknownField(String),
    /// The zone field's label is not a [`Zone`].
    BadZone(ZoneError),
    /// The zone field has no `/<zone-index>`, or its index is not canonical decimal
    /// below [`MAX_TASKS`](super::MAX_TASKS); its first 32 characters.
    BadZoneIndex(String),
    /// More than three fields.
    ExtraFields,
}

impl fmt::Display for RecordError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooLong(n) => write!(f, "value of {n} bytes (at most {MAX_VALUE_BYTES})"),
            Self::NotUtf8 => f.write_str("value is not UTF-8"),
            Self::NoAddress => f.write_str("value is not `<state> <address>`"),
            Self::UnknownState(s) => write!(f, "unknown state {s:?} (serving or draining)"),
            Self::BadAddress => f.write_str("empty or too long address, or one with whitespace"),
            Self::UnknownField(s) => write!(f, "third field {s:?} is not `zone=<zone>/<zone-index>`"),
            Self::BadZone(e) => write!(f, "zone field: {e}"),
            Self::BadZoneIndex(s) => {
                write!(f, "zone index {s:?}: not canonical decimal below {MAX_TASKS}")
            }
            Self::ExtraFields => f.write_str("more than three fields"),
        }
    }
}

impl std::error::Error for RecordError {}

impl TaskRecord {
    /// A record of a task in no zone.
    pub fn new(address: impl Into<String>, state: TaskState) -> Self {
        Self { address: address.into(), state, locality: None }
    }

    /// The same record, at `locality`.
    pub fn in_zone(mut self, locality: Option<Locality>) -> Self {
        self.locality = locality;
        self
    }

    /// The stored form, `<state> <address>` and, with a locality,
    /// ` zone=<zone>/<zone-index>`. `Gone` is written as `draining` (it is never
    /// stored; see the type's documentation).
    pub fn encode(&self) -> String {
        let state = match self.state {
            TaskState::Serving => "serving",
            TaskState::Draining | TaskState::Gone => "draining",
        };
        match &self.locality {
            None => format!("{state} {}", self.address),
            Some(Locality { zone, index }) => format!("{state} {} {ZONE_TAG}{zone}/{index}", self.address),
        }
    }

    /// Reads a stored value.
    ///
    /// # Errors
    ///
    /// A [`RecordError`] saying what is wrong; nothing panics, whatever the bytes.
    pub fn decode(value: &[u8]) -> Result<Self, RecordError> {
        if value.len() > MAX_VALUE_BYTES {
            return Err(RecordError::TooLong(value.len()));
        }
        let text = std::str::from_utf8(value).map_err(|_| RecordError::NotUtf8)?;
        let (state, rest) = text.split_once(' ').ok_or(RecordError::NoAddress)?;
        let state = match state {
            "serving" => TaskState::Serving,
            "draining" => TaskState::Draining,
            other => return Err(RecordError::UnknownState(first_chars(other))),
        };
        let (address, zone_field) = match rest.split_once(' ') {
            Some((address, field)) => (address, Some(field)),
            None => (rest, None),
        };
        if !valid_address(address) {
            return Err(RecordError::BadAddress);
        }
        let locality = match zone_field {
            None => None,
            Some(field) if field.contains(' ') => return Err(RecordError::ExtraFields),
            Some(field) => Some(locality_of(field)?),
        };
        Ok(Self { address: address.to_owned(), state, locality })
    }
}

/// The locality in a third field, `zone=<zone>/<zone-index>`.
fn locality_of(field: &str) -> Result<Locality, RecordError> {
    let spec = field.strip_prefix(ZONE_TAG).ok_or_else(|| RecordError::UnknownField(first_chars(field)))?;
    // A label never holds '/', so the last one ends it.
    let (label, index) = spec.rsplit_once('/').ok_or_else(|| RecordError::BadZoneIndex(String::new()))?;
    let zone = Zone::new(label).map_err(RecordError::BadZone)?;
    let index =
        index_of(index.as_bytes(), MAX_TASKS).ok_or_else(|| RecordError::BadZoneIndex(first_chars(index)))?;
    Ok(Locality::new(zone, index))
}

/// The first 32 characters of `text`, for an error.
fn first_chars(text: &str) -> String {
    text.chars().take(32).collect()
}

/// Whether `address` may be registered: 1 to [`MAX_ADDRESS_BYTES`] bytes, no whitespace
/// or control characters.
pub(crate) fn valid_address(address: &str) -> bool {
    (1..=MAX_ADDRESS_BYTES).contains(&address.len())
        && !address.chars().any(|c| c.is_whitespace() || c.is_control())
}

/// The index in a task key's last segment: canonical decimal (`0`, `17`; not `017`,
/// `+1`, `1a`), below `limit`. Canonical only, so that two keys never name one index.
pub(crate) fn index_of(segment: &[u8], limit: usize) -> Option<usize> {
    let canonical = match segment {
        [] => false,
        [b'0'] => true,
        [b'0', ..] => false,
        digits => digits.len() <= 9 && digits.iter().all(u8::is_ascii_digit),
    };
    if !canonical {
        return None;
    }
    let index: usize = std::str::from_utf8(segment).ok()?.parse().ok()?;
    (index < limit).then_some(index)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zone(label: &str) -> Zone {
        Zone::new(label).unwrap()
    }

    #[test]
    fn records_round_trip_and_anything_else_is_rejected() {
        for state in [TaskState::Serving, TaskState::Draining] {
            let record = TaskRecord::new("10.0.0.7:50051", state);
            assert_eq!(TaskRecord::decode(record.encode().as_bytes()), Ok(record));
        }
        assert_eq!(
            TaskRecord::decode(b"serving 10.0.0.7:50051").map(|r| r.address),
            Ok("10.0.0.7:50051".to_owned())
        );
        assert_eq!(TaskRecord::decode(b"serving"), Err(RecordError::NoAddress));
        assert_eq!(TaskRecord::decode(b"up a:1"), Err(RecordError::UnknownState("up".to_owned())));
        assert_eq!(TaskRecord::decode(b"serving "), Err(RecordError::BadAddress));
        assert_eq!(TaskRecord::decode(b"serving  a:1"), Err(RecordError::BadAddress));
        assert_eq!(TaskRecord::decode(b"serving a:1 "), Err(RecordError::UnknownField(String::new())));
        assert_eq!(TaskRecord::decode(b"serving a:1\n"), Err(RecordError::BadAddress));
        assert_eq!(TaskRecord::decode(b"serving \xff"), Err(RecordError::NotUtf8));
        let long = format!("serving {}", "a".repeat(MAX_VALUE_BYTES));
        assert!(matches!(TaskRecord::decode(long.as_bytes()), Err(RecordError::TooLong(_))));
        let long = format!("serving {}", "a".repeat(MAX_ADDRESS_BYTES + 1));
        assert_eq!(TaskRecord::decode(long.as_bytes()), Err(RecordError::BadAddress));
    }

    /// The frozen forms, both ways: values written before zones existed, and with a zone.
    #[test]
    fn golden_records_with_and_without_a_zone() {
        let golden: [(&str, TaskRecord); 5] = [
            ("serving 10.0.0.7:50051", TaskRecord::new("10.0.0.7:50051", TaskState::Serving)),
            ("draining web-3.web.prod:8080", TaskRecord::new("web-3.web.prod:8080", TaskState::Draining)),
            (
                "serving 10.0.0.7:50051 zone=us-east1-b/3",
                TaskRecord::new("10.0.0.7:50051", TaskState::Serving)
                    .in_zone(Some(Locality::new(zone("us-east1-b"), 3))),
            ),
            (
                "draining frontend-pod-a zone=cell_7/0",
                TaskRecord::new("frontend-pod-a", TaskState::Draining)
                    .in_zone(Some(Locality::new(zone("cell_7"), 0))),
            ),
            (
                "serving [::1]:80 zone=eu.west.2/65535",
                TaskRecord::new("[::1]:80", TaskState::Serving)
                    .in_zone(Some(Locality::new(zone("eu.west.2"), 65_535))),
            ),
        ];
        for (stored, record) in golden {
            assert_eq!(TaskRecord::decode(stored.as_bytes()).as_ref(), Ok(&record), "{stored}");
            assert_eq!(record.encode(), stored);
        }
        // The longest record the writers can make fits in what readers accept.
        let longest = TaskRecord::new("a".repeat(MAX_ADDRESS_BYTES), TaskState::Draining)
            .in_zone(Some(Locality::new(zone(&"z".repeat(steady_core::MAX_ZONE_LEN)), MAX_TASKS - 1)));
        assert!(longest.encode().len() <= MAX_VALUE_BYTES);
        assert_eq!(TaskRecord::decode(longest.encode().as_bytes()), Ok(longest));
    }

    #[test]
    fn malformed_zone_fields_are_typed_errors() {
        let decode = |s: &str| TaskRecord::decode(s.as_bytes());
        assert_eq!(decode("serving a:1 cell=a/1"), Err(RecordError::UnknownField("cell=a/1".to_owned())));
        assert_eq!(decode("serving a:1 zone=a/1 x"), Err(RecordError::ExtraFields));
        assert_eq!(decode("serving a:1 zone=a/1 "), Err(RecordError::ExtraFields));
        assert_eq!(decode("serving a:1 zone=/1"), Err(RecordError::BadZone(ZoneError::Length(0))));
        assert_eq!(decode("serving a:1 zone=a b/1"), Err(RecordError::ExtraFields));
        assert_eq!(decode("serving a:1 zone=a/b/1"), Err(RecordError::BadZone(ZoneError::Character('/'))));
        assert_eq!(decode("serving a:1 zone=a=b/1"), Err(RecordError::BadZone(ZoneError::Character('='))));
        let long = format!("serving a:1 zone={}/1", "z".repeat(64));
        assert_eq!(decode(&long), Err(RecordError::BadZone(ZoneError::Length(64))));
        assert_eq!(decode("serving a:1 zone=a"), Err(RecordError::BadZoneIndex(String::new())));
        for index in ["", "03", "+3", "3a", "-1", "65536", "99999999999999999999"] {
            let value = format!("serving a:1 zone=a/{index}");
            assert_eq!(
                decode(&value),
                Err(RecordError::BadZoneIndex(index.chars().take(32).collect())),
                "{value}"
            );
        }
    }

    proptest::proptest! {
        /// Every record encodes to a value that decodes to it, and a value that decodes
        /// encodes back to the same bytes (one stored form per record).
        #[test]
        fn records_round_trip(
            draining: bool,
            address in "[!-~]{1,512}",
            locality in proptest::option::of(("[A-Za-z0-9._-]{1,63}", 0..MAX_TASKS)),
        ) {
            let state = if draining { TaskState::Draining } else { TaskState::Serving };
            let locality = locality.map(|(label, index)| Locality::new(zone(&label), index));
            let record = TaskRecord::new(address, state).in_zone(locality);
            let stored = record.encode();
            proptest::prop_assert_eq!(TaskRecord::decode(stored.as_bytes()), Ok(record));
        }

        /// Arbitrary bytes never panic the reader, and what it accepts is canonical.
        #[test]
        fn decoding_arbitrary_bytes_never_panics(value in proptest::collection::vec(proptest::num::u8::ANY, 0..1100)) {
            if let Ok(record) = TaskRecord::decode(&value) {
                proptest::prop_assert_eq!(record.encode().into_bytes(), value);
            }
        }

        /// Near misses of the zone field (the likeliest hostile or mistaken values) never
        /// panic either, and what is accepted is canonical.
        #[test]
        fn decoding_near_miss_zone_fields_never_panics(tail in "[ -~]{0,80}", head in "(serving|draining) [a-z0-9:.]{1,8} (zone=)?") {
            let value = format!("{head}{tail}");
            if let Ok(record) = TaskRecord::decode(value.as_bytes()) {
                proptest::prop_assert_eq!(record.encode(), value);
            }
        }
    }

    #[test]
    fn only_canonical_indices_below_the_limit_name_a_task() {
        assert_eq!(index_of(b"0", 10), Some(0));
        assert_eq!(index_of(b"9", 10), Some(9));
        for bad in [&b""[..], b"10", b"01", b"+1", b"1a", b"-1", b" 1", b"1234567890"] {
            assert_eq!(index_of(bad, 10), None, "{:?}", String::from_utf8_lossy(bad));
        }
        assert_eq!(index_of(b"123456789", usize::MAX), Some(123_456_789));
    }
}
