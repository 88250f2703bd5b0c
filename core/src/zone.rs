//! Zones: the failure domains (a cloud's availability zones, cells) a fleet spans, and
//! where each task sits in them.
//!
//! A task's [`Locality`] is its zone and its index *within* that zone. Subsetting runs
//! per zone over those indices (a frontend's zone index against its zone's backends),
//! so a zone's size changes renumber nobody in the other zones, and Rocksteadier's
//! balance and churn hold inside each zone. The job-wide index stays what it always
//! was: what assignments name and what the registry keys.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// The longest zone label, in bytes (a DNS label's length, as Kubernetes' topology labels).
pub const MAX_ZONE_LEN: usize = 63;

/// A zone's label: opaque to steady (compared, ordered and printed, never parsed), 1 to
/// [`MAX_ZONE_LEN`] bytes of ASCII letters, digits, `.`, `_` and `-` (`us-east1-b`,
/// `cell_7`). The limits keep labels safe in registry records, DNS names and metric
/// labels, and bound what a remote peer can make a reader hold. Cloning is `O(1)`.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Zone(Arc<str>);

/// Why a label is not a [`Zone`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ZoneError {
    /// Empty, or longer than [`MAX_ZONE_LEN`] bytes (the length given).
    Length(usize),
    /// A character other than ASCII letters, digits, `.`, `_` and `-`.
    Character(char),
}

impl fmt::Display for ZoneError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Length(n) => write!(f, "a zone label of {n} bytes (1 to {MAX_ZONE_LEN})"),
            Self::Character(c) => {
                write!(f, "{c:?} in a zone label (ASCII letters, digits, '.', '_' and '-' only)")
            }
        }
    }
}

impl std::error::Error for ZoneError {}

impl Zone {
    /// The zone labelled `label`.
    ///
    /// # Errors
    ///
    /// [`ZoneError`] when the label is empty, too long, or has a character outside
    /// `[A-Za-z0-9._-]`.
    pub fn new(label: &str) -> Result<Self, ZoneError> {
        if !(1..=MAX_ZONE_LEN).contains(&label.len()) {
            return Err(ZoneError::Length(label.len()));
        }
        if let Some(c) = label.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
        {
            return Err(ZoneError::Character(c));
        }
        Ok(Self(label.into()))
    }

    /// The label.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for Zone {
    type Err = ZoneError;

    fn from_str(label: &str) -> Result<Self, ZoneError> {
        Self::new(label)
    }
}

impl fmt::Display for Zone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Zone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl AsRef<str> for Zone {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// Where a task sits: its zone, and its index among that zone's tasks (`0..` the zone's
/// size, held as the job-wide index is: claimed in the registry, a StatefulSet ordinal,
/// a position in a static list).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Locality {
    /// The zone.
    pub zone: Zone,
    /// The task's index within the zone.
    pub index: usize,
}

impl Locality {
    /// Task `index` of `zone`.
    pub fn new(zone: Zone, index: usize) -> Self {
        Self { zone, index }
    }
}

/// How many tasks each zone of a job has: `1 +` the highest zone index present, as a
/// job's size is `1 +` its highest index. For a frontend job these are the per-zone
/// sizes every frontend needs to know how much demand each zone makes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ZoneSizes(BTreeMap<Zone, usize>);

impl ZoneSizes {
    /// No zones.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `zone`'s size (a size of 0 removes it); returns the sizes.
    pub fn with(mut self, zone: Zone, size: usize) -> Self {
        self.set(zone, size);
        self
    }

    /// Sets `zone`'s size (a size of 0 removes it).
    pub fn set(&mut self, zone: Zone, size: usize) {
        if size == 0 {
            self.0.remove(&zone);
        } else {
            self.0.insert(zone, size);
        }
    }

    /// `zone`'s size (0 when it has no task).
    pub fn get(&self, zone: &Zone) -> usize {
        self.0.get(zone).copied().unwrap_or(0)
    }

    /// The sizes of every zone, summed (saturating).
    pub fn total(&self) -> usize {
        self.0.values().fold(0usize, |sum, &n| sum.saturating_add(n))
    }

    /// How many zones have tasks.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no zone has a task.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Every zone with its size, by label.
    pub fn iter(&self) -> impl Iterator<Item = (&Zone, usize)> {
        self.0.iter().map(|(z, &n)| (z, n))
    }
}

impl FromIterator<(Zone, usize)> for ZoneSizes {
    fn from_iter<I: IntoIterator<Item = (Zone, usize)>>(iter: I) -> Self {
        let mut sizes = Self::new();
        for (zone, size) in iter {
            sizes.set(zone, size);
        }
        sizes
    }
}

/// One zone's part of a job: its size and, by zone index, the job-wide index of each
/// task there.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ZoneView {
    /// `1 +` the highest zone index present.
    pub size: usize,
    /// Zone index to job-wide task index.
    pub tasks: BTreeMap<usize, usize>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zone_labels_are_short_and_plain() {
        for good in ["a", "us-east1-b", "cell_7", "eu.west.2", &"z".repeat(MAX_ZONE_LEN)] {
            assert_eq!(Zone::new(good).map(|z| z.to_string()), Ok(good.to_owned()));
        }
        assert_eq!(Zone::new(""), Err(ZoneError::Length(0)));
        assert_eq!(Zone::new(&"z".repeat(64)), Err(ZoneError::Length(64)));
        for (bad, c) in [("a b", ' '), ("a/b", '/'), ("a=b", '='), ("zoné", 'é'), ("a\n", '\n')] {
            assert_eq!(Zone::new(bad), Err(ZoneError::Character(c)), "{bad:?}");
        }
    }

    #[test]
    fn zone_sizes_drop_empty_zones_and_sum() {
        let a = Zone::new("a").unwrap();
        let b = Zone::new("b").unwrap();
        let sizes: ZoneSizes = [(a.clone(), 6), (b.clone(), 3)].into_iter().collect();
        assert_eq!((sizes.get(&a), sizes.get(&b), sizes.total(), sizes.len()), (6, 3, 9, 2));
        let sizes = sizes.with(b.clone(), 0);
        assert_eq!((sizes.get(&b), sizes.len()), (0, 1));
    }
}
