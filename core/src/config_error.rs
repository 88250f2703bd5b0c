//! [`ConfigError`]: a configuration value refused when it is given.

use std::fmt;

/// A configuration value out of its accepted range: which field, the value, and the
/// range it must be in.
///
/// Returned when a balancer or channel is built (`steady_balance::BalanceConfig`), by
/// [`crate::Backoff::validate`] (so by every API that takes a `Backoff`), and by the
/// other builders of steady that check ranges; whatever returned it started or changed
/// nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    field: &'static str,
    value: String,
    accepted: &'static str,
}

impl ConfigError {
    /// The error for `field` holding `value`, which is not in `accepted` (in words).
    pub fn new(field: &'static str, value: impl fmt::Debug, accepted: &'static str) -> Self {
        Self { field, value: format!("{value:?}"), accepted }
    }

    /// The field, as the configuration names it (`subset_size`, `backoff.jitter`, ...).
    pub fn field(&self) -> &'static str {
        self.field
    }

    /// The accepted range, in words.
    pub fn accepted(&self) -> &'static str {
        self.accepted
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid configuration: {} = {} (accepted: {})", self.field, self.value, self.accepted)
    }
}

impl std::error::Error for ConfigError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_field_its_value_and_the_accepted_range() {
        let e = ConfigError::new("backoff.jitter", 1.5, "0.0..=1.0");
        assert_eq!(e.field(), "backoff.jitter");
        assert_eq!(e.accepted(), "0.0..=1.0");
        assert_eq!(e.to_string(), "invalid configuration: backoff.jitter = 1.5 (accepted: 0.0..=1.0)");
    }
}
