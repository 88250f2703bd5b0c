//! Decimal Rocksteadier: Rocksteadier's lots on the decimal van der Corput ring, with the
//! padding of a partly filled lot spread over its rows.

use crate::decimal_ring::DecimalRingOrder;
use crate::hash::hash_pair;
use crate::lot_table::{LotColumns, LotConfig, Reading, DEFAULT_LOT_SIZE};
use crate::prng::SplitMix64;
use crate::ring;
use crate::{check_backends, PreferenceOrder, SubsetError, Subsetting};

/// The starting rows for lots of 10: frontend `i` of a frontend lot starts at row
/// `DECIMAL_ROW_PERMUTATION[i]`.
///
/// It is a mixed-radix (2, 5) van der Corput order of the ten rows: `i` even starts at
/// row `3 × (i / 2) mod 5`, `i` odd five rows further, so the first two frontends of a
/// lot start half a lot apart and every later one between rows already taken.
pub const DECIMAL_ROW_PERMUTATION: [usize; 10] = [0, 5, 3, 8, 1, 6, 4, 9, 2, 7];

/// The ring order of `0..10` ([`crate::ring`]), for the default lot size's fast path.
const RING_OF_TEN: [usize; 10] = [0, 8, 4, 2, 6, 1, 9, 5, 3, 7];

/// Decimal Rocksteadier subsetting: [`crate::Rocksteadier`] on the decimal van der Corput
/// ring ([`crate::decimal_ring`]) instead of the binary one, with its lots' padding spread
/// over their rows. It keeps the original's churn, order and spread, and balances better;
/// only very dense fleets lose a little diversity (below).
///
/// Rocksteadier places backend lots on the binary ring, where the first `2^j` positions
/// are evenly spaced. Fleets are sized in round decimal numbers, though. With 50 backend
/// lots (500 tasks), the binary positions of the lots are uneven, and the first 5
/// frontend lots start at 0, ½, ¼, ¾ and ⅛ of the ring instead of at fifths. At
/// `M = 50`, `N = 500`, `k = 10` their windows of 10 lots overlap, and some backends carry
/// 2 connections where 1 is possible (utilisation 0.5). On the decimal ring, the first 5,
/// 10, 50, 100, 500, … positions are exactly the multiples of ⅕, ⅒, …: lots of a round-sized
/// backend job sit evenly spaced, round-sized frontend jobs start their lots evenly spaced
/// among them, and every scenario of the lab's production-like set is balanced exactly.
///
/// The second change: each lot's column is a random rotation or reflection of the ring
/// order of its slots, instead of a random shuffle. The slots of the last, partly filled
/// lot are filled in that order, so its padding lands on rows spread around the lot, and
/// the skipped padding disturbs every frontend of a lot about equally.
///
/// Like Rocksteadier, it has a preference order (subsets nest as `k` grows), subsets that
/// depend on `(m, N, k)` alone (zero frontend churn) and at most one changed member per
/// frontend when `N` changes by one: positions never move, so a new task only inserts a
/// cell (a new lot's column, or a padding cell turning real) into every order. Spread is
/// as good or better. Diversity is the same except in very dense fleets: a rotation has
/// fewer forms than a shuffle, so 5,000 frontends over 50 backends get 4,910 distinct
/// subsets where Rocksteadier gets 5,000 (diversity 0.982). It costs `O(log N + k)` per subset for lots of ten.
/// Its order is a separate frozen contract: switching a fleet between `rocksteadier` and
/// `rocksteadier-decimal` changes most subsets once.
///
/// It is the crate's default ([`crate::Algorithm::default`]) from the first release, so
/// that no fleet has to make that switch later.
///
/// # Specification (frozen)
///
/// For frontend `m`, backends `N` and lot size `L` (default 10):
///
/// 1. Frontend lot `f = m div L`, index in its lot `i = m mod L`. There are
///    `B = ceil(N / L)` backend lots; lot `b` holds the slots `b×L .. b×L + L`, and slots
///    `>= N` are padding.
/// 2. The table has `L` rows and `B` columns. The columns are the lots `0..B` in decimal
///    ring order ([`crate::decimal_ring`]: sorted by `y(b)`), starting at the first lot
///    whose position is at or after `y(f)`, and wrapping to the first lot when none is.
/// 3. Lot `b`'s column: draw `o = g.below(L)` and then `flip = g.below(2)` from
///    `g = SplitMix64::new(hash_pair(hash_pair(seed, f), b))`. Row `r` holds slot
///    `b×L + element_at(L, t)` ([`crate::ring::element_at`]: the binary ring order of
///    `0..L`), where `t = (r − o) mod L`, or `t = (o − r) mod L` when `flip = 1`.
/// 4. Frontend `m` reads the table row by row, starting at row `rows[i]` and column 0,
///    moving to the next row (wrapping from row `L−1` to row 0) at the end of each row,
///    and skipping padding. That reading is its preference order; the subset of size `k`
///    is its first `k` entries.
///
/// `rows` is [`DECIMAL_ROW_PERMUTATION`] for `L = 10` and the binary ring order of `0..L`
/// otherwise.
///
/// # Balance
///
/// With `N` and `M` multiples of `L`, and `N / L` and `M / L` among `1, 5, 10, 50, 100,
/// 500, …`, the lots sit on exact fractions of the ring and the frontend lots start on
/// evenly spaced ones. Whenever their tails (the first `k mod B` columns of each) then
/// tile the backend lots, every backend carries exactly `M × k / N` connections. That holds
/// in all 144 scenarios of the lab's production-like set (`tests/tests/decimal_rocksteadier.rs`
/// checks them). On the article's grid (any `M` and `N`, `k = 20`) its mean utilisation is
/// 0.950 against Rocksteadier's 0.946. Partial frontend lots and padding together cost
/// both algorithms about 5 points there, and no lot design removes that: see
/// `docs/rocksteadier-decimal.md`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecimalRocksteadier {
    config: LotConfig,
}

impl Default for DecimalRocksteadier {
    fn default() -> Self {
        Self::with_lot_size(DEFAULT_LOT_SIZE).expect("the default lot size is valid")
    }
}

impl DecimalRocksteadier {
    /// Decimal Rocksteadier with lots of `lot_size`, and the default row permutation for it.
    ///
    /// # Errors
    ///
    /// [`SubsetError::InvalidLotSize`] unless `1 <= lot_size <= MAX_LOT_SIZE` ([`crate::MAX_LOT_SIZE`]).
    pub fn with_lot_size(lot_size: usize) -> Result<Self, SubsetError> {
        Ok(Self { config: LotConfig::new(lot_size, &DECIMAL_ROW_PERMUTATION)? })
    }

    /// Sets the fleet-wide salt of the lot columns (default 0). Every frontend of a fleet
    /// must use the same value; different backend jobs may use different ones.
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

    /// The order, with room for the columns that the first `expected` entries need.
    fn order_reserving(&self, frontend: usize, backends: usize, expected: usize) -> DecimalRocksteadierOrder {
        let LotConfig { lot_size, ref rows, seed } = self.config;
        let frontend_lot = (frontend / lot_size) as u64;
        let lots = backends.div_ceil(lot_size);
        DecimalRocksteadierOrder {
            reading: Reading::new(backends, lot_size, rows[frontend % lot_size]),
            table: RotatedLots {
                lot_size,
                lot_seed: hash_pair(seed, frontend_lot),
                unread_lots: DecimalRingOrder::from_position_of(lots as u64, frontend_lot),
                // The first row yields one task per column (the last lot's cell may be padding).
                columns: Vec::with_capacity(lots.min(expected.saturating_add(1))),
            },
        }
    }
}

impl Subsetting for DecimalRocksteadier {
    fn name(&self) -> &'static str {
        "rocksteadier-decimal"
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

impl PreferenceOrder for DecimalRocksteadier {
    type Order = DecimalRocksteadierOrder;

    fn order(&self, frontend: usize, backends: usize) -> Result<DecimalRocksteadierOrder, SubsetError> {
        check_backends(backends)?;
        Ok(self.order_reserving(frontend, backends, 0))
    }
}

/// A frontend's decimal Rocksteadier preference order; see [`DecimalRocksteadier`].
///
/// Lazy: a column's lot and rotation are found when the reading first reaches it, so
/// taking `k` entries costs `O(log N + k)` time (`O(log N + k log L)` for lots other than
/// ten) and `O(min(k, B))` memory.
#[derive(Debug, Clone)]
pub struct DecimalRocksteadierOrder {
    reading: Reading,
    table: RotatedLots,
}

/// A frontend lot's table of rotated lots, set up column by column as it is read.
#[derive(Debug, Clone)]
struct RotatedLots {
    lot_size: usize,
    /// `hash_pair(seed, f)`: lot `b`'s column is drawn from `hash_pair(lot_seed, b)`.
    lot_seed: u64,
    /// The lots of the columns not yet reached, in column order (only during the first row).
    unread_lots: DecimalRingOrder,
    /// The columns reached so far, in column order.
    columns: Vec<Column>,
}

/// One column of a frontend lot's table: a backend lot and its rotation.
#[derive(Debug, Clone, Copy)]
struct Column {
    /// The backend lot.
    lot: usize,
    /// `o` of the specification.
    offset: usize,
    /// Whether the ring order runs upwards from row `o`.
    flip: bool,
}

impl LotColumns for RotatedLots {
    fn reached(&self) -> usize {
        self.columns.len()
    }

    fn reach_next_column(&mut self) -> bool {
        let Some(lot) = self.unread_lots.next() else {
            return false;
        };
        let mut g = SplitMix64::new(hash_pair(self.lot_seed, lot));
        let offset = g.below(self.lot_size as u64) as usize;
        let flip = g.below(2) == 1;
        self.columns.push(Column { lot: lot as usize, offset, flip });
        true
    }

    #[inline]
    fn cell(&mut self, c: usize, row: usize) -> usize {
        let Column { lot, offset, flip } = self.columns[c];
        let l = self.lot_size;
        // (row - offset) mod l, or (offset - row) mod l, without a division.
        let (a, b) = if flip { (offset, row) } else { (row, offset) };
        let rank = if a >= b { a - b } else { a + l - b };
        let slot = if l == DEFAULT_LOT_SIZE {
            RING_OF_TEN[rank]
        } else {
            ring::element_at(l as u64, rank as u64) as usize
        };
        lot * l + slot
    }
}

impl Iterator for DecimalRocksteadierOrder {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        self.reading.next_task(&mut self.table)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let remaining = self.reading.remaining();
        (remaining, Some(remaining))
    }
}

impl ExactSizeIterator for DecimalRocksteadierOrder {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lot_table::MAX_LOT_SIZE;
    use crate::ring::RingOrder;

    #[test]
    fn first_row_reads_the_lots_in_decimal_ring_order() {
        let r = DecimalRocksteadier::default();
        // Ten lots sit on the tenths; frontend lot 3 (position 1/5) starts at lot 3, then
        // goes round: 3 (.2), 8 (.3), 1 (.4), 6 (.5), 4 (.6), 9 (.7), 2 (.8), 7 (.9), 0, 5 (.1).
        let first_row: Vec<usize> = r.order(30, 100).unwrap().take(10).map(|b| b / 10).collect();
        assert_eq!(first_row, [3, 8, 1, 6, 4, 9, 2, 7, 0, 5]);
    }

    #[test]
    fn frontends_of_one_lot_read_different_rows_of_the_same_table() {
        let r = DecimalRocksteadier::default();
        let mut all: Vec<usize> = (10..20).flat_map(|m| r.subset(m, 60, 6).unwrap()).collect();
        all.sort_unstable();
        assert_eq!(all, (0..60).collect::<Vec<_>>());
    }

    #[test]
    fn lazy_reading_follows_the_specification() {
        for lot_size in [1usize, 2, 3, 10, 13] {
            let r = DecimalRocksteadier::with_lot_size(lot_size).unwrap().with_seed(5);
            for backends in [0usize, 1, 9, 10, 11, 57, 130] {
                for frontend in [0usize, 1, 7, 12, 25, 99, 1234] {
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

    /// The specification, step by step, with the ring sorted and whole columns built.
    fn eager_order(r: &DecimalRocksteadier, frontend: usize, backends: usize) -> Vec<usize> {
        use crate::decimal_ring::position;
        let l = r.lot_size();
        let f = (frontend / l) as u64;
        let lots = backends.div_ceil(l) as u64;
        let before = |a: u64, b: u64| {
            let ((an, ad), (bn, bd)) = (position(a), position(b));
            an * bd < bn * ad
        };
        let mut ring: Vec<u64> = (0..lots).collect();
        ring.sort_by(
            |&a, &b| if before(a, b) { std::cmp::Ordering::Less } else { std::cmp::Ordering::Greater },
        );
        let start = ring.iter().position(|&b| !before(b, f)).unwrap_or(0);
        let columns: Vec<u64> = ring[start..].iter().chain(&ring[..start]).copied().collect();
        let slots: Vec<usize> = RingOrder::from_rank(l as u64, 0).map(|x| x as usize).collect();
        let table: Vec<Vec<usize>> = columns
            .iter()
            .map(|&b| {
                let mut g = SplitMix64::new(hash_pair(hash_pair(5, f), b));
                let o = g.below(l as u64) as usize;
                let flip = g.below(2) == 1;
                (0..l)
                    .map(|row| {
                        let t = if flip { (o + l - row) % l } else { (row + l - o) % l };
                        b as usize * l + slots[t]
                    })
                    .collect()
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
    fn padding_is_skipped_and_spread_over_the_rows() {
        let r = DecimalRocksteadier::default();
        for m in 0..30 {
            let mut order: Vec<usize> = r.order(m, 55).unwrap().collect();
            order.sort_unstable();
            assert_eq!(order, (0..55).collect::<Vec<_>>());
        }
        // Slot s of a lot sits at row (rank of s in the ring order of 0..10) ± o: the
        // first real slots of a partly filled lot are spread over its rows, whatever
        // the rotation (two slots half a lot apart, four about a quarter apart).
        let ring: Vec<usize> = RingOrder::from_rank(10, 0).map(|x| x as usize).collect();
        let rank_of = |slot: usize| ring.iter().position(|&s| s == slot).unwrap();
        assert_eq!([0, 1].map(rank_of), [0, 5]);
        let mut four = [0, 1, 2, 3].map(rank_of);
        four.sort_unstable();
        assert_eq!(four, [0, 3, 5, 8]);
        let r = DecimalRocksteadier::default();
        for m in [0, 10, 20, 70] {
            // N = 52: lot 5 has slots 50 and 51 real, read from rows 5 apart.
            let order: Vec<usize> = r.order(m, 52).unwrap().collect();
            let rows: Vec<usize> = [50, 51]
                .map(|t| {
                    let at = order.iter().position(|&x| x == t).unwrap();
                    // Lot 0 is full and has one task in every row, so its tasks before `at`
                    // count the rows read before it (up to the same offset for both slots).
                    order[..at].iter().filter(|&&x| x / 10 == 0).count()
                })
                .to_vec();
            assert_eq!(rows[0].abs_diff(rows[1]) % 10, 5, "m={m}: {rows:?}");
        }
    }

    #[test]
    fn the_fast_path_is_the_ring_order_of_ten() {
        assert_eq!(RingOrder::from_rank(10, 0).map(|x| x as usize).collect::<Vec<_>>(), RING_OF_TEN);
    }

    #[test]
    fn bad_lot_sizes_are_typed_errors() {
        assert!(matches!(DecimalRocksteadier::with_lot_size(0), Err(SubsetError::InvalidLotSize { .. })));
        assert!(matches!(
            DecimalRocksteadier::with_lot_size(MAX_LOT_SIZE + 1),
            Err(SubsetError::InvalidLotSize { .. })
        ));
        assert_eq!(DecimalRocksteadier::with_lot_size(10).unwrap(), DecimalRocksteadier::default());
    }
}
