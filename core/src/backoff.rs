//! Exponential backoff with jitter, for whatever reconnects: a channel to a failed
//! backend, a watcher to its Distributor, a load reporter to its collector.

use std::time::Duration;

use steady_subset::prng::SplitMix64;

use crate::ConfigError;

/// The longest `base` or `max` a [`Backoff`] may have: an hour (the balancer's
/// `MAX_WAIT`). Longer delays are almost certainly mistakes, and bounding them keeps
/// every deadline computable.
pub const MAX_BACKOFF: Duration = Duration::from_secs(3600);

/// Reconnection delays: `base × 2^(failures - 1)`, capped at `max`, then scaled by a
/// random factor in `[1 - jitter, 1]` so that many frontends do not retry in lockstep.
///
/// The fields are public, so any values can be built; every API that takes a `Backoff`
/// checks it with [`Backoff::validate`] and refuses one out of range with a
/// [`ConfigError`]. [`Backoff::delay`] itself is total: it never panics, whatever
/// the fields hold.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// The delay after the first failure.
    pub base: Duration,
    /// The largest delay.
    pub max: Duration,
    /// The fraction of the delay that is random, in `0.0..=1.0`.
    pub jitter: f64,
}

impl Default for Backoff {
    fn default() -> Self {
        Self { base: Duration::from_millis(100), max: Duration::from_secs(10), jitter: 0.5 }
    }
}

impl Backoff {
    /// Checks every field; the first out of its range is the error.
    ///
    /// | field | accepted |
    /// |---|---|
    /// | `backoff.base` | `1 ms..=`[`MAX_BACKOFF`] (an hour) |
    /// | `backoff.max` | `backoff.base..=MAX_BACKOFF` |
    /// | `backoff.jitter` | a number in `0.0..=1.0` |
    ///
    /// `steady_balance::BalanceConfig::validate` runs this same check on its `backoff`.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field (`backoff.base`, `backoff.max` or
    /// `backoff.jitter`), its value and the accepted range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        const MS: Duration = Duration::from_millis(1);
        if self.base < MS || self.base > MAX_BACKOFF {
            return Err(ConfigError::new("backoff.base", self.base, "1 ms..=1 h"));
        }
        if self.max < self.base || self.max > MAX_BACKOFF {
            return Err(ConfigError::new("backoff.max", self.max, "backoff.base..=1 h"));
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            return Err(ConfigError::new("backoff.jitter", self.jitter, "0.0..=1.0"));
        }
        Ok(())
    }

    /// The delay after `failures` consecutive failures (`failures >= 1`; `0` counts as
    /// `1`): at most `max`, at least `(1 - jitter)` of it.
    ///
    /// Total: for a `Backoff` that [`Backoff::validate`] refuses it still returns a
    /// delay and never panics. A `base` above `max` is capped at `max`; a `jitter` out
    /// of `0.0..=1.0` is clamped into it, and NaN counts as `0.0`.
    pub fn delay(&self, failures: u32, rng: &mut SplitMix64) -> Duration {
        let exponent = failures.saturating_sub(1).min(30);
        let full = self.base.saturating_mul(1 << exponent).min(self.max);
        // NaN (which `clamp` keeps) counts as no jitter: `Duration` arithmetic panics on it.
        let jitter = if self.jitter.is_nan() { 0.0 } else { self.jitter.clamp(0.0, 1.0) };
        // A uniform fraction in [0, 1) from 53 random bits.
        let unit = (rng.next() >> 11) as f64 / (1u64 << 53) as f64;
        // A finite number in [0, full]: but `full` in seconds as an `f64` may round up
        // past `Duration::MAX` (`Duration::mul_f64` panics there), and may exceed
        // `full` by a rounding step. Out of range means `full` itself.
        let scaled = full.as_secs_f64() * (1.0 - jitter * unit);
        Duration::try_from_secs_f64(scaled).map_or(full, |d| d.min(full))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_refuses_each_field_out_of_range_by_name() {
        let good = Backoff::default();
        assert_eq!(good.validate(), Ok(()));
        for (bad, field) in [
            (Backoff { base: Duration::ZERO, ..good }, "backoff.base"),
            (
                Backoff { base: MAX_BACKOFF + Duration::from_nanos(1), max: Duration::MAX, ..good },
                "backoff.base",
            ),
            (Backoff { max: Duration::from_millis(1), ..good }, "backoff.max"),
            (Backoff { max: MAX_BACKOFF * 2, ..good }, "backoff.max"),
            (Backoff { jitter: f64::NAN, ..good }, "backoff.jitter"),
            (Backoff { jitter: -0.5, ..good }, "backoff.jitter"),
            (Backoff { jitter: 1.5, ..good }, "backoff.jitter"),
        ] {
            assert_eq!(bad.validate().map_err(|e| e.field()), Err(field), "{bad:?}");
        }
        let edges = Backoff { base: Duration::from_millis(1), max: MAX_BACKOFF, jitter: 1.0 };
        assert_eq!(edges.validate(), Ok(()));
    }

    #[test]
    fn delays_double_up_to_the_cap_within_the_jitter() {
        let b = Backoff { base: Duration::from_millis(100), max: Duration::from_secs(1), jitter: 0.5 };
        let mut rng = SplitMix64::new(1);
        for (failures, full) in [(1, 100), (2, 200), (3, 400), (4, 800), (5, 1000), (40, 1000)] {
            for _ in 0..50 {
                let d = b.delay(failures, &mut rng);
                let full = Duration::from_millis(full);
                assert!(d <= full && d >= full / 2, "{failures}: {d:?}");
            }
        }
        let exact = Backoff { jitter: 0.0, ..b };
        assert_eq!(exact.delay(2, &mut rng), Duration::from_millis(200));
    }

    fn extreme_durations() -> [Duration; 7] {
        [
            Duration::ZERO,
            Duration::from_nanos(1),
            Duration::from_millis(1),
            Duration::from_secs(3600),
            Duration::from_secs(u64::MAX / 2),
            Duration::new(u64::MAX, 0),
            Duration::MAX,
        ]
    }

    #[test]
    fn delay_is_total_and_within_its_bounds_for_any_fields() {
        let jitters = [f64::NAN, f64::NEG_INFINITY, -1.0, 0.0, 0.5, 1.0, 1.5, f64::INFINITY];
        let mut rng = SplitMix64::new(7);
        for base in extreme_durations() {
            for max in extreme_durations() {
                for jitter in jitters {
                    let b = Backoff { base, max, jitter };
                    for failures in [0, 1, 2, 31, 32, 64, u32::MAX] {
                        for _ in 0..20 {
                            let d = b.delay(failures, &mut rng);
                            let full = base.saturating_mul(1 << failures.saturating_sub(1).min(30)).min(max);
                            assert!(d <= full, "{b:?} {failures}: {d:?} > {full:?}");
                        }
                    }
                }
            }
        }
        // No jitter: exactly the capped delay, even at the very top of `Duration`.
        let top = Backoff { base: Duration::MAX, max: Duration::MAX, jitter: 0.0 };
        assert_eq!(top.delay(1, &mut rng), Duration::MAX);
    }
}
