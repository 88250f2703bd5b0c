//! [`Assignment`]: which backend tasks serve which slices of the key space.

use std::fmt;

use crate::key::SliceKey;
use crate::range::KeyRange;
use crate::slice::Slice;

/// The most slices one assignment may have (Slicer uses tens of thousands).
pub const MAX_SLICES: usize = 1 << 20;
/// The most replicas one slice may have.
pub const MAX_REPLICAS: usize = 1024;
/// The largest task index an assignment may name: `2^24 - 1`, the largest backend index
/// steady's subsetting handles (`steady_subset::MAX_BACKENDS - 1`; the balancer checks
/// at compile time that the two agree).
pub const MAX_TASK: u32 = (1 << 24) - 1;

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
        check_head(generation, slices.len())?;
        let mut check = Check::default();
        for (i, slice) in slices.iter().enumerate() {
            check.slice(i, slice, i.checked_sub(1).map(|p| &slices[p]))?;
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
        self.slices.iter().any(|s| !s.warming().is_empty())
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
            .filter(move |&i| self.slices[i].replicas().contains(&task))
            .map(|i| self.range(i))
    }

    /// The key ranges `task` is warming, in key order, with each slice's replicas (the
    /// owners the state can be loaded from); `O(slices)`.
    pub fn warming_of(&self, task: u32) -> impl Iterator<Item = (KeyRange, &[u32])> + '_ {
        (0..self.slices.len())
            .filter(move |&i| self.slices[i].warming().contains(&task))
            .map(|i| (self.range(i), self.slices[i].replicas()))
    }
}

/// The checks of an assignment made before its slices: the generation and the count.
fn check_head(generation: u64, count: usize) -> Result<(), AssignmentError> {
    if generation == 0 {
        return Err(AssignmentError::ZeroGeneration);
    }
    if count == 0 {
        return Err(AssignmentError::NoSlices);
    }
    if count > MAX_SLICES {
        return Err(AssignmentError::TooManySlices { count });
    }
    Ok(())
}

/// The checks of one slice, given the one before it: [`Assignment::new`]'s and
/// [`AssignmentBuilder::push`]'s, so that both name the same first problem.
#[derive(Debug, Default)]
struct Check {
    /// Scratch: the slice's tasks, sorted to find duplicates (one allocation reused,
    /// the size of the largest slice).
    seen: Vec<u32>,
}

impl Check {
    fn slice(&mut self, i: usize, slice: &Slice, previous: Option<&Slice>) -> Result<(), AssignmentError> {
        match previous {
            None if slice.start != SliceKey::MIN => {
                return Err(AssignmentError::FirstStartNotZero { start: slice.start });
            }
            Some(previous) if slice.start <= previous.start => {
                return Err(AssignmentError::NotIncreasing {
                    slice: i,
                    start: slice.start,
                    previous: previous.start,
                });
            }
            _ => {}
        }
        let (replicas, warming) = (slice.replicas(), slice.warming());
        if replicas.is_empty() {
            return Err(AssignmentError::NoReplicas { slice: i });
        }
        if replicas.len() > MAX_REPLICAS {
            return Err(AssignmentError::TooManyReplicas { slice: i, count: replicas.len() });
        }
        if let Some(&task) = replicas.iter().find(|&&t| t > MAX_TASK) {
            return Err(AssignmentError::TaskOutOfRange { slice: i, task });
        }
        let seen = &mut self.seen;
        seen.clear();
        seen.extend_from_slice(replicas);
        seen.sort_unstable();
        if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
            return Err(AssignmentError::DuplicateReplica { slice: i, task: w[0] });
        }
        if warming.is_empty() {
            return Ok(());
        }
        if warming.len() > MAX_REPLICAS {
            return Err(AssignmentError::TooManyWarming { slice: i, count: warming.len() });
        }
        if let Some(&task) = warming.iter().find(|&&t| t > MAX_TASK) {
            return Err(AssignmentError::TaskOutOfRange { slice: i, task });
        }
        seen.extend_from_slice(warming);
        seen.sort_unstable();
        if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
            return Err(AssignmentError::DuplicateWarming { slice: i, task: w[0] });
        }
        Ok(())
    }
}

/// An assignment read slice by slice, for decoders: each slice is validated as it is
/// pushed, so an invalid one is refused before anything after it is read, and a count
/// or generation that cannot be valid before any is. The errors are the ones
/// [`Assignment::new`] gives for the same slices, in the same order.
///
/// It allocates only what [`reserve`](Self::reserve) asks for and what pushing needs: a
/// decoder reserves what its input can hold (not what it announces) and pushes only
/// valid slices, so the slices never outgrow that room.
///
/// ```
/// use steady_slice::{Assignment, AssignmentBuilder, AssignmentError, Slice, SliceKey};
///
/// let mut b = AssignmentBuilder::new(3, 2)?;
/// b.reserve(2);
/// b.push(Slice::new(SliceKey::MIN, [1]))?;
/// assert_eq!(
///     b.push(Slice::new(SliceKey::MIN, [2])),
///     Err(AssignmentError::NotIncreasing { slice: 1, start: SliceKey::MIN, previous: SliceKey::MIN })
/// );
/// b.push(Slice::new(SliceKey(1 << 63), [2]))?;
/// assert_eq!(b.finish()?, Assignment::new(3, vec![
///     Slice::new(SliceKey::MIN, [1]),
///     Slice::new(SliceKey(1 << 63), [2]),
/// ])?);
/// # Ok::<(), AssignmentError>(())
/// ```
#[derive(Debug)]
pub struct AssignmentBuilder {
    generation: u64,
    slices: Vec<Slice>,
    check: Check,
}

impl AssignmentBuilder {
    /// An assignment of `generation` whose input announces `count` slices. Nothing is
    /// reserved.
    ///
    /// # Errors
    ///
    /// What [`Assignment::new`] finds first about the generation and the count:
    /// [`AssignmentError::ZeroGeneration`], [`AssignmentError::NoSlices`] (a count of
    /// 0), [`AssignmentError::TooManySlices`].
    pub fn new(generation: u64, count: usize) -> Result<Self, AssignmentError> {
        check_head(generation, count)?;
        Ok(Self { generation, slices: Vec::new(), check: Check::default() })
    }

    /// Room for `additional` more slices, reserved exactly (no doubling).
    pub fn reserve(&mut self, additional: usize) {
        self.slices.reserve_exact(additional);
    }

    /// How many slices were pushed.
    pub fn len(&self) -> usize {
        self.slices.len()
    }

    /// Whether none was.
    pub fn is_empty(&self) -> bool {
        self.slices.is_empty()
    }

    /// Validates the next slice and keeps it.
    ///
    /// # Errors
    ///
    /// The slice's first problem, as [`Assignment::new`] names it (the slice is
    /// dropped; pushing more after an error is allowed but pointless), or
    /// [`AssignmentError::TooManySlices`] for a slice beyond [`MAX_SLICES`].
    pub fn push(&mut self, slice: Slice) -> Result<(), AssignmentError> {
        let i = self.slices.len();
        if i == MAX_SLICES {
            return Err(AssignmentError::TooManySlices { count: i + 1 });
        }
        self.check.slice(i, &slice, self.slices.last())?;
        self.slices.push(slice);
        Ok(())
    }

    /// The assignment of the slices pushed.
    ///
    /// # Errors
    ///
    /// [`AssignmentError::NoSlices`] if none was.
    pub fn finish(self) -> Result<Assignment, AssignmentError> {
        if self.slices.is_empty() {
            return Err(AssignmentError::NoSlices);
        }
        Ok(Assignment { generation: self.generation, slices: self.slices })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(start: u64, replicas: &[u32]) -> Slice {
        Slice::new(SliceKey(start), replicas)
    }

    fn warm(start: u64, replicas: &[u32], warming: &[u32]) -> Slice {
        slice(start, replicas).with_warming(warming)
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

    /// An assignment pushed slice by slice, as decoders build one.
    fn built(generation: u64, slices: Vec<Slice>) -> Result<Assignment, AssignmentError> {
        let mut b = AssignmentBuilder::new(generation, slices.len())?;
        b.reserve(slices.len());
        for slice in slices {
            b.push(slice)?;
        }
        b.finish()
    }

    #[test]
    fn the_builder_names_the_problem_new_names() {
        let many: Vec<u32> = (0..=MAX_REPLICAS as u32).collect();
        let warming: Vec<u32> = (10..=10 + MAX_REPLICAS as u32).collect();
        let cases = [
            (0, vec![slice(0, &[1])]),
            (1, vec![]),
            (1, vec![slice(5, &[1])]),
            (1, vec![slice(0, &[1]), slice(9, &[2]), slice(9, &[3])]),
            (1, vec![slice(0, &[1]), slice(9, &[2]), slice(3, &[3])]),
            (1, vec![slice(0, &[1]), slice(4, &[])]),
            (1, vec![slice(0, &[1, 7, 1])]),
            (1, vec![slice(0, &[1]), slice(4, &[MAX_TASK + 1])]),
            (1, vec![slice(0, &many)]),
            (1, vec![warm(0, &[1], &[2, 2])]),
            (1, vec![warm(0, &[1], &[1])]),
            (1, vec![slice(0, &[1]), warm(7, &[1], &[MAX_TASK + 1])]),
            (1, vec![warm(0, &[1], &warming)]),
            (1, vec![warm(0, &[1], &warming[1..])]),
            (9, vec![warm(0, &[3, 1], &[2]), slice(7, &[2]), warm(8, &[1], &[4, 5])]),
        ];
        for (generation, slices) in cases {
            let expected = Assignment::new(generation, slices.clone());
            assert_eq!(built(generation, slices.clone()), expected, "{generation} {slices:?}");
        }
        assert!(built(9, vec![slice(0, &[1]), slice(7, &[2])]).is_ok());
        // A count beyond the limit is refused before any slice is read.
        assert_eq!(
            AssignmentBuilder::new(1, MAX_SLICES + 1).err(),
            Some(AssignmentError::TooManySlices { count: MAX_SLICES + 1 })
        );
        // The count announced is not binding, but nothing beyond the limit is kept,
        // and an empty one is no assignment.
        let mut b = AssignmentBuilder::new(1, 1).unwrap();
        assert!(b.is_empty());
        b.push(slice(0, &[1])).unwrap();
        b.push(slice(1, &[1])).unwrap();
        assert_eq!(b.len(), 2);
        assert_eq!(AssignmentBuilder::new(1, 1).unwrap().finish(), Err(AssignmentError::NoSlices));
    }

    #[test]
    fn lookup_finds_the_slice_whose_range_holds_the_key() {
        let a = Assignment::new(3, vec![slice(0, &[1]), slice(100, &[2]), slice(u64::MAX, &[3])]).unwrap();
        assert_eq!(a.slice_index(SliceKey(0)), 0);
        assert_eq!(a.slice_index(SliceKey(99)), 0);
        assert_eq!(a.slice_index(SliceKey(100)), 1);
        assert_eq!(a.slice_index(SliceKey(u64::MAX - 1)), 1);
        assert_eq!(a.slice_index(SliceKey(u64::MAX)), 2);
        assert_eq!(a.slice_for(SliceKey(150)).replicas(), [2]);
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
