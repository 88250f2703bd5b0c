//! The van der Corput ring that Ringsteady and Rocksteadier place tasks on.
//!
//! Task `i` sits at `i.reverse_bits()` (as a `u64`), read as a fraction of the circle
//! `2^64`: task 0 at 0, task 1 at ½, task 2 at ¼, task 3 at ¾, task 4 at ⅛, ... This is
//! the binary van der Corput sequence: consecutive task numbers land far apart, and
//! any prefix `0..n` of the tasks is spread almost evenly around the circle.
//!
//! The *ring order* of `0..n` is those tasks sorted by position. It has a recursive
//! shape that lets us answer questions about it in `O(log n)` without sorting: the
//! even tasks sit in the first half of the circle (`(2j).reverse_bits()` is
//! `j.reverse_bits() >> 1`) and the odd ones in the second half, so the ring order of
//! `0..n` is the ring order of `0..ceil(n/2)` doubled, followed by the ring order of
//! `0..floor(n/2)` doubled plus one. [`element_at`] and [`count_below`] walk that
//! recursion one bit at a time.

/// The position of task `index` on the circle, as a fraction of `2^64`.
#[inline]
pub const fn position(index: u64) -> u64 {
    index.reverse_bits()
}

/// Half the circle, `2^63`, as a 128-bit number.
const HALF: u128 = 1 << 63;

/// The task of ring-order rank `rank` among the tasks `0..n`.
///
/// Requires `rank < n`, checked by a `debug_assert!`; in release builds an out-of-range
/// rank gives an unspecified task. Costs `O(log n)`.
#[inline]
pub fn element_at(mut n: u64, mut rank: u64) -> u64 {
    debug_assert!(rank < n, "rank {rank} out of range for {n} tasks");
    let mut task = 0;
    let mut bit = 0;
    // At each level the low bit of the task decides which half it lies in: the
    // ceil(n/2) even tasks come first in ring order, then the floor(n/2) odd ones.
    while n > 1 {
        let evens = n - n / 2;
        if rank < evens {
            n = evens;
        } else {
            rank -= evens;
            n /= 2;
            task |= 1 << bit;
        }
        bit += 1;
    }
    task
}

/// How many of the tasks `0..n` sit strictly before position `pos` on the circle.
///
/// `pos` may be `2^64` (the whole circle), hence `u128`. This is the ring-order rank
/// of the first task at or after `pos` (equal to `n` when every task is before it).
/// Costs `O(log n)`.
#[inline]
pub fn count_below(mut n: u64, pos: u128) -> u64 {
    debug_assert!(pos <= 1u128 << 64);
    let mut pos = pos;
    let mut count = 0;
    while n > 1 {
        let evens = n - n / 2;
        if pos <= HALF {
            // Only even tasks can sit before pos: (2j) is before pos exactly when
            // j.reverse_bits() >> 1 < pos, that is j.reverse_bits() < 2 * pos.
            n = evens;
            pos *= 2;
        } else {
            // Every even task is before pos; odd task 2j+1 sits at
            // (j.reverse_bits() >> 1) + 2^63.
            count += evens;
            n /= 2;
            pos = (pos - HALF) * 2;
        }
    }
    // One task left (task 0 of the sub-ring, at position 0), or none.
    count + u64::from(n == 1 && pos > 0)
}

/// The tasks `0..n` in ring order, starting at rank `start` and wrapping around once.
///
/// The first step costs `O(log n)` ([`element_at`]); every later step is `O(1)`: with
/// `b` bits enough for `n - 1`, the ring order of `0..2^b` is a `b`-bit counter read
/// with its bits reversed, so the next task is the reversal of the counter plus one,
/// skipping values `>= n`. Those all have bit `b - 1` set, and consecutive counter
/// values alternate that bit, so at most one value in a row is skipped. Nothing is
/// allocated.
#[derive(Debug, Clone)]
pub struct RingOrder {
    n: u64,
    /// `b`: the number of bits of `n - 1` (0 when `n <= 1`).
    bits: u32,
    /// The reversed-bits counter of the next task to consider.
    counter: u64,
    /// Tasks still to yield.
    remaining: u64,
}

impl RingOrder {
    /// The ring order of `0..n` starting at rank `start % n`.
    pub fn from_rank(n: u64, start: u64) -> Self {
        let bits = u64::BITS - n.saturating_sub(1).leading_zeros();
        let counter = if n == 0 { 0 } else { reverse_low_bits(element_at(n, start % n), bits) };
        Self { n, bits, counter, remaining: n }
    }

    /// The ring order of `0..n` starting at the first task at or after `pos`
    /// (wrapping to task 0 when no task is at or after it).
    pub fn from_position(n: u64, pos: u64) -> Self {
        Self::from_rank(n, count_below(n, u128::from(pos)))
    }
}

/// The low `bits` bits of `x`, in reverse order (`bits <= 64`).
#[inline]
fn reverse_low_bits(x: u64, bits: u32) -> u64 {
    if bits == 0 {
        0
    } else {
        x.reverse_bits() >> (u64::BITS - bits)
    }
}

impl Iterator for RingOrder {
    type Item = u64;

    #[inline]
    fn next(&mut self) -> Option<u64> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        let mask = if self.bits == 0 { 0 } else { u64::MAX >> (u64::BITS - self.bits) };
        loop {
            let task = reverse_low_bits(self.counter, self.bits);
            self.counter = self.counter.wrapping_add(1) & mask;
            if task < self.n {
                return Some(task);
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = usize::try_from(self.remaining).unwrap_or(usize::MAX);
        (left, Some(left))
    }
}

impl ExactSizeIterator for RingOrder {}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ring order of `0..n` by sorting positions: the definition.
    fn sorted_ring(n: u64) -> Vec<u64> {
        let mut v: Vec<u64> = (0..n).collect();
        v.sort_by_key(|&i| position(i));
        v
    }

    #[test]
    fn positions_follow_the_van_der_corput_sequence() {
        let quarter = 1u64 << 62;
        assert_eq!(position(0), 0);
        assert_eq!(position(1), 2 * quarter);
        assert_eq!(position(2), quarter);
        assert_eq!(position(3), 3 * quarter);
        // The article's 8-bit example: task 5 at 5/8.
        assert_eq!(position(5), 5 * (1u64 << 61));
    }

    #[test]
    fn element_at_agrees_with_sorting_the_ring() {
        for n in 1..=130 {
            let sorted = sorted_ring(n);
            for (rank, &task) in sorted.iter().enumerate() {
                assert_eq!(element_at(n, rank as u64), task, "n={n} rank={rank}");
            }
        }
    }

    #[test]
    fn count_below_agrees_with_counting() {
        for n in 0..=70u64 {
            let probes = (0..n + 3)
                .map(|i| u128::from(position(i)))
                .chain((0..n + 3).map(|i| u128::from(position(i)) + 1))
                .chain([0, 1, HALF, HALF + 1, 1u128 << 64]);
            for pos in probes {
                let expected = (0..n).filter(|&i| u128::from(position(i)) < pos).count() as u64;
                assert_eq!(count_below(n, pos), expected, "n={n} pos={pos}");
            }
        }
    }

    #[test]
    fn ring_order_of_ten_is_the_permutation_the_article_derives_from() {
        assert_eq!(sorted_ring(10), [0, 8, 4, 2, 6, 1, 9, 5, 3, 7]);
        assert_eq!(RingOrder::from_rank(10, 0).collect::<Vec<_>>(), [0, 8, 4, 2, 6, 1, 9, 5, 3, 7]);
    }

    #[test]
    fn ring_order_from_a_position_matches_the_articles_lot_example() {
        // Six lots; frontend lot 1 (at ½) reads them as [1, 5, 3, 0, 4, 2].
        let order: Vec<u64> = RingOrder::from_position(6, position(1)).collect();
        assert_eq!(order, [1, 5, 3, 0, 4, 2]);
    }

    #[test]
    fn ring_order_from_any_rank_is_the_sorted_ring_rotated() {
        for n in 0..=70u64 {
            let sorted = sorted_ring(n);
            for start in 0..n + 2 {
                let got: Vec<u64> = RingOrder::from_rank(n, start).collect();
                let s = if n == 0 { 0 } else { (start % n) as usize };
                let want: Vec<u64> = sorted[s..].iter().chain(&sorted[..s]).copied().collect();
                assert_eq!(got, want, "n={n} start={start}");
            }
        }
        for n in [1u64 << 20, (1 << 20) + 1, 1_000_003] {
            let got: Vec<u64> = RingOrder::from_rank(n, n - 3).take(6).collect();
            let want: Vec<u64> = [n - 3, n - 2, n - 1, 0, 1, 2].iter().map(|&r| element_at(n, r)).collect();
            assert_eq!(got, want, "n={n}");
        }
    }

    #[test]
    fn ring_order_visits_every_task_once() {
        for n in 0..50 {
            for start in 0..n + 2 {
                let mut v: Vec<u64> = RingOrder::from_rank(n, start).collect();
                v.sort_unstable();
                assert_eq!(v, (0..n).collect::<Vec<_>>());
            }
        }
    }
}
