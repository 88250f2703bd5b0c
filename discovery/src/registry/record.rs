//! The registry's value format (a contract): `<state> <address>`, and task keys.

use std::fmt;

use steady_core::TaskState;

/// The longest value a reader accepts, in bytes; longer values are rejected.
pub const MAX_VALUE_BYTES: usize = 1024;

/// The longest address (or member name) a task may register, in bytes.
pub const MAX_ADDRESS_BYTES: usize = 512;

/// What one task key holds: where the task is and whether it takes new requests.
///
/// # Format (frozen)
///
/// UTF-8 text, `<state> <address>`: the state word, one space, the address, nothing
/// else (no trailing newline), at most [`MAX_VALUE_BYTES`] bytes:
///
/// * `<state>` is `serving` (taking new requests) or `draining` (shutting down: no new
///   requests; those in flight finish);
/// * `<address>` is 1 to [`MAX_ADDRESS_BYTES`] bytes with no whitespace or control
///   characters: a backend's `host:port` (what the channel connects to), or a
///   frontend's member name (frontends are not connected to, the name only tells
///   operators who holds the index).
///
/// For example `serving 10.0.0.7:50051` or `draining web-3.web.prod:8080`. Any etcd
/// client may write it (`etcdctl put --lease=<id> /steady/jobs/api/tasks/3 "serving
/// 10.0.0.7:50051"`). Readers reject anything else (an unknown state word included):
/// the task is then treated as absent, and the rejection is counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskRecord {
    /// Where the task is.
    pub address: String,
    /// Whether it takes new requests: [`TaskState::Serving`] or [`TaskState::Draining`]
    /// ([`TaskState::Gone`] is never stored: a gone task has no key).
    pub state: TaskState,
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
}

impl fmt::Display for RecordError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooLong(n) => write!(f, "value of {n} bytes (at most {MAX_VALUE_BYTES})"),
            Self::NotUtf8 => f.write_str("value is not UTF-8"),
            Self::NoAddress => f.write_str("value is not `<state> <address>`"),
            Self::UnknownState(s) => write!(f, "unknown state {s:?} (serving or draining)"),
            Self::BadAddress => f.write_str("empty or too long address, or one with whitespace"),
        }
    }
}

impl std::error::Error for RecordError {}

impl TaskRecord {
    /// The stored form, `<state> <address>`. `Gone` is written as `draining` (it is
    /// never stored; see the type's documentation).
    pub fn encode(&self) -> String {
        let state = match self.state {
            TaskState::Serving => "serving",
            TaskState::Draining | TaskState::Gone => "draining",
        };
        format!("{state} {}", self.address)
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
        let (state, address) = text.split_once(' ').ok_or(RecordError::NoAddress)?;
        let state = match state {
            "serving" => TaskState::Serving,
            "draining" => TaskState::Draining,
            other => return Err(RecordError::UnknownState(other.chars().take(32).collect())),
        };
        if !valid_address(address) {
            return Err(RecordError::BadAddress);
        }
        Ok(Self { address: address.to_owned(), state })
    }
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

    #[test]
    fn records_round_trip_and_anything_else_is_rejected() {
        for state in [TaskState::Serving, TaskState::Draining] {
            let record = TaskRecord { address: "10.0.0.7:50051".to_owned(), state };
            assert_eq!(TaskRecord::decode(record.encode().as_bytes()), Ok(record));
        }
        assert_eq!(
            TaskRecord::decode(b"serving 10.0.0.7:50051").map(|r| r.address),
            Ok("10.0.0.7:50051".to_owned())
        );
        assert_eq!(TaskRecord::decode(b"serving"), Err(RecordError::NoAddress));
        assert_eq!(TaskRecord::decode(b"up a:1"), Err(RecordError::UnknownState("up".to_owned())));
        assert_eq!(TaskRecord::decode(b"serving "), Err(RecordError::BadAddress));
        assert_eq!(TaskRecord::decode(b"serving a:1 "), Err(RecordError::BadAddress));
        assert_eq!(TaskRecord::decode(b"serving a:1\n"), Err(RecordError::BadAddress));
        assert_eq!(TaskRecord::decode(b"serving \xff"), Err(RecordError::NotUtf8));
        let long = format!("serving {}", "a".repeat(MAX_VALUE_BYTES));
        assert!(matches!(TaskRecord::decode(long.as_bytes()), Err(RecordError::TooLong(_))));
        let long = format!("serving {}", "a".repeat(MAX_ADDRESS_BYTES + 1));
        assert_eq!(TaskRecord::decode(long.as_bytes()), Err(RecordError::BadAddress));
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
