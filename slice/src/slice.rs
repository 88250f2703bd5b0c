//! [`Slice`]: a start key and the tasks that serve (and are warming up to serve) its keys.

use std::fmt;
use std::hash::{Hash, Hasher};

use crate::key::SliceKey;

/// How many tasks (replicas and warming tasks together) a slice holds in place, without
/// a heap allocation of its own: the most that fit in the 24 bytes a boxed slice and its
/// replica count take anyway.
const INLINE: usize = 5;

/// One slice: the keys from `start` up to the next slice's start (or the end of the key
/// space), served by its [`replicas`](Slice::replicas) (backend task indices, in no
/// particular order), and being handed to its [`warming`](Slice::warming) tasks.
///
/// A *warming* task is about to serve the slice (the first step of a handover): clients
/// send it nothing for the slice, and its Slicelet announces the slice so the
/// application can load state before the switch makes it a replica. Most slices have
/// none; they are left out of every encoding then, so assignments without warming tasks
/// encode exactly as before warming existed.
///
/// # Footprint
///
/// 32 bytes (asserted by a test), and no allocation of its own when it has at most five
/// tasks, replicas and warming tasks together (the common case: a few replicas, rarely a
/// warming task); more live in one boxed slice of exactly their size. An assignment of
/// [`MAX_SLICES`](crate::MAX_SLICES) slices of up to five tasks therefore takes 32 MiB,
/// whatever its warming tasks. Equality and hashing compare the start, the replicas and
/// the warming tasks, never how they are stored.
///
/// # Validity
///
/// A `Slice` is any start and any tasks: [`Assignment::new`](crate::Assignment::new)
/// (or an [`AssignmentBuilder`](crate::AssignmentBuilder)) checks them (not empty, no
/// duplicates, no task both serving and warming, limits).
///
/// ```
/// use steady_slice::{Slice, SliceKey};
///
/// let s = Slice::new(SliceKey(1 << 63), [3, 1]).with_warming([7]);
/// assert_eq!(s.replicas(), [3, 1]);
/// assert_eq!(s.warming(), [7]);
/// assert_eq!(s.tasks(), [3, 1, 7]);
/// assert_eq!(s, Slice::from_tasks(SliceKey(1 << 63), vec![3, 1, 7], 2));
/// ```
#[derive(Clone)]
pub struct Slice {
    /// The first key of the slice.
    pub start: SliceKey,
    tasks: Tasks,
}

/// The replicas, then the warming tasks, of a slice.
#[derive(Clone)]
enum Tasks {
    /// Up to [`INLINE`] tasks, in place; the rest of `tasks` is zero.
    Inline { replicas: u8, len: u8, tasks: [u32; INLINE] },
    /// More, in a box of exactly their size.
    Heap { replicas: u32, tasks: Box<[u32]> },
}

impl Tasks {
    fn all(&self) -> &[u32] {
        match self {
            Tasks::Inline { len, tasks, .. } => &tasks[..usize::from(*len)],
            Tasks::Heap { tasks, .. } => tasks,
        }
    }

    fn replicas(&self) -> usize {
        match self {
            Tasks::Inline { replicas, .. } => usize::from(*replicas),
            Tasks::Heap { replicas, .. } => *replicas as usize,
        }
    }

    /// `replicas` then `warming`, copied.
    fn copied(replicas: &[u32], warming: &[u32]) -> Self {
        let len = replicas.len() + warming.len();
        if len <= INLINE {
            let mut tasks = [0; INLINE];
            tasks[..replicas.len()].copy_from_slice(replicas);
            tasks[replicas.len()..len].copy_from_slice(warming);
            // Both fit in a u8: len <= INLINE.
            Tasks::Inline { replicas: replicas.len() as u8, len: len as u8, tasks }
        } else {
            let mut tasks = Vec::with_capacity(len);
            tasks.extend_from_slice(replicas);
            tasks.extend_from_slice(warming);
            Tasks::Heap { replicas: replica_count(replicas.len()), tasks: tasks.into_boxed_slice() }
        }
    }
}

/// A replica count as [`Tasks::Heap`] keeps it.
///
/// # Panics
///
/// Above `u32::MAX` (16 GiB of task indices: no input gets there, and validation
/// refuses anything above `MAX_REPLICAS` anyway).
fn replica_count(replicas: usize) -> u32 {
    u32::try_from(replicas).expect("a slice has at most u32::MAX replicas")
}

impl Slice {
    /// A slice from `start` served by `replicas`, with no warming task.
    ///
    /// # Panics
    ///
    /// With more than `u32::MAX` replicas.
    pub fn new(start: SliceKey, replicas: impl AsRef<[u32]>) -> Self {
        Self { start, tasks: Tasks::copied(replicas.as_ref(), &[]) }
    }

    /// The same slice with `warming` as its warming tasks (instead of any it had).
    pub fn with_warming(self, warming: impl AsRef<[u32]>) -> Self {
        Self { start: self.start, tasks: Tasks::copied(self.replicas(), warming.as_ref()) }
    }

    /// A slice from `start` whose first `replicas` `tasks` are its replicas and the rest
    /// its warming tasks: the form a decoder reads them in. Up to five tasks are copied
    /// in place and `tasks` is freed; more keep `tasks`' allocation (shrunk to fit when
    /// it has spare capacity), so a decoder that sized it exactly allocates nothing more.
    ///
    /// # Panics
    ///
    /// When `replicas` is above `tasks.len()` or `u32::MAX`.
    pub fn from_tasks(start: SliceKey, tasks: Vec<u32>, replicas: usize) -> Self {
        assert!(replicas <= tasks.len(), "{replicas} replicas among {} tasks", tasks.len());
        let tasks = if tasks.len() <= INLINE {
            Tasks::copied(&tasks[..replicas], &tasks[replicas..])
        } else {
            Tasks::Heap { replicas: replica_count(replicas), tasks: tasks.into_boxed_slice() }
        };
        Self { start, tasks }
    }

    /// The backend tasks that serve the slice. A valid slice has at least one, and no
    /// duplicates.
    #[inline]
    pub fn replicas(&self) -> &[u32] {
        &self.tasks.all()[..self.tasks.replicas()]
    }

    /// The tasks warming up to serve the slice: usually none. In a valid slice, no
    /// duplicates and none of them a replica.
    #[inline]
    pub fn warming(&self) -> &[u32] {
        &self.tasks.all()[self.tasks.replicas()..]
    }

    /// The replicas, then the warming tasks: every task the slice names.
    #[inline]
    pub fn tasks(&self) -> &[u32] {
        self.tasks.all()
    }
}

impl PartialEq for Slice {
    fn eq(&self, other: &Self) -> bool {
        self.start == other.start && self.replicas() == other.replicas() && self.warming() == other.warming()
    }
}

impl Eq for Slice {}

impl Hash for Slice {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.start.hash(state);
        self.replicas().hash(state);
        self.warming().hash(state);
    }
}

impl fmt::Debug for Slice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Slice")
            .field("start", &self.start)
            .field("replicas", &self.replicas())
            .field("warming", &self.warming())
            .finish()
    }
}

/// JSON: `{"start": 0, "replicas": [1, 2]}`, with `"warming": [...]` only when there are
/// warming tasks (read as none when absent).
#[cfg(feature = "serde")]
mod json {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::Slice;
    use crate::key::SliceKey;

    #[derive(Serialize)]
    struct Out<'a> {
        start: SliceKey,
        replicas: &'a [u32],
        #[serde(skip_serializing_if = "<[u32]>::is_empty")]
        warming: &'a [u32],
    }

    #[derive(Deserialize)]
    struct In {
        start: SliceKey,
        replicas: Vec<u32>,
        #[serde(default)]
        warming: Vec<u32>,
    }

    impl Serialize for Slice {
        fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            Out { start: self.start, replicas: self.replicas(), warming: self.warming() }
                .serialize(serializer)
        }
    }

    impl<'de> Deserialize<'de> for Slice {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            let In { start, replicas, warming } = In::deserialize(deserializer)?;
            Ok(Slice::new(start, replicas).with_warming(warming))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::hash_map::DefaultHasher;

    use super::*;

    fn hash(s: &Slice) -> u64 {
        let mut h = DefaultHasher::new();
        s.hash(&mut h);
        h.finish()
    }

    /// The common case costs what it did before warming tasks existed (32 bytes: a start
    /// and a `Vec<u32>`), not the 56 bytes of a start and two `Vec<u32>`s.
    #[test]
    fn a_slice_takes_32_bytes() {
        assert!(std::mem::size_of::<Slice>() <= 32, "{} bytes", std::mem::size_of::<Slice>());
    }

    #[test]
    fn replicas_and_warming_read_back_however_they_are_stored() {
        let key = SliceKey(9);
        for r in 0..8u32 {
            for w in 0..8u32 {
                let replicas: Vec<u32> = (0..r).collect();
                let warming: Vec<u32> = (100..100 + w).collect();
                let all = [&replicas[..], &warming[..]].concat();
                let built = Slice::new(key, &replicas).with_warming(&warming);
                let read = Slice::from_tasks(key, all.clone(), r as usize);
                let mut roomy = Vec::with_capacity(64);
                roomy.extend_from_slice(&all);
                let spare = Slice::from_tasks(key, roomy, r as usize);
                for s in [&built, &read, &spare] {
                    assert_eq!(s.replicas(), replicas);
                    assert_eq!(s.warming(), warming);
                    assert_eq!(s.tasks(), all);
                }
                assert_eq!(built, read);
                assert_eq!(hash(&built), hash(&read));
                assert_eq!(built.clone(), built);
            }
        }
        // The split between replicas and warming tasks is part of the value.
        let a = Slice::from_tasks(key, vec![1, 2], 1);
        let b = Slice::from_tasks(key, vec![1, 2], 2);
        assert_ne!(a, b);
        assert_ne!(hash(&a), hash(&b));
        assert_ne!(Slice::new(SliceKey(1), [1]), Slice::new(SliceKey(2), [1]));
        // with_warming replaces, it does not add.
        assert_eq!(Slice::new(key, [1]).with_warming([2, 3]).with_warming([4]).warming(), [4]);
        assert_eq!(
            format!("{:?}", Slice::new(key, [1]).with_warming([2])),
            "Slice { start: SliceKey(9), replicas: [1], warming: [2] }"
        );
    }

    #[test]
    #[should_panic(expected = "3 replicas among 2 tasks")]
    fn from_tasks_refuses_more_replicas_than_tasks() {
        let _ = Slice::from_tasks(SliceKey(0), vec![1, 2], 3);
    }
}
