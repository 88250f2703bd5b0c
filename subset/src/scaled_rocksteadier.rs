//! Scaled Rocksteadier: Rocksteadier's lots, read from a backend-scaled column in plain
//! lot order, with frontend lots placed by a decimal van der Corput sequence.

use crate::hash::hash_pair;
use crate::prng::SplitMix64;
use crate::ring::{element_at, RingOrder};
use crate::rocksteadier::{DEFAULT_LOT_SIZE, MAX_LOT_SIZE};
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

/// Scaled Rocksteadier subsetting: [`crate::Rocksteadier`] with the two changes that make
/// it exact for fleets of round sizes, keeping every property of the original.
///
/// Rocksteadier places frontend lots on backend lots with the *unscaled* van der Corput
/// ring: frontend lot `f` starts its column order at lot position `f.reverse_bits()`,
/// whatever the number of lots. Those positions are even only when the number of lots is
/// a power of two, so the first 5 frontend lots of a 500-task backend job (50 lots) start
/// at lots bunched around 0, ¼ and ½: at `M = 50`, `N = 500`, `k = 10` some backends
/// carry 2 connections where 1 is possible (utilisation 0.5). This variant instead
///
/// * reads the backend lots in plain order `s, s+1, …, B−1, 0, …, s−1` and *scales* the
///   start `s` to the job: `s = round(y(f) × B) mod B`;
/// * takes `y(f)` from the *decimal* van der Corput sequence, whose first 5, 10, 50, 100,
///   500, … entries are exactly the multiples of ⅕, ⅒, 1/50, 1/100, …: fleets of round
///   size (multiples of 10 frontends calling multiples of 10 backends) get lots that
///   split the backends exactly;
/// * spreads the padding of the last, partly filled lot over its rows (each lot's column
///   is a random rotation or reflection of the ring order of its slots, instead of a
///   random shuffle), so the skipped padding disturbs the frontends of a lot evenly.
///
/// It keeps Rocksteadier's properties: a preference order (subsets nest as `k` grows),
/// subsets that depend on `(m, N, k)` alone (zero frontend churn), at most one changed
/// member per frontend when `N` changes by one, the same diversity and spread, and
/// `O(k × L)` cost. Its order is a separate frozen contract: switching a fleet between
/// `rocksteadier` and `rocksteadier-scaled` changes most subsets once.
///
/// # Specification (frozen)
///
/// For frontend `m`, backends `N` and lot size `L` (default 10):
///
/// 1. Frontend lot `f = m div L`, index in its lot `i = m mod L`. There are
///    `B = ceil(N / L)` backend lots; lot `b` holds the slots `b×L .. b×L + L`, and slots
///    `>= N` are padding.
/// 2. The decimal position of `f`: write `f` with mixed-radix digits
///    `f = d₀ + 5·d₁ + 10·d₂ + 50·d₃ + 100·d₄ + …` (radices 5, 2, 5, 2, …, least
///    significant first), map each base-5 digit through `σ(d) = 2d mod 5` (base-2 digits
///    stay), and read the digits after the point, the first most significant:
///    `y(f) = σ(d₀)/5 + d₁/10 + σ(d₂)/50 + d₃/100 + …`. So `y` runs
///    `0, ⅖, ⅘, ⅕, ⅗, ⅒, ½, 9/10, 3/10, 7/10, 2/50, …`.
/// 3. The table has `L` rows and `B` columns. Column `c` is backend lot
///    `(s + c) mod B`, where `s = floor(y(f) × B + ½) mod B`, computed exactly.
/// 4. Lot `b`'s column: draw `o = g.below(L)` and then `flip = g.below(2)` from
///    `g = SplitMix64::new(hash_pair(hash_pair(seed, f), b))`. Row `r` holds slot
///    `b×L + element_at(L, t)` ([`crate::ring::element_at`]: the ring order of `0..L`),
///    where `t = (r − o) mod L`, or `t = (o − r) mod L` when `flip = 1`. The slots
///    `0, 1, 2, …` of a lot (filled in that order as `N` grows) so land on rows spread
///    evenly around the lot.
/// 5. Frontend `m` reads the table row by row, starting at row `rows[i]` and column 0,
///    moving to the next row (wrapping from row `L−1` to row 0) at the end of each row,
///    and skipping padding. That reading is its preference order; the subset of size `k`
///    is its first `k` entries.
///
/// `rows` is [`DECIMAL_ROW_PERMUTATION`] for `L = 10` and the ring order of `0..L`
/// otherwise.
///
/// # Why `N ± 1` changes at most one member
///
/// Within a lot count `B`, a growing `N` turns one padding cell real: one insertion into
/// every order. When `B` grows, the new lot sits between lots `B−1` and `0` of the plain
/// order (an insertion again), and the start `s` either stays or moves on by one lot,
/// because `floor(y × B + ½)` grows by 0 or 1 with `B`. Moving the start on rotates
/// every row of the table by one column: the first lot's cell moves to the end of its
/// row. For any `k`, the rows a frontend reads whole keep their members; only its last,
/// partly read row changes, by the cell that moved out; the inserted task takes the
/// place of the one other member it pushes out. So the subset of every size changes by
/// at most one member, both ways. (Rocksteadier's unscaled ring has no such rotation to
/// absorb: scaling its positions moved two members at some lot boundaries.)
///
/// # Balance
///
/// With `N` a multiple of `L`, `M` a multiple of `L` and `M / L` one of `1, 5, 10, 50,
/// 100, 500, …`, the frontend lots start at evenly spaced backend lots, and every
/// connection count is `ceil(M × k / N)` or one less whenever `B` is a multiple of
/// `M / L` and `B / (M / L)` divides `k mod B` (as in every scenario of the lab's
/// production-like set). On the article's grid (any `M`, `N` at `k = 20`) it balances
/// within a few tenths of a percent of Rocksteadier: partial frontend lots and padding,
/// which cost both about 5 points there, are untouched. See `docs/report.md` for figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScaledRocksteadier {
    lot_size: usize,
    rows: Vec<usize>,
    seed: u64,
}

impl Default for ScaledRocksteadier {
    fn default() -> Self {
        Self { lot_size: DEFAULT_LOT_SIZE, rows: DECIMAL_ROW_PERMUTATION.to_vec(), seed: 0 }
    }
}

impl ScaledRocksteadier {
    /// Scaled Rocksteadier with lots of `lot_size`, and the default row permutation for it.
    ///
    /// # Errors
    ///
    /// [`SubsetError::InvalidLotSize`] unless `1 <= lot_size <= MAX_LOT_SIZE`.
    pub fn with_lot_size(lot_size: usize) -> Result<Self, SubsetError> {
        if !(1..=MAX_LOT_SIZE).contains(&lot_size) {
            return Err(SubsetError::InvalidLotSize { lot_size, max: MAX_LOT_SIZE });
        }
        let rows = if lot_size == DEFAULT_LOT_SIZE {
            DECIMAL_ROW_PERMUTATION.to_vec()
        } else {
            RingOrder::from_rank(lot_size as u64, 0).map(|r| r as usize).collect()
        };
        Ok(Self { lot_size, rows, seed: 0 })
    }

    /// Sets the fleet-wide salt of the lot columns (default 0). Every frontend of a fleet
    /// must use the same value; different backend jobs may use different ones.
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

    fn order_reserving(&self, frontend: usize, backends: usize, expected: usize) -> ScaledRocksteadierOrder {
        let lot_size = self.lot_size;
        let frontend_lot = (frontend / lot_size) as u64;
        let lots = backends.div_ceil(lot_size);
        ScaledRocksteadierOrder {
            backends,
            lot_size,
            lots,
            start_lot: start_lot(frontend_lot, lots as u64) as usize,
            lot_seed: hash_pair(self.seed, frontend_lot),
            columns: Vec::with_capacity(lots.min(expected.saturating_add(1))),
            row: self.rows[frontend % lot_size],
            column: 0,
            remaining: backends,
        }
    }
}

/// `y(f)` of the specification as an exact fraction `(numerator, denominator)`.
///
/// The denominator is a product of the radices used, at most `5 × 10^20` for any `u64`.
fn decimal_position(frontend_lot: u64) -> (u128, u128) {
    let (mut numerator, mut denominator) = (0u128, 1u128);
    let mut rest = frontend_lot;
    let mut digit_index = 0;
    while rest > 0 {
        let radix: u64 = if digit_index % 2 == 0 { 5 } else { 2 };
        let digit = rest % radix;
        rest /= radix;
        let mapped = if radix == 5 { (2 * digit) % 5 } else { digit };
        // Appending a digit after the ones so far: y = Σ d_j / (r_0 … r_j).
        numerator = numerator * u128::from(radix) + u128::from(mapped);
        denominator *= u128::from(radix);
        digit_index += 1;
    }
    (numerator, denominator)
}

/// The first column's lot for frontend lot `frontend_lot` among `lots` backend lots:
/// `floor(y × lots + ½) mod lots` (0 when `lots == 0`).
fn start_lot(frontend_lot: u64, lots: u64) -> u64 {
    if lots == 0 {
        return 0;
    }
    let (numerator, denominator) = decimal_position(frontend_lot);
    // numerator < denominator <= 5e20 < 2^69, so 2 × numerator × lots fits in 128 bits
    // for lots below 2^58, far above MAX_BACKENDS.
    debug_assert!(lots < 1 << 58);
    let rounded = (2 * numerator * u128::from(lots) + denominator) / (2 * denominator);
    (rounded % u128::from(lots)) as u64
}

impl Subsetting for ScaledRocksteadier {
    fn name(&self) -> &'static str {
        "rocksteadier-scaled"
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

impl PreferenceOrder for ScaledRocksteadier {
    type Order = ScaledRocksteadierOrder;

    fn order(&self, frontend: usize, backends: usize) -> Result<ScaledRocksteadierOrder, SubsetError> {
        check_backends(backends)?;
        Ok(self.order_reserving(frontend, backends, 0))
    }
}

/// A frontend's scaled Rocksteadier preference order; see [`ScaledRocksteadier`].
///
/// Lazy: a column's rotation is drawn when the reading first reaches it, so taking `k`
/// entries costs `O(k × log L)` time after an `O(log f)` start, and `O(min(k, B))` memory.
#[derive(Debug, Clone)]
pub struct ScaledRocksteadierOrder {
    backends: usize,
    lot_size: usize,
    lots: usize,
    /// The lot of column 0.
    start_lot: usize,
    /// `hash_pair(seed, f)`: lot `b`'s column is drawn from `hash_pair(lot_seed, b)`.
    lot_seed: u64,
    /// The columns reached so far: `o << 1 | flip`.
    columns: Vec<u32>,
    /// The row being read.
    row: usize,
    /// The next column to read in that row.
    column: usize,
    /// Backends not yet yielded.
    remaining: usize,
}

impl ScaledRocksteadierOrder {
    /// The backend lot of column `c`.
    #[inline]
    fn lot(&self, c: usize) -> usize {
        let lot = self.start_lot + c;
        if lot >= self.lots {
            lot - self.lots
        } else {
            lot
        }
    }

    /// The task in `row` of column `c`, drawing the column's rotation when first reached.
    #[inline]
    fn cell(&mut self, c: usize, row: usize) -> usize {
        let lot = self.lot(c);
        if c == self.columns.len() {
            let mut g = SplitMix64::new(hash_pair(self.lot_seed, lot as u64));
            let offset = g.below(self.lot_size as u64) as u32;
            let flip = g.below(2) as u32;
            self.columns.push(offset << 1 | flip);
        }
        let packed = self.columns[c];
        let (offset, flip) = ((packed >> 1) as usize, packed & 1 == 1);
        let l = self.lot_size;
        // (row - offset) mod l, or (offset - row) mod l, without a division.
        let (a, b) = if flip { (offset, row) } else { (row, offset) };
        let rank = if a >= b { a - b } else { a + l - b };
        let slot = if l == DEFAULT_LOT_SIZE {
            RING_OF_TEN[rank]
        } else {
            element_at(l as u64, rank as u64) as usize
        };
        lot * l + slot
    }
}

impl Iterator for ScaledRocksteadierOrder {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        // Each pass reads one cell; a real task is at most one full table (L × B cells)
        // ahead while `remaining > 0`, so the loop ends.
        while self.remaining > 0 {
            if self.column == self.lots {
                self.column = 0;
                self.row = (self.row + 1) % self.lot_size;
            }
            let task = self.cell(self.column, self.row);
            self.column += 1;
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

impl ExactSizeIterator for ScaledRocksteadierOrder {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_positions_split_round_counts_exactly() {
        let tenths: Vec<u64> = (0..10).map(|f| start_lot(f, 100)).collect();
        assert_eq!(tenths, [0, 40, 80, 20, 60, 10, 50, 90, 30, 70]);
        assert_eq!(decimal_position(10), (2, 50));
        for count in [1u64, 5, 10, 50, 100, 500, 1000] {
            let mut starts: Vec<u64> = (0..count).map(|f| start_lot(f, 10 * count)).collect();
            starts.sort_unstable();
            assert_eq!(starts, (0..count).map(|j| 10 * j).collect::<Vec<_>>(), "{count} lots");
        }
        // The largest frontend lot still has an exact position.
        let (n, d) = decimal_position(u64::MAX);
        assert!(n < d && d <= 5 * 10u128.pow(20));
        assert!(start_lot(u64::MAX, 1 << 24) < 1 << 24);
    }

    #[test]
    fn the_start_moves_on_by_at_most_one_lot_as_lots_are_added() {
        for f in 0..300 {
            for lots in 1..400u64 {
                let (a, b) = (start_lot(f, lots), start_lot(f, lots + 1));
                // In the plain order of the new job: the same lot, the next one, or the
                // new lot itself (inserted just before lot 0).
                assert!(b == a || b == a + 1 || (a == 0 && b == lots), "f={f} B={lots}: {a} -> {b}");
            }
        }
    }

    #[test]
    fn first_row_reads_the_lots_in_plain_order_from_the_scaled_start() {
        let r = ScaledRocksteadier::default();
        // Frontend lot 3 (y = 1/5) with 20 backend lots starts at lot 4.
        let first_row: Vec<usize> = r.order(30, 200).unwrap().take(20).map(|b| b / 10).collect();
        assert_eq!(first_row, (4..20).chain(0..4).collect::<Vec<_>>());
    }

    #[test]
    fn frontends_of_one_lot_read_different_rows_of_the_same_table() {
        let r = ScaledRocksteadier::default();
        let mut all: Vec<usize> = (10..20).flat_map(|m| r.subset(m, 60, 6).unwrap()).collect();
        all.sort_unstable();
        assert_eq!(all, (0..60).collect::<Vec<_>>());
    }

    #[test]
    fn lazy_reading_follows_the_specification() {
        for lot_size in [1usize, 2, 3, 10, 13] {
            let r = ScaledRocksteadier::with_lot_size(lot_size).unwrap().with_seed(5);
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

    /// The specification, step by step, with whole columns built up front.
    fn eager_order(r: &ScaledRocksteadier, frontend: usize, backends: usize) -> Vec<usize> {
        let l = r.lot_size();
        let f = (frontend / l) as u64;
        let lots = backends.div_ceil(l);
        let (y_num, y_den) = decimal_position(f);
        let s =
            if lots == 0 { 0 } else { ((2 * y_num * lots as u128 + y_den) / (2 * y_den)) as usize % lots };
        let ring: Vec<usize> = RingOrder::from_rank(l as u64, 0).map(|x| x as usize).collect();
        let table: Vec<Vec<usize>> = (0..lots)
            .map(|c| {
                let b = (s + c) % lots;
                let mut g = SplitMix64::new(hash_pair(hash_pair(5, f), b as u64));
                let o = g.below(l as u64) as usize;
                let flip = g.below(2) == 1;
                (0..l)
                    .map(|row| {
                        let t = if flip { (o + l - row) % l } else { (row + l - o) % l };
                        b * l + ring[t]
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
        let r = ScaledRocksteadier::default();
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
        let r = ScaledRocksteadier::default();
        for m in [0, 10, 20, 70] {
            // N = 52: lot 5 has slots 50 and 51 real, read from rows 5 apart.
            let order: Vec<usize> = r.order(m, 52).unwrap().collect();
            let rows: Vec<usize> = [50, 51]
                .map(|t| {
                    let at = order.iter().position(|&x| x == t).unwrap();
                    // Rows before `at`: each full row holds 5 full lots' cells plus real padding.
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
        assert!(matches!(ScaledRocksteadier::with_lot_size(0), Err(SubsetError::InvalidLotSize { .. })));
        assert!(matches!(
            ScaledRocksteadier::with_lot_size(MAX_LOT_SIZE + 1),
            Err(SubsetError::InvalidLotSize { .. })
        ));
        assert_eq!(ScaledRocksteadier::with_lot_size(10).unwrap(), ScaledRocksteadier::default());
    }
}
