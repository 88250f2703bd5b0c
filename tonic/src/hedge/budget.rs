//! [`RetryBudget`]: how many extra attempts hedging may send, as Finagle's and linkerd's
//! retry budgets bound retries: a share of the requests, plus a floor per second, over
//! a sliding window.
//!
//! Built on tower's `TpsBudget` (`tower::retry::budget`), which is that budget: every
//! hedged request deposits, every extra attempt withdraws `1 / share` deposits, and a
//! reserve of `floor_per_second x window` withdrawals is always there; deposits and
//! withdrawals expire after the window (in tenths of it). So over any window, extra
//! attempts are at most `share` of the requests plus `floor_per_second x window`
//! (give or take a tenth of the window, the slots' grain), however many requests fail.

use std::time::Duration;

use steady_balance::ConfigError;
use tower::retry::budget::{Budget, TpsBudget};

/// The budget of extra attempts (see the module's doc for the bound it keeps).
/// Default: 10% of the requests plus 10 per second, over 10 s.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryBudget {
    share: f32,
    floor_per_second: u32,
    window: Duration,
}

impl Default for RetryBudget {
    fn default() -> Self {
        Self { share: 0.1, floor_per_second: 10, window: Duration::from_secs(10) }
    }
}

impl RetryBudget {
    /// Extra attempts up to `share` of the requests (`0.0..=1.0`; 0.1 is 10%) plus
    /// `floor_per_second` a second (at most 1,000,000), counted over `window` (1 to 60
    /// whole seconds, tower's `TpsBudget`'s range).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `budget.share`, `budget.floor_per_second` or
    /// `budget.window`.
    pub fn new(share: f32, floor_per_second: u32, window: Duration) -> Result<Self, ConfigError> {
        if !(0.0..=1.0).contains(&share) {
            return Err(ConfigError::new("budget.share", share, "0.0..=1.0"));
        }
        if floor_per_second > 1_000_000 {
            return Err(ConfigError::new("budget.floor_per_second", floor_per_second, "0..=1000000"));
        }
        if window < Duration::from_secs(1) || window > Duration::from_secs(60) || window.subsec_nanos() != 0 {
            return Err(ConfigError::new("budget.window", window, "1 to 60 whole seconds"));
        }
        Ok(Self { share, floor_per_second, window })
    }

    /// The share of requests extra attempts may add.
    pub fn share(&self) -> f32 {
        self.share
    }

    /// The extra attempts a second allowed whatever the requests.
    pub fn floor_per_second(&self) -> u32 {
        self.floor_per_second
    }

    /// The window deposits and withdrawals count over.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// The budget's running state (tower's `TpsBudget`; its asserts hold: the values
    /// were checked).
    pub(crate) fn start(&self) -> Tokens {
        Tokens(TpsBudget::new(self.window, self.floor_per_second, self.share))
    }
}

/// A running [`RetryBudget`]: deposits and withdrawals over the window.
#[derive(Debug)]
pub(crate) struct Tokens(TpsBudget);

impl Tokens {
    /// A hedged request: one deposit.
    pub(crate) fn deposit(&self) {
        self.0.deposit();
    }

    /// An extra attempt: whether the budget allows it (withdrawn if so).
    pub(crate) fn withdraw(&self) -> bool {
        self.0.withdraw()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_values_name_their_field() {
        let s = Duration::from_secs;
        assert_eq!(RetryBudget::new(-0.1, 10, s(10)).unwrap_err().field(), "budget.share");
        assert_eq!(RetryBudget::new(1.5, 10, s(10)).unwrap_err().field(), "budget.share");
        assert_eq!(RetryBudget::new(f32::NAN, 10, s(10)).unwrap_err().field(), "budget.share");
        assert_eq!(RetryBudget::new(0.1, 2_000_000, s(10)).unwrap_err().field(), "budget.floor_per_second");
        assert_eq!(RetryBudget::new(0.1, 10, Duration::ZERO).unwrap_err().field(), "budget.window");
        assert_eq!(RetryBudget::new(0.1, 10, s(61)).unwrap_err().field(), "budget.window");
        assert_eq!(
            RetryBudget::new(0.1, 10, Duration::from_millis(1500)).unwrap_err().field(),
            "budget.window"
        );
        assert!(RetryBudget::new(0.0, 0, s(1)).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn extra_attempts_are_the_share_of_requests_plus_the_floor() {
        // 10% of 1,000 requests plus 5 a second over 2 s: 100 + 10.
        let tokens = RetryBudget::new(0.1, 5, Duration::from_secs(2)).unwrap().start();
        for _ in 0..1000 {
            tokens.deposit();
        }
        let allowed = (0..10_000).take_while(|_| tokens.withdraw()).count();
        assert_eq!(allowed, 110);
        // The window passes: the withdrawals expire with the deposits, the floor returns.
        tokio::time::advance(Duration::from_secs(3)).await;
        let allowed = (0..10_000).take_while(|_| tokens.withdraw()).count();
        assert_eq!(allowed, 10);
    }
}
