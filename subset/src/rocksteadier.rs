//! Rocksteadier subsetting: shuffled lots of backends, read in Ringsteady column order.

use crate::hash::hash_pair;
use crate::lot_table::{LotColumns, LotConfig, Reading, DEFAULT_LOT_SIZE};
use crate::prng::SplitMix64;
use crate::ring::{position, RingOrder};
use crate::{check_backends, PreferenceOrder, SubsetError, Subsetting};

/// The starting-row permutation the article publishes for lots of 10:
/// frontend `i` of a frontend lot starts reading at row `ARTICLE_ROW_PERMUTATION[i]`.
///
/// (The ring order of `0..10` is `[0, 8, 4, 2, 6, 1, 9, 5, 3, 7]`; the article prints
/// `2` and `4` the other way round. We keep the published permutation.)
pub const ARTICLE_ROW_PERMUTATION: [usize; 10] = [0, 8, 2, 4, 6, 1, 9, 5, 3, 7];

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
/// Ringsteady's, diversity far higher. One frontend costs `O(log N + k × L)` time and
/// `O(k × L)` memory (`L` is a small constant): only the lots it reads are shuffled.
///
/// It is not the crate's default: [`crate::Algorithm::default`] is
/// [`crate::DecimalRocksteadier`], which balances round-sized fleets exactly. A fleet pins
/// this one with `Algorithm::Rocksteadier(Rocksteadier::default())` (the name
/// `rocksteadier`); its order stays frozen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rocksteadier {
    config: LotConfig,
}

impl Default for Rocksteadier {
    fn default() -> Self {
        Self::with_lot_size(DEFAULT_LOT_SIZE).expect("the default lot size is valid")
    }
}

impl Rocksteadier {
    /// Rocksteadier with lots of `lot_size`, and the default row permutation for it.
    ///
    /// # Errors
    ///
    /// [`SubsetError::InvalidLotSize`] unless `1 <= lot_size <= MAX_LOT_SIZE` ([`crate::MAX_LOT_SIZE`]).
    pub fn with_lot_size(lot_size: usize) -> Result<Self, SubsetError> {
        Ok(Self { config: LotConfig::new(lot_size, &ARTICLE_ROW_PERMUTATION)? })
    }

    /// Replaces the starting-row permutation: frontend `i` of a lot starts at row `rows[i]`.
    ///
    /// # Errors
    ///
    /// [`SubsetError::InvalidRowPermutation`] unless `rows` is a permutation of `0..lot_size`.
    pub fn with_row_permutation(mut self, rows: Vec<usize>) -> Result<Self, SubsetError> {
        let lot_size = self.config.lot_size;
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
        self.config.rows = rows;
        Ok(self)
    }

    /// Sets the fleet-wide salt of the lot shuffles (default 0). Every frontend of a
    /// fleet must use the same value; different backend jobs may use different ones.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.config.seed = seed;
        self
    }

    /// The lot size `L`.
    pub fn lot_size(&self) -> usize {
        self.config.lot_size
    }

    /// The starting-row permutation.
    pub fn row_permutation(&self) -> &[usize] {
        &self.config.rows
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
        check_backends(backends)?;
        out.clear();
        out.extend(self.order_reserving(frontend, backends, size).take(size));
        Ok(())
    }
}

impl PreferenceOrder for Rocksteadier {
    type Order = RocksteadierOrder;

    fn order(&self, frontend: usize, backends: usize) -> Result<RocksteadierOrder, SubsetError> {
        check_backends(backends)?;
        Ok(self.order_reserving(frontend, backends, 0))
    }
}

impl Rocksteadier {
    /// The order, with room for the columns that the first `expected` entries need.
    fn order_reserving(&self, frontend: usize, backends: usize, expected: usize) -> RocksteadierOrder {
        let LotConfig { lot_size, ref rows, seed } = self.config;
        let frontend_lot = (frontend / lot_size) as u64;
        let lots = backends.div_ceil(lot_size);
        // The first row yields one task per column (the last lot's cell may be padding).
        let columns = lots.min(expected.saturating_add(1));
        RocksteadierOrder {
            reading: Reading::new(backends, lot_size, rows[frontend % lot_size]),
            table: ShuffledLots {
                lot_size,
                lot_seed: hash_pair(seed, frontend_lot),
                unread_lots: RingOrder::from_position(lots as u64, position(frontend_lot)),
                columns: Vec::with_capacity(columns),
                cells: Vec::with_capacity(columns * lot_size),
            },
        }
    }
}

/// One column of a frontend lot's table: a backend lot and the state of its shuffle.
#[derive(Debug, Clone)]
struct Column {
    /// The backend lot.
    lot: usize,
    /// The generator of this lot's shuffle, after `steps` Fisher–Yates steps.
    rng: SplitMix64,
    /// Fisher–Yates steps done: rows `0..steps` hold their final values.
    steps: usize,
}

/// A frontend's Rocksteadier preference order; see [`Rocksteadier`].
///
/// Lazy: a column is set up when the reading first reaches it, and its lot is shuffled
/// only as far as the rows read so far need (forward Fisher–Yates fixes row `r` at step
/// `r`), so taking `k` entries from a large job costs `O(log N + k × L)` time.
#[derive(Debug, Clone)]
pub struct RocksteadierOrder {
    reading: Reading,
    table: ShuffledLots,
}

/// A frontend lot's table of shuffled lots, set up column by column as it is read.
#[derive(Debug, Clone)]
struct ShuffledLots {
    lot_size: usize,
    /// `hash_pair(seed, f)`: lot `b`'s shuffle is seeded with `hash_pair(lot_seed, b)`.
    lot_seed: u64,
    /// The lots of the columns not yet reached, in column order (only during the first row).
    unread_lots: RingOrder,
    /// The columns reached so far, in column order.
    columns: Vec<Column>,
    /// `lot_size` cells per reached column: the slot offsets, shuffled as far as `steps`.
    cells: Vec<u32>,
}

impl LotColumns for ShuffledLots {
    fn reached(&self) -> usize {
        self.columns.len()
    }

    fn reach_next_column(&mut self) -> bool {
        let Some(lot) = self.unread_lots.next() else {
            return false;
        };
        self.cells.extend(0..self.lot_size as u32);
        let rng = SplitMix64::new(hash_pair(self.lot_seed, lot));
        self.columns.push(Column { lot: lot as usize, rng, steps: 0 });
        true
    }

    /// The task in `row` of column `c`, running that lot's shuffle as far as needed.
    ///
    /// The steps are exactly those of [`crate::prng::shuffle`], so the table is the one
    /// the specification describes whatever order the cells are read in.
    #[inline]
    fn cell(&mut self, c: usize, row: usize) -> usize {
        let lot_size = self.lot_size;
        let column = &mut self.columns[c];
        let cells = &mut self.cells[c * lot_size..(c + 1) * lot_size];
        let needed = (row + 1).min(lot_size - 1);
        if column.steps < needed {
            // Work on locals so the generator state stays in a register.
            let mut rng = column.rng.clone();
            for i in column.steps..needed {
                let j = i + rng.below((lot_size - i) as u64) as usize;
                cells.swap(i, j);
            }
            column.rng = rng;
            column.steps = needed;
        }
        column.lot * lot_size + cells[row] as usize
    }
}

impl Iterator for RocksteadierOrder {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        self.reading.next_task(&mut self.table)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let remaining = self.reading.remaining();
        (remaining, Some(remaining))
    }
}

impl ExactSizeIterator for RocksteadierOrder {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lot_table::MAX_LOT_SIZE;
    use crate::prng::shuffle;

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
    fn lazy_shuffles_build_the_specified_table() {
        // The lazy reading must equal reading a table built with whole shuffles.
        for lot_size in [1usize, 2, 3, 10, 13] {
            let r = Rocksteadier::with_lot_size(lot_size).unwrap().with_seed(5);
            for backends in [0usize, 1, 9, 10, 11, 57, 130] {
                for frontend in [0usize, 1, 7, 12, 25, 99] {
                    let got: Vec<usize> = r.order(frontend, backends).unwrap().collect();
                    assert_eq!(
                        got,
                        eager_order(&r, frontend, backends),
                        "L={lot_size} N={backends} m={frontend}"
                    );
                }
            }
        }
    }

    /// The specification, step by step, with eager shuffles.
    fn eager_order(r: &Rocksteadier, frontend: usize, backends: usize) -> Vec<usize> {
        let l = r.lot_size();
        let f = frontend / l;
        let lots = backends.div_ceil(l) as u64;
        let columns: Vec<usize> =
            RingOrder::from_position(lots, position(f as u64)).map(|b| b as usize).collect();
        let table: Vec<Vec<usize>> = columns
            .iter()
            .map(|&b| {
                let mut p: Vec<usize> = (0..l).collect();
                shuffle(&mut p, &mut SplitMix64::new(hash_pair(hash_pair(5, f as u64), b as u64)));
                p.into_iter().map(|o| b * l + o).collect()
            })
            .collect();
        let start = r.row_permutation()[frontend % l];
        (0..l)
            .flat_map(|i| {
                let row = (start + i) % l;
                table.iter().map(move |col| col[row])
            })
            .filter(|&t| t < backends)
            .collect()
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
