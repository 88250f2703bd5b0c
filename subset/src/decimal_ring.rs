//! The decimal van der Corput ring that [`crate::DecimalRocksteadier`] places lots on.
//!
//! Index `i` sits at the position `y(i)` in `[0, 1)` read off its mixed-radix digits.
//! Write `i = d₀ + 5·d₁ + 10·d₂ + 50·d₃ + 100·d₄ + …` with radices 5, 2, 5, 2, … (least
//! significant first), map each base-5 digit through `σ(d) = 2d mod 5` (base-2 digits
//! stay), and read the mapped digits after the point, the first most significant:
//! `y(i) = σ(d₀)/5 + d₁/10 + σ(d₂)/50 + d₃/100 + …`. So `y` runs
//! `0, ⅖, ⅘, ⅕, ⅗, ⅒, ½, 9/10, 3/10, 7/10, 2/50, …`.
//!
//! The first 5, 10, 50, 100, 500, … indices sit exactly on the multiples of ⅕, ⅒, 1/50,
//! 1/100, …, and any prefix is spread almost evenly. The binary ring of [`crate::ring`] is
//! exact at powers of two instead. The mapping `σ` spreads the first few indices: the
//! first two sit ⅖ apart instead of ⅕.
//!
//! The *ring order* of `0..n` is those indices sorted by position. As with the binary
//! ring, it is never built: the indices whose lowest digit is `d` form one block of the
//! order (blocks in the order `σ(d) = 0, 1, …`), and inside a block the order is the ring
//! order of the higher digits. [`count_below`] and [`element_at`] walk that recursion in
//! `O(log n)`, and [`DecimalRingOrder`] steps through it in amortised `O(1)`.

/// The radix of digit `level` (0 = least significant): 5, 2, 5, 2, …
#[inline]
const fn radix(level: u32) -> u64 {
    if level % 2 == 0 {
        5
    } else {
        2
    }
}

/// The digit of a position for index digit `d` at `level`: `σ(d) = 2d mod 5` in base 5.
#[inline]
const fn mapped(d: u64, level: u32) -> u64 {
    if level % 2 == 0 {
        (2 * d) % 5
    } else {
        d
    }
}

/// The index digit with position digit `v` at `level`: `σ⁻¹(v) = 3v mod 5` in base 5.
#[inline]
const fn unmapped(v: u64, level: u32) -> u64 {
    if level % 2 == 0 {
        (3 * v) % 5
    } else {
        v
    }
}

/// How many of the indices `0..n` have lowest digit `d` in radix `r`.
#[inline]
const fn with_digit(n: u64, d: u64, r: u64) -> u64 {
    if d < n {
        (n - d).div_ceil(r)
    } else {
        0
    }
}

/// The position `y(index)` as an exact fraction `(numerator, denominator)`, the
/// denominator being the product of the radices of `index`'s digits (1 for index 0).
///
/// The denominator is at most `5 × 10^19` for any `u64` index (39 digits).
pub fn position(index: u64) -> (u128, u128) {
    let (mut numerator, mut denominator) = (0u128, 1u128);
    let (mut rest, mut level) = (index, 0);
    while rest > 0 {
        let r = radix(level);
        // Appending digit j after the ones so far: y = Σ v_j / (r_0 … r_j).
        numerator = numerator * u128::from(r) + u128::from(mapped(rest % r, level));
        denominator *= u128::from(r);
        rest /= r;
        level += 1;
    }
    (numerator, denominator)
}

/// How many of the indices `0..n` sit strictly before index `index` on the ring
/// (`index` may be `>= n`). Costs `O(log n)`.
pub fn count_below(mut n: u64, mut index: u64) -> u64 {
    let mut count = 0;
    let mut level = 0;
    // Compare digit by digit: blocks with a smaller position digit lie wholly before;
    // the block with the same digit is compared on the higher digits.
    while n > 0 && index > 0 {
        let r = radix(level);
        let d = index % r;
        let v = mapped(d, level);
        for smaller in 0..v {
            count += with_digit(n, unmapped(smaller, level), r);
        }
        n = with_digit(n, d, r);
        index /= r;
        level += 1;
    }
    count
}

/// The index of ring-order rank `rank` among `0..n`.
///
/// Requires `rank < n`, checked by a `debug_assert!`; in release builds an out-of-range
/// rank gives an unspecified index. Costs `O(log n)`.
pub fn element_at(mut n: u64, mut rank: u64) -> u64 {
    debug_assert!(rank < n, "rank {rank} out of range for {n} indices");
    // The weight of the next digit runs one radix past the last digit: u128.
    let (mut index, mut weight, mut level) = (0u64, 1u128, 0);
    while n > 1 {
        let r = radix(level);
        for v in 0..r {
            let d = unmapped(v, level);
            let block = with_digit(n, d, r);
            if rank < block {
                // d × weight is below n's span, so it fits in u64 whenever d > 0.
                index += (u128::from(d) * weight) as u64;
                n = block;
                break;
            }
            rank -= block;
        }
        weight *= u128::from(r);
        level += 1;
    }
    index
}

/// The number of digits, and their radices' product, that the indices `0..n` need.
fn digits_for(n: u64) -> (u32, u128) {
    let (mut digits, mut span) = (0u32, 1u128);
    while span < u128::from(n) {
        span *= u128::from(radix(digits));
        digits += 1;
    }
    (digits, span)
}

/// The ring order of `0..n`, from a given rank, once round: an iterator of indices.
///
/// It counts through the digit strings in position order (the lowest index digit most
/// significant) and skips the strings that stand for indices `>= n`. The strings span
/// less than one radix (at most 5) times `n`, so each step costs amortised `O(1)`.
#[derive(Debug, Clone)]
pub struct DecimalRingOrder {
    n: u64,
    /// Position digits of the current string, lowest index digit first.
    digits: [u8; MAX_DIGITS],
    /// How many digits the indices `0..n` need.
    len: u32,
    /// The product of their radices.
    span: u128,
    /// The index the current string stands for (it may exceed `u64` on the way).
    index: u128,
    /// Indices still to yield.
    remaining: u64,
}

/// Enough digits for any `u64` index (radices alternate 5 and 2: 5 × 10^19 > 2^64).
const MAX_DIGITS: usize = 41;

impl DecimalRingOrder {
    /// The ring order of `0..n` starting at rank `start % n`.
    pub fn from_rank(n: u64, start: u64) -> Self {
        let (len, span) = digits_for(n);
        let mut order = Self { n, digits: [0; MAX_DIGITS], len, span, index: 0, remaining: n };
        if n > 0 {
            let first = element_at(n, start % n);
            order.index = u128::from(first);
            let mut rest = first;
            for level in 0..len {
                let r = radix(level);
                order.digits[level as usize] = mapped(rest % r, level) as u8;
                rest /= r;
            }
        }
        order
    }

    /// The ring order of `0..n` starting at the first index at or after `index`'s
    /// position (wrapping to the first when none is).
    pub fn from_position_of(n: u64, index: u64) -> Self {
        Self::from_rank(n, count_below(n, index))
    }

    /// Moves to the next digit string in position order, wrapping at the end.
    #[inline]
    fn step(&mut self) {
        // The highest index digit is the least significant for the order.
        let mut level = self.len;
        let mut weight = self.span;
        let mut index = self.index;
        while level > 0 {
            level -= 1;
            let r = radix(level);
            weight /= u128::from(r);
            let v = u64::from(self.digits[level as usize]);
            let old = u128::from(unmapped(v, level));
            let next = if v + 1 < r { v + 1 } else { 0 };
            self.digits[level as usize] = next as u8;
            index = index - old * weight + u128::from(unmapped(next, level)) * weight;
            if next != 0 {
                break;
            }
            // Carry: this digit wrapped to position digit 0; move on to the next one.
        }
        self.index = index;
    }
}

impl Iterator for DecimalRingOrder {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        // The current string is below n: set up so, and kept so by the loop below.
        let current = self.index as u64;
        if self.remaining > 0 {
            loop {
                self.step();
                if self.index < u128::from(self.n) {
                    break;
                }
            }
        }
        Some(current)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = usize::try_from(self.remaining).unwrap_or(usize::MAX);
        (left, Some(left))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `0..n` sorted by exact position.
    fn sorted(n: u64) -> Vec<u64> {
        let mut v: Vec<u64> = (0..n).collect();
        v.sort_by(|&a, &b| {
            let ((an, ad), (bn, bd)) = (position(a), position(b));
            (an * bd).cmp(&(bn * ad))
        });
        v
    }

    #[test]
    fn positions_follow_the_decimal_digits() {
        let tenths: Vec<(u128, u128)> = (0..10).map(position).collect();
        assert_eq!(tenths[..5], [(0, 1), (2, 5), (4, 5), (1, 5), (3, 5)]);
        assert_eq!(tenths[5..], [(1, 10), (5, 10), (9, 10), (3, 10), (7, 10)]);
        assert_eq!(position(10), (2, 50));
        let (n, d) = position(u64::MAX);
        assert!(n < d && d <= 5 * 10u128.pow(19));
    }

    #[test]
    fn round_prefixes_sit_exactly_on_the_multiples() {
        for count in [1u64, 5, 10, 50, 100, 500, 1000, 5000] {
            let mut scaled: Vec<u128> = (0..count)
                .map(|i| {
                    let (n, d) = position(i);
                    assert_eq!(n * u128::from(count) % d, 0, "index {i} of {count}");
                    n * u128::from(count) / d
                })
                .collect();
            scaled.sort_unstable();
            assert_eq!(scaled, (0..u128::from(count)).collect::<Vec<_>>());
        }
    }

    #[test]
    fn the_recursions_agree_with_sorting() {
        for n in (0..=130).chain([499, 500, 501, 1234]) {
            let order = sorted(n);
            for (rank, &index) in order.iter().enumerate() {
                assert_eq!(element_at(n, rank as u64), index, "n={n} rank={rank}");
                assert_eq!(count_below(n, index), rank as u64, "n={n} index={index}");
            }
            // Indices beyond n count the ones before them too.
            for probe in [n, n + 1, 2 * n + 7, 10_007] {
                let (pn, pd) = position(probe);
                let before = order
                    .iter()
                    .filter(|&&i| {
                        let (a, b) = position(i);
                        a * pd < pn * b
                    })
                    .count() as u64;
                assert_eq!(count_below(n, probe), before, "n={n} probe={probe}");
            }
            for start in [0, 1, n / 2, n.saturating_sub(1), n + 3] {
                let got: Vec<u64> = DecimalRingOrder::from_rank(n, start).collect();
                let want: Vec<u64> = if n == 0 {
                    Vec::new()
                } else {
                    let s = (start % n) as usize;
                    order[s..].iter().chain(&order[..s]).copied().collect()
                };
                assert_eq!(got, want, "n={n} start={start}");
            }
        }
    }

    #[test]
    fn the_largest_rings_neither_overflow_nor_panic() {
        let n = u64::MAX;
        assert_eq!(element_at(n, 0), 0);
        assert_eq!(count_below(n, 0), 0);
        // Index 1 sits at 2/5: exactly the indices whose lowest digit maps below 2 precede it.
        let below = count_below(n, 1);
        assert_eq!(element_at(n, below), 1);
        let first: Vec<u64> = DecimalRingOrder::from_rank(n, 0).take(3).collect();
        assert_eq!(first.len(), 3);
        assert_eq!(first[0], 0);
        assert!(first.windows(2).all(|w| {
            let ((a, b), (c, d)) = (position(w[0]), position(w[1]));
            a * d < c * b
        }));
    }

    #[test]
    fn from_position_starts_at_the_first_index_at_or_after_it() {
        // Ten lots sit on the tenths: index 3 (position 1/5) starts at itself; index 10
        // (position 2/50) starts at the next tenth, index 5 (1/10).
        assert_eq!(DecimalRingOrder::from_position_of(10, 3).next(), Some(3));
        assert_eq!(DecimalRingOrder::from_position_of(10, 10).next(), Some(5));
        // Past the last position: wraps to index 0.
        assert_eq!(DecimalRingOrder::from_position_of(5, 7).next(), Some(0));
    }
}
