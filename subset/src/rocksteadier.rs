//! Rocksteadier subsetting: shuffled lots of backends, read in Ringsteady column order.

use crate::hash::hash_pair;
use crate::prng::{shuffle, SplitMix64};
use crate::ring::{position, RingOrder};
use crate::{check_backends, take_prefix, PreferenceOrder, SubsetError, Subsetting};

/// The starting-row permutation the article publishes for lots of 10:
/// frontend `i` of a frontend lot starts reading at row `ARTICLE_ROW_PERMUTATION[i]`.
///
/// (The ring order of `0..10` is `[0, 8, 4, 2, 6, 1, 9, 5, 3, 7]`; the article prints
/// `2` and `4` the other way round. We keep the published permutation.)
pub const ARTICLE_ROW_PERMUTATION: [usize; 10] = [0, 8, 2, 4, 6, 1, 9, 5, 3, 7];

/// The default lot size, `L = 10`.
pub const DEFAULT_LOT_SIZE: usize = 10;

/// The largest lot size accepted: larger lots only add imbalance.
pub const MAX_LOT_SIZE: usize = 1 << 16;

/// Rocksteadier subsetting (Google's default since 2022), as this crate specifies it.
///
/// Backends are grouped into *lots* of `L` (default 10) consecutive task numbers, and
/// frontends into lots of `L` too. Each frontend lot shuffles each backend lot its own
/// way, which gives diversity; the lots are visited in a Ringsteady order that depends
/// only on the frontend lot, which spreads frontend lots over backend lots; and the
/// frontends of one lot start on different rows, which spreads them within each lot.
///
/// # Specification (frozen)
///
/// For frontend `m`, backends `N` and lot size `L`:
///
/// 1. Frontend lot `f = m div L`, index in its lot `i = m mod L`. There are
///    `B = ceil(N / L)` backend lots; lot `b` holds the slots `b×L .. b×L + L`, and slots
///    `>= N` are padding.
/// 2. The *table* has `L` rows and `B` columns. Column `c` is backend lot `col[c]`, where
///    `col` is the ring order of the lots `0..B` ([`crate::ring`]) starting at the first lot
///    at or after `position(f)` (the van der Corput positions, without backend scaling).
/// 3. Lot `b`'s column holds, from row 0 down, `b×L + p[0], b×L + p[1], ...`, where `p` is
///    `[0, 1, ..., L-1]` shuffled by [`crate::prng::shuffle`] driven by
///    `SplitMix64::new(hash_pair(hash_pair(seed, f), b))`. A lot's shuffle depends on
///    `(seed, f, b)` alone, so adding lots never reorders existing ones.
/// 4. Frontend `m` reads the table row by row, starting at row `rows[i]` and column 0,
///    moving to the next row (wrapping from row `L-1` to row 0) at the end of each row,
///    and skipping padding. That reading is its preference order; the subset of size
///    `k` is its first `k` entries.
///
/// `rows` is [`ARTICLE_ROW_PERMUTATION`] for `L = 10` and the ring order of `0..L`
/// otherwise, unless set with [`Rocksteadier::with_row_permutation`].
///
/// Properties: when `N` grows by one, a padding slot becomes real (or a new lot, with
/// one real slot, is inserted into the column order): the reading gains exactly one
/// task, so every subset changes by at most one member. Balance is close to
/// Ringsteady's, diversity far higher. One frontend costs `O(k log N)` time and
/// `O(k × L)` memory: only the lots it reads are shuffled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rocksteadier {
    lot_size: usize,
    rows: Vec<usize>,
    seed: u64,
}

impl Default for Rocksteadier {
    fn default() -> Self {
        Self { lot_size: DEFAULT_LOT_SIZE, rows: ARTICLE_ROW_PERMUTATION.to_vec(), seed: 0 }
    }
}

impl Rocksteadier {
    /// Rocksteadier with lots of `lot_size`, and the default row permutation for it.
    ///
    /// # Errors
    ///
    /// [`SubsetError::InvalidLotSize`] unless `1 <= lot_size <= MAX_LOT_SIZE`.
    pub fn with_lot_size(lot_size: usize) -> Result<Self, SubsetError> {
        if !(1..=MAX_LOT_SIZE).contains(&lot_size) {
            return Err(SubsetError::InvalidLotSize { lot_size, max: MAX_LOT_SIZE });
        }
        let rows = if lot_size == DEFAULT_LOT_SIZE {
            ARTICLE_ROW_PERMUTATION.to_vec()
        } else {
            RingOrder::from_rank(lot_size as u64, 0).map(|r| r as usize).collect()
        };
        Ok(Self { lot_size, rows, seed: 0 })
    }

    /// Replaces the starting-row permutation: frontend `i` of a lot starts at row `rows[i]`.
    ///
    /// # Errors
    ///
    /// [`SubsetError::InvalidRowPermutation`] unless `rows` is a permutation of `0..lot_size`.
    pub fn with_row_permutation(mut self, rows: Vec<usize>) -> Result<Self, SubsetError> {
        let lot_size = self.lot_size;
        let invalid = |reason| SubsetError::InvalidRowPermutation { lot_size, reason };
        if rows.len() != lot_size {
            return Err(invalid("its length is not the lot size"));
        }
        let mut seen = vec![false; lot_size];
        for &r in &rows {
            if r >= lot_size {
                return Err(invalid("an entry is not below the lot size"));
            }
            if std::mem::replace(&mut seen[r], true) {
                return Err(invalid("an entry appears twice"));
            }
        }
        self.rows = rows;
        Ok(self)
    }

    /// Sets the fleet-wide salt of the lot shuffles (default 0). Every frontend of a
    /// fleet must use the same value; different backend jobs may use different ones.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// The lot size `L`.
    pub fn lot_size(&self) -> usize {
        self.lot_size
    }

    /// The starting-row permutation.
    pub fn row_permutation(&self) -> &[usize] {
        &self.rows
    }
}

impl Subsetting for Rocksteadier {
    fn name(&self) -> &'static str {
        "rocksteadier"
    }

    fn subset_into(
        &self,
        frontend: usize,
        backends: usize,
        size: usize,
        out: &mut Vec<usize>,
    ) -> Result<(), SubsetError> {
        take_prefix(self, frontend, backends, size, out)
    }
}

impl PreferenceOrder for Rocksteadier {
    type Order = RocksteadierOrder;

    fn order(&self, frontend: usize, backends: usize) -> Result<RocksteadierOrder, SubsetError> {
        check_backends(backends)?;
        let lot_size = self.lot_size;
        let frontend_lot = (frontend / lot_size) as u64;
        let lots = backends.div_ceil(lot_size) as u64;
        Ok(RocksteadierOrder {
            backends,
            lot_size,
            lot_seed: hash_pair(self.seed, frontend_lot),
            unread_lots: RingOrder::from_position(lots, position(frontend_lot)),
            column_lots: Vec::new(),
            column_rows: Vec::new(),
            row: self.rows[frontend % lot_size],
            column: 0,
            remaining: backends,
        })
    }
}

/// A frontend's Rocksteadier preference order; see [`Rocksteadier`].
///
/// Lazy: a backend lot is shuffled when the reading first reaches its column, so
/// taking `k` entries from a large job costs `O(k log N)`.
#[derive(Debug, Clone)]
pub struct RocksteadierOrder {
    backends: usize,
    lot_size: usize,
    /// `hash_pair(seed, f)`: the lot shuffles are seeded from this and the lot number.
    lot_seed: u64,
    /// The columns not yet reached, in column order (only during the first row).
    unread_lots: RingOrder,
    /// The lots of the columns reached so far, in column order.
    column_lots: Vec<usize>,
    /// The shuffled slot offsets of each reached column, `lot_size` per column.
    column_rows: Vec<u32>,
    /// The row being read.
    row: usize,
    /// The next column to read in that row.
    column: usize,
    /// Backends not yet yielded.
    remaining: usize,
}

impl RocksteadierOrder {
    /// Reaches the next column of the first row: records its lot and shuffles it.
    /// Returns false at the end of the first row.
    fn reach_next_column(&mut self) -> bool {
        let Some(lot) = self.unread_lots.next() else {
            return false;
        };
        let start = self.column_rows.len();
        self.column_rows.extend(0..self.lot_size as u32);
        let mut rng = SplitMix64::new(hash_pair(self.lot_seed, lot));
        shuffle(&mut self.column_rows[start..], &mut rng);
        self.column_lots.push(lot as usize);
        true
    }
}

impl Iterator for RocksteadierOrder {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        // Each pass of the loop reads one cell; a real task is at most one full
        // table (L × B cells) ahead while `remaining > 0`, so the loop ends.
        while self.remaining > 0 {
            if self.column == self.column_lots.len() && !self.reach_next_column() {
                // End of a row: wrap to the next one.
                self.column = 0;
                self.row = (self.row + 1) % self.lot_size;
                continue;
            }
            let lot = self.column_lots[self.column];
            let offset = self.column_rows[self.column * self.lot_size + self.row] as usize;
            self.column += 1;
            let task = lot * self.lot_size + offset;
            if task < self.backends {
                self.remaining -= 1;
                return Some(task);
            }
        }
        None
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

impl ExactSizeIterator for RocksteadierOrder {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_lots_of_ten_with_the_articles_rows() {
        let r = Rocksteadier::default();
        assert_eq!(r.lot_size(), 10);
        assert_eq!(r.row_permutation(), ARTICLE_ROW_PERMUTATION);
        assert_eq!(Rocksteadier::with_lot_size(10).unwrap(), r);
    }

    #[test]
    fn bad_configuration_is_a_typed_error() {
        assert!(matches!(Rocksteadier::with_lot_size(0), Err(SubsetError::InvalidLotSize { .. })));
        assert!(matches!(
            Rocksteadier::with_lot_size(MAX_LOT_SIZE + 1),
            Err(SubsetError::InvalidLotSize { .. })
        ));
        let r = Rocksteadier::with_lot_size(3).unwrap();
        for bad in [vec![0, 1], vec![0, 1, 3], vec![0, 1, 1]] {
            assert!(matches!(
                r.clone().with_row_permutation(bad),
                Err(SubsetError::InvalidRowPermutation { .. })
            ));
        }
        assert!(r.with_row_permutation(vec![2, 0, 1]).is_ok());
    }

    #[test]
    fn first_row_reads_one_task_per_lot_in_ringsteady_column_order() {
        // Frontend lot 1 with six backend lots reads the lots in the order [1, 5, 3, 0, 4, 2].
        let r = Rocksteadier::default();
        let first_row: Vec<usize> = r.order(10, 60).unwrap().take(6).map(|b| b / 10).collect();
        assert_eq!(first_row, [1, 5, 3, 0, 4, 2]);
    }

    #[test]
    fn frontends_of_one_lot_read_different_rows_of_the_same_table() {
        // With k = B, frontend i of a lot takes exactly row rows[i] of its lot's table,
        // so the ten frontends of a lot together cover every backend once.
        let r = Rocksteadier::default();
        let mut all: Vec<usize> = (10..20).flat_map(|m| r.subset(m, 60, 6).unwrap()).collect();
        all.sort_unstable();
        assert_eq!(all, (0..60).collect::<Vec<_>>());
    }

    #[test]
    fn padding_is_skipped() {
        let r = Rocksteadier::default();
        for m in 0..30 {
            let mut order: Vec<usize> = r.order(m, 55).unwrap().collect();
            order.sort_unstable();
            assert_eq!(order, (0..55).collect::<Vec<_>>());
        }
    }
}
