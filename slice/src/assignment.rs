//! [`Assignment`]: which backend tasks serve which slices of the key space.

use std::fmt;

use crate::key::SliceKey;
use crate::range::KeyRange;

/// The most slices one assignment may have (Slicer uses tens of thousands).
pub const MAX_SLICES: usize = 1 << 20;
/// The most replicas one slice may have.
pub const MAX_REPLICAS: usize = 1024;
/// The largest task index an assignment may name: `2^24 - 1`, the largest backend index
/// steady's subsetting handles (`steady_subset::MAX_BACKENDS - 1`; the balancer checks
/// at compile time that the two agree).
pub const MAX_TASK: u32 = (1 << 24) - 1;

/// One slice: the keys from `start` up to the next slice's start (or the end of the key
/// space), served by `replicas` (backend task indices, in no particular order), and
/// being handed to `warming` tasks.
///
/// A *warming* task is about to serve the slice (the first step of a handover): clients
/// send it nothing for the slice, and its Slicelet announces the slice so the
/// application can load state before the switch makes it a replica. Most slices have
/// none; the field is left out of every encoding then, so assignments without warming
/// tasks encode exactly as before it existed.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Slice {
    /// The first key of the slice.
    pub start: SliceKey,
    /// The backend tasks that serve it: not empty, no duplicates.
    pub replicas: Vec<u32>,
    /// The tasks warming up to serve it: no duplicates, none of them a replica. Usually
    /// empty.
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Vec::is_empty"))]
    pub warming: Vec<u32>,
}

impl Slice {
    /// A slice from `start` served by `replicas`, with no warming task.
    pub fn new(start: SliceKey, replicas: Vec<u32>) -> Self {
        Self { start, replicas, warming: Vec::new() }
    }
}

/// A generation of the key space's division into slices, each with its replicas.
///
/// Valid by construction: the generation is at least 1, the first slice starts at 0, starts strictly increase (so
/// every key falls in exactly one slice: no gaps, no overlaps), every slice has between
/// 1 and [`MAX_REPLICAS`] distinct replicas no larger than [`MAX_TASK`], and there are at most
/// [`MAX_SLICES`] slices. A newer generation replaces an older one wherever assignments
/// are followed (the balancer, the slicelet, the distributor).
///
/// Generation 0 is never an assignment: it means "none yet" wherever generations are
/// exchanged (a watcher's `known_generation` on the wire), so an assignment numbered 0
/// could be published and never be newer than what any watcher has. Construction,
/// decoding, JSON and protobuf all refuse it with [`AssignmentError::ZeroGeneration`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(try_from = "RawAssignment"))]
pub struct Assignment {
    generation: u64,
    slices: Vec<Slice>,
}

/// The unvalidated form serde reads before [`Assignment::new`] checks it.
#[cfg(feature = "serde")]
#[derive(serde::Deserialize)]
struct RawAssignment {
    generation: u64,
    slices: Vec<Slice>,
}

#[cfg(feature = "serde")]
impl TryFrom<RawAssignment> for Assignment {
    type Error = AssignmentError;
    fn try_from(raw: RawAssignment) -> Result<Self, AssignmentError> {
        Assignment::new(raw.generation, raw.slices)
    }
}

/// Why an assignment is invalid: the first problem found, with where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AssignmentError {
    /// Generation 0, which means "no assignment" (see [`Assignment`]).
    ZeroGeneration,
    /// No slices at all: the key space would be uncovered.
    NoSlices,
    /// More than [`MAX_SLICES`] slices.
    TooManySlices {
        /// How many there were.
        count: usize,
    },
    /// The first slice does not start at key 0: keys below it would be uncovered.
    FirstStartNotZero {
        /// Where it starts.
        start: SliceKey,
    },
    /// A slice does not start after the one before it (unsorted or duplicate start).
    NotIncreasing {
        /// The slice's position.
        slice: usize,
        /// Its start.
        start: SliceKey,
        /// The previous slice's start.
        previous: SliceKey,
    },
    /// A slice with no replicas.
    NoReplicas {
        /// The slice's position.
        slice: usize,
    },
    /// A slice with more than [`MAX_REPLICAS`] replicas.
    TooManyReplicas {
        /// The slice's position.
        slice: usize,
        /// How many there were.
        count: usize,
    },
    /// The same task twice in one slice.
    DuplicateReplica {
        /// The slice's position.
        slice: usize,
        /// The repeated task.
        task: u32,
    },
    /// A task index above [`MAX_TASK`].
    TaskOutOfRange {
        /// The slice's position.
        slice: usize,
        /// The task index.
        task: u32,
    },
    /// More than [`MAX_REPLICAS`] warming tasks in a slice.
    TooManyWarming {
        /// The slice's position.
        slice: usize,
        /// How many there were.
        count: usize,
    },
    /// A task both serving and warming the same slice, or warming it twice.
    DuplicateWarming {
        /// The slice's position.
        slice: usize,
        /// The task.
        task: u32,
    },
}

impl fmt::Display for AssignmentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ZeroGeneration => write!(f, "generation 0 means \"no assignment\": generations start at 1"),
            Self::NoSlices => write!(f, "assignment has no slices"),
            Self::TooManySlices { count } => write!(f, "assignment has {count} slices (limit {MAX_SLICES})"),
            Self::FirstStartNotZero { start } => write!(f, "first slice starts at {start}, not 0"),
            Self::NotIncreasing { slice, start, previous } => {
                write!(f, "slice {slice} starts at {start}, not after the previous start {previous}")
            }
            Self::NoReplicas { slice } => write!(f, "slice {slice} has no replicas"),
            Self::TooManyReplicas { slice, count } => {
                write!(f, "slice {slice} has {count} replicas (limit {MAX_REPLICAS})")
            }
            Self::DuplicateReplica { slice, task } => write!(f, "slice {slice} lists task {task} twice"),
            Self::TaskOutOfRange { slice, task } => {
                write!(f, "slice {slice} names task {task} (limit {MAX_TASK})")
            }
            Self::TooManyWarming { slice, count } => {
                write!(f, "slice {slice} has {count} warming tasks (limit {MAX_REPLICAS})")
            }
            Self::DuplicateWarming { slice, task } => {
                write!(f, "slice {slice} lists task {task} as warming twice or as both replica and warming")
            }
        }
    }
}

impl std::error::Error for AssignmentError {}

impl Assignment {
    /// Validates and builds an assignment.
    ///
    /// # Errors
    ///
    /// The first [`AssignmentError`] found: [`AssignmentError::ZeroGeneration`] for
    /// generation 0, then the slices' problems, scanning slices in order.
    pub fn new(generation: u64, slices: Vec<Slice>) -> Result<Self, AssignmentError> {
        if generation == 0 {
            return Err(AssignmentError::ZeroGeneration);
        }
        if slices.is_empty() {
            return Err(AssignmentError::NoSlices);
        }
        if slices.len() > MAX_SLICES {
            return Err(AssignmentError::TooManySlices { count: slices.len() });
        }
        if slices[0].start != SliceKey::MIN {
            return Err(AssignmentError::FirstStartNotZero { start: slices[0].start });
        }
        let mut seen: Vec<u32> = Vec::new();
        for (i, slice) in slices.iter().enumerate() {
            if i > 0 && slice.start <= slices[i - 1].start {
                return Err(AssignmentError::NotIncreasing {
                    slice: i,
                    start: slice.start,
                    previous: slices[i - 1].start,
                });
            }
            if slice.replicas.is_empty() {
                return Err(AssignmentError::NoReplicas { slice: i });
            }
            if slice.replicas.len() > MAX_REPLICAS {
                return Err(AssignmentError::TooManyReplicas { slice: i, count: slice.replicas.len() });
            }
            if let Some(&task) = slice.replicas.iter().find(|&&t| t > MAX_TASK) {
                return Err(AssignmentError::TaskOutOfRange { slice: i, task });
            }
            seen.clear();
            seen.extend_from_slice(&slice.replicas);
            seen.sort_unstable();
            if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
                return Err(AssignmentError::DuplicateReplica { slice: i, task: w[0] });
            }
            if slice.warming.is_empty() {
                continue;
            }
            if slice.warming.len() > MAX_REPLICAS {
                return Err(AssignmentError::TooManyWarming { slice: i, count: slice.warming.len() });
            }
            if let Some(&task) = slice.warming.iter().find(|&&t| t > MAX_TASK) {
                return Err(AssignmentError::TaskOutOfRange { slice: i, task });
            }
            seen.extend_from_slice(&slice.warming);
            seen.sort_unstable();
            if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
                return Err(AssignmentError::DuplicateWarming { slice: i, task: w[0] });
            }
        }
        Ok(Self { generation, slices })
    }

    /// One slice covering every key, served by `replicas`.
    ///
    /// # Errors
    ///
    /// As [`Assignment::new`].
    pub fn single(generation: u64, replicas: Vec<u32>) -> Result<Self, AssignmentError> {
        Self::new(generation, vec![Slice::new(SliceKey::MIN, replicas)])
    }

    /// The same slices under another generation.
    ///
    /// # Errors
    ///
    /// [`AssignmentError::ZeroGeneration`] for generation 0.
    pub fn renumbered(&self, generation: u64) -> Result<Self, AssignmentError> {
        if generation == 0 {
            return Err(AssignmentError::ZeroGeneration);
        }
        Ok(Self { generation, slices: self.slices.clone() })
    }

    /// Whether any slice has a warming task (a handover in progress).
    pub fn has_warming(&self) -> bool {
        self.slices.iter().any(|s| !s.warming.is_empty())
    }

    /// The generation, at least 1: higher replaces lower.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The slices, sorted by start.
    pub fn slices(&self) -> &[Slice] {
        &self.slices
    }

    /// The position of the slice that holds `key` (binary search, `O(log slices)`).
    #[inline]
    pub fn slice_index(&self, key: SliceKey) -> usize {
        // The first start is 0, so at least one start is <= key.
        self.slices.partition_point(|s| s.start <= key) - 1
    }

    /// The slice that holds `key`.
    pub fn slice_for(&self, key: SliceKey) -> &Slice {
        &self.slices[self.slice_index(key)]
    }

    /// The keys of slice `i`: from its start up to the next slice's start.
    ///
    /// # Panics
    ///
    /// When `i` is not below `self.slices().len()`.
    pub fn range(&self, i: usize) -> KeyRange {
        KeyRange::new(self.slices[i].start, self.slices.get(i + 1).map(|next| next.start))
    }

    /// The key ranges `task` serves, in key order: one per slice that names it among its
    /// replicas (adjacent slices give adjacent ranges; they are not merged). A slicelet
    /// uses it to know what it holds; `O(slices)`.
    pub fn slices_of(&self, task: u32) -> impl Iterator<Item = KeyRange> + '_ {
        (0..self.slices.len())
            .filter(move |&i| self.slices[i].replicas.contains(&task))
            .map(|i| self.range(i))
    }

    /// The key ranges `task` is warming, in key order, with each slice's replicas (the
    /// owners the state can be loaded from); `O(slices)`.
    pub fn warming_of(&self, task: u32) -> impl Iterator<Item = (KeyRange, &[u32])> + '_ {
        (0..self.slices.len())
            .filter(move |&i| self.slices[i].warming.contains(&task))
            .map(|i| (self.range(i), self.slices[i].replicas.as_slice()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(start: u64, replicas: &[u32]) -> Slice {
        Slice::new(SliceKey(start), replicas.to_vec())
    }

    fn warm(start: u64, replicas: &[u32], warming: &[u32]) -> Slice {
        Slice { warming: warming.to_vec(), ..slice(start, replicas) }
    }

    #[test]
    fn warming_tasks_are_validated_and_found() {
        use AssignmentError::*;
        assert_eq!(
            Assignment::new(1, vec![warm(0, &[1], &[2, 2])]),
            Err(DuplicateWarming { slice: 0, task: 2 })
        );
        assert_eq!(
            Assignment::new(1, vec![warm(0, &[1], &[1])]),
            Err(DuplicateWarming { slice: 0, task: 1 })
        );
        assert_eq!(
            Assignment::new(1, vec![warm(0, &[1], &[MAX_TASK + 1])]),
            Err(TaskOutOfRange { slice: 0, task: MAX_TASK + 1 })
        );
        let many: Vec<u32> = (10..=10 + MAX_REPLICAS as u32).collect();
        assert_eq!(
            Assignment::new(1, vec![warm(0, &[1], &many)]),
            Err(TooManyWarming { slice: 0, count: MAX_REPLICAS + 1 })
        );
        let a = Assignment::new(2, vec![warm(0, &[1], &[2]), slice(100, &[2]), warm(200, &[1, 3], &[2])])
            .unwrap();
        assert!(a.has_warming());
        let warming: Vec<_> = a.warming_of(2).collect();
        assert_eq!(warming, [(a.range(0), &[1][..]), (a.range(2), &[1, 3][..])]);
        // Warming is not serving.
        assert_eq!(a.slices_of(2).collect::<Vec<_>>(), [a.range(1)]);
        assert!(!a.renumbered(3).unwrap().slices().iter().zip(a.slices()).any(|(x, y)| x != y));
        assert_eq!(a.renumbered(0), Err(ZeroGeneration));
    }

    #[test]
    fn every_kind_of_invalid_assignment_is_named() {
        use AssignmentError::*;
        assert_eq!(Assignment::single(0, vec![1]), Err(ZeroGeneration));
        // The generation is checked first.
        assert_eq!(Assignment::new(0, vec![]), Err(ZeroGeneration));
        assert_eq!(Assignment::new(1, vec![]), Err(NoSlices));
        assert_eq!(Assignment::new(1, vec![slice(5, &[1])]), Err(FirstStartNotZero { start: SliceKey(5) }));
        assert_eq!(
            Assignment::new(1, vec![slice(0, &[1]), slice(9, &[2]), slice(9, &[3])]),
            Err(NotIncreasing { slice: 2, start: SliceKey(9), previous: SliceKey(9) })
        );
        assert_eq!(
            Assignment::new(1, vec![slice(0, &[1]), slice(9, &[2]), slice(3, &[3])]),
            Err(NotIncreasing { slice: 2, start: SliceKey(3), previous: SliceKey(9) })
        );
        assert_eq!(Assignment::new(1, vec![slice(0, &[1]), slice(4, &[])]), Err(NoReplicas { slice: 1 }));
        assert_eq!(
            Assignment::new(1, vec![slice(0, &[1, 7, 1])]),
            Err(DuplicateReplica { slice: 0, task: 1 })
        );
        assert_eq!(
            Assignment::new(1, vec![slice(0, &[MAX_TASK + 1])]),
            Err(TaskOutOfRange { slice: 0, task: MAX_TASK + 1 })
        );
        let many: Vec<u32> = (0..=MAX_REPLICAS as u32).collect();
        assert_eq!(
            Assignment::new(1, vec![slice(0, &many)]),
            Err(TooManyReplicas { slice: 0, count: MAX_REPLICAS + 1 })
        );
    }

    #[test]
    fn lookup_finds_the_slice_whose_range_holds_the_key() {
        let a = Assignment::new(3, vec![slice(0, &[1]), slice(100, &[2]), slice(u64::MAX, &[3])]).unwrap();
        assert_eq!(a.slice_index(SliceKey(0)), 0);
        assert_eq!(a.slice_index(SliceKey(99)), 0);
        assert_eq!(a.slice_index(SliceKey(100)), 1);
        assert_eq!(a.slice_index(SliceKey(u64::MAX - 1)), 1);
        assert_eq!(a.slice_index(SliceKey(u64::MAX)), 2);
        assert_eq!(a.slice_for(SliceKey(150)).replicas, [2]);
    }

    #[test]
    fn a_task_serves_the_ranges_of_the_slices_that_name_it() {
        let a = Assignment::new(1, vec![slice(0, &[1, 2]), slice(100, &[2]), slice(200, &[1])]).unwrap();
        let of = |task| a.slices_of(task).collect::<Vec<_>>();
        assert_eq!(
            of(1),
            [KeyRange::new(SliceKey(0), Some(SliceKey(100))), KeyRange::new(SliceKey(200), None)]
        );
        assert_eq!(of(2), [KeyRange::new(SliceKey(0), Some(SliceKey(100))), a.range(1)]);
        assert!(of(3).is_empty());
        let covered: f64 = (0..3).map(|i| a.range(i).fraction()).sum();
        assert_eq!(covered, 1.0);
    }
}
