//! Between [`LoadReport`] and its protobuf message (`steady_proto::load`), as
//! `From`/`TryFrom` impls.

use std::fmt;

use steady_proto::load as load_proto;
use steady_slice::SliceKey;

use super::{LoadReport, ReportError};

/// The version of the load report messages this crate sends and accepts.
pub const REPORT_VERSION: u32 = 1;

/// Why a received `load_proto::LoadReport` message was refused. Decoding (the version)
/// and validation (the report itself) fail apart.
#[derive(Debug, Clone, PartialEq)]
pub enum MessageError {
    /// A `version` other than [`REPORT_VERSION`] (0 when the sender did not set it).
    UnsupportedVersion(u32),
    /// The report is not valid (see [`LoadReport::new`]).
    Invalid(ReportError),
}

impl fmt::Display for MessageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnsupportedVersion(v) => {
                write!(f, "load report message version {v}: only version {REPORT_VERSION} is understood")
            }
            Self::Invalid(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for MessageError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::UnsupportedVersion(_) => None,
            Self::Invalid(e) => Some(e),
        }
    }
}

impl From<&LoadReport> for load_proto::LoadReport {
    fn from(r: &LoadReport) -> Self {
        load_proto::LoadReport {
            version: REPORT_VERSION,
            job: r.job().to_owned(),
            task: r.task(),
            generation: r.generation(),
            slices: r
                .slices()
                .iter()
                .map(|&(start, rate)| load_proto::SliceLoad { start: start.get(), rate })
                .collect(),
            hot_keys: r
                .hot_keys()
                .iter()
                .map(|&(key, rate)| load_proto::KeyLoad { key: key.get(), rate })
                .collect(),
        }
    }
}

/// Validates a received message: its version first, then the report
/// ([`LoadReport::new`]).
impl TryFrom<load_proto::LoadReport> for LoadReport {
    type Error = MessageError;

    fn try_from(m: load_proto::LoadReport) -> Result<Self, MessageError> {
        if m.version != REPORT_VERSION {
            return Err(MessageError::UnsupportedVersion(m.version));
        }
        LoadReport::new(
            m.job,
            m.task,
            m.generation,
            m.slices.into_iter().map(|s| (SliceKey(s.start), s.rate)).collect(),
            m.hot_keys.into_iter().map(|k| (SliceKey(k.key), k.rate)).collect(),
        )
        .map_err(MessageError::Invalid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_survives_the_round_trip_and_bad_messages_are_named() {
        let report = LoadReport::new(
            "job",
            3,
            7,
            vec![(SliceKey(0), 1.5), (SliceKey(99), 0.0)],
            vec![(SliceKey(u64::MAX), 0.75)],
        )
        .unwrap();
        let message = load_proto::LoadReport::from(&report);
        assert_eq!(message.version, REPORT_VERSION);
        assert_eq!(LoadReport::try_from(message.clone()), Ok(report));

        let v2 = load_proto::LoadReport { version: 2, ..message.clone() };
        assert_eq!(LoadReport::try_from(v2), Err(MessageError::UnsupportedVersion(2)));
        let unset = load_proto::LoadReport { version: 0, ..message.clone() };
        assert_eq!(LoadReport::try_from(unset), Err(MessageError::UnsupportedVersion(0)));
        let mut nan = message.clone();
        nan.hot_keys[0].rate = f64::NAN;
        assert!(matches!(LoadReport::try_from(nan), Err(MessageError::Invalid(ReportError::BadRate { .. }))));
        let mut unsorted = message;
        unsorted.slices.reverse();
        assert_eq!(LoadReport::try_from(unsorted), Err(MessageError::Invalid(ReportError::Unsorted)));
    }
}
