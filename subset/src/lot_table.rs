//! What [`crate::Rocksteadier`] and [`crate::DecimalRocksteadier`] share: the lot size,
//! row permutation and seed, and the reading of a frontend lot's table (`L` rows, one
//! column per backend lot) row by row from a frontend's starting row, skipping padding.
//! The two differ only in how they order the columns and fill each one.

use crate::ring::RingOrder;
use crate::SubsetError;

/// The largest lot size accepted: larger lots only add imbalance.
pub const MAX_LOT_SIZE: usize = 1 << 16;

/// The default lot size, `L = 10`.
pub const DEFAULT_LOT_SIZE: usize = 10;

/// Lot size, starting-row permutation and seed of a lot algorithm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LotConfig {
    pub(crate) lot_size: usize,
    pub(crate) rows: Vec<usize>,
    pub(crate) seed: u64,
}

impl LotConfig {
    /// Lots of `lot_size`, starting rows `rows_for_ten` when it is 10 and the binary ring
    /// order of `0..lot_size` otherwise, seed 0.
    ///
    /// # Errors
    ///
    /// [`SubsetError::InvalidLotSize`] unless `1 <= lot_size <= MAX_LOT_SIZE`.
    pub(crate) fn new(
        lot_size: usize,
        rows_for_ten: &[usize; DEFAULT_LOT_SIZE],
    ) -> Result<Self, SubsetError> {
        if !(1..=MAX_LOT_SIZE).contains(&lot_size) {
            return Err(SubsetError::InvalidLotSize { lot_size, max: MAX_LOT_SIZE });
        }
        let rows = if lot_size == DEFAULT_LOT_SIZE {
            rows_for_ten.to_vec()
        } else {
            RingOrder::from_rank(lot_size as u64, 0).map(|r| r as usize).collect()
        };
        Ok(Self { lot_size, rows, seed: 0 })
    }
}

/// The columns of one frontend lot's table, reached lazily in column order.
pub(crate) trait LotColumns {
    /// The columns reached so far.
    fn reached(&self) -> usize;

    /// Reaches the next column of the first row; false at the end of the first row.
    fn reach_next_column(&mut self) -> bool;

    /// The slot in `row` of reached column `c`: a task, or padding when `>= N`.
    fn cell(&mut self, c: usize, row: usize) -> usize;
}

/// Where a frontend's row-by-row reading of its lot table stands.
#[derive(Debug, Clone)]
pub(crate) struct Reading {
    backends: usize,
    lot_size: usize,
    /// The row being read.
    row: usize,
    /// The next column to read in that row.
    column: usize,
    /// Backends not yet yielded.
    remaining: usize,
}

impl Reading {
    /// A reading of `backends` tasks in lots of `lot_size`, from the start of `row`.
    pub(crate) fn new(backends: usize, lot_size: usize, row: usize) -> Self {
        Self { backends, lot_size, row, column: 0, remaining: backends }
    }

    /// The next task of the reading, moving to the next row at the end of each row and
    /// skipping padding.
    #[inline]
    pub(crate) fn next_task(&mut self, columns: &mut impl LotColumns) -> Option<usize> {
        // Each pass reads one cell; a real task is at most one full table (L × B cells)
        // ahead while `remaining > 0`, so the loop ends.
        while self.remaining > 0 {
            if self.column == columns.reached() && !columns.reach_next_column() {
                // End of a row: wrap to the next one.
                self.column = 0;
                self.row = (self.row + 1) % self.lot_size;
                continue;
            }
            let task = columns.cell(self.column, self.row);
            self.column += 1;
            if task < self.backends {
                self.remaining -= 1;
                return Some(task);
            }
        }
        None
    }

    /// Tasks not yet yielded.
    pub(crate) fn remaining(&self) -> usize {
        self.remaining
    }
}
