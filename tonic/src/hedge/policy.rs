//! What a hedged method does: [`HedgingPolicy`] (gRFC A6's hedging policy), and
//! [`HedgeConfig`], the policies by method with the [`RetryBudget`] they share.

use std::time::Duration;

use steady_balance::ConfigError;
use tonic::Code;

use super::budget::RetryBudget;

/// The most attempts a hedged request makes, the first included (gRFC A6 caps
/// `maxAttempts` at 5 too).
pub const MAX_ATTEMPTS: u32 = 5;

/// The longest hedging delay accepted: a minute (a longer one is a unit slip, and would
/// hedge nothing a deadline had not already ended).
pub const MAX_DELAY: Duration = Duration::from_secs(60);

/// How one method's requests are hedged (gRFC A6's `hedgingPolicy`): the first attempt
/// goes at once; while no attempt has answered, another goes every `delay`, each to a
/// member none of the earlier ones went to, up to `max_attempts` in all. An attempt that
/// ends in one of the non-fatal codes sends the next one at once instead of waiting;
/// any other answer (a response's head, a fatal status) is the request's answer, and
/// the attempts still out are cancelled.
///
/// Only idempotent methods should be hedged: a request may run on several servers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HedgingPolicy {
    max_attempts: u32,
    delay: Duration,
    non_fatal: Vec<Code>,
}

impl HedgingPolicy {
    /// At most `max_attempts` attempts (`2..=5`), one every `delay` (more than zero, at
    /// most [`MAX_DELAY`]), no non-fatal codes (gRFC A6's default: any status ends the
    /// request).
    ///
    /// A zero delay, which A6 allows (every attempt at once), is refused: it makes every
    /// request cost `max_attempts` attempts, which is replication, not hedging, and the
    /// budget would refuse nearly all of them anyway.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `hedging.max_attempts` or `hedging.delay`.
    pub fn new(max_attempts: u32, delay: Duration) -> Result<Self, ConfigError> {
        if !(2..=MAX_ATTEMPTS).contains(&max_attempts) {
            return Err(ConfigError::new("hedging.max_attempts", max_attempts, "2..=5"));
        }
        if delay.is_zero() || delay > MAX_DELAY {
            return Err(ConfigError::new("hedging.delay", delay, "more than zero, at most 60 s"));
        }
        Ok(Self { max_attempts, delay, non_fatal: Vec::new() })
    }

    /// Takes `codes` as non-fatal: an attempt ending in one of them (a trailers-only
    /// status, or an error the channel maps to it; a failure with no status counts as
    /// `UNAVAILABLE`) sends the next attempt at once, if the budget and the members allow.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `hedging.non_fatal_codes` if `codes` holds `OK`.
    pub fn with_non_fatal_codes(
        mut self,
        codes: impl IntoIterator<Item = Code>,
    ) -> Result<Self, ConfigError> {
        let codes: Vec<Code> = codes.into_iter().collect();
        if codes.contains(&Code::Ok) {
            return Err(ConfigError::new("hedging.non_fatal_codes", codes, "gRPC codes other than OK"));
        }
        self.non_fatal = codes;
        Ok(self)
    }

    /// The most attempts, the first included.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// How long an attempt is given before the next one goes.
    pub fn delay(&self) -> Duration {
        self.delay
    }

    /// The codes that send the next attempt at once.
    pub fn non_fatal_codes(&self) -> &[Code] {
        &self.non_fatal
    }

    pub(crate) fn is_non_fatal(&self, code: Code) -> bool {
        self.non_fatal.contains(&code)
    }
}

/// Which methods are hedged and how, and the budget their extra attempts share.
///
/// A method is named by its gRPC path, `/package.Service/Method` (what
/// `http::Request::uri().path()` is for a tonic call). Methods not named are sent once,
/// untouched.
#[derive(Debug, Clone, Default)]
pub struct HedgeConfig {
    /// Sorted by path, for a binary search per request.
    pub(crate) methods: Vec<(Box<str>, HedgingPolicy)>,
    pub(crate) budget: RetryBudget,
}

impl HedgeConfig {
    /// No method hedged; the default [`RetryBudget`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Hedges the method at `path` (`/package.Service/Method`) with `policy`, replacing
    /// any policy it had.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `hedging.method` when `path` is not of the form
    /// `/package.Service/Method` (two non-empty parts after a leading `/`, no space).
    pub fn method(mut self, path: impl Into<String>, policy: HedgingPolicy) -> Result<Self, ConfigError> {
        let path = path.into();
        if !is_method_path(&path) {
            return Err(ConfigError::new("hedging.method", path, "a gRPC path, /package.Service/Method"));
        }
        match self.methods.binary_search_by(|(p, _)| (**p).cmp(&path)) {
            Ok(i) => self.methods[i].1 = policy,
            Err(i) => self.methods.insert(i, (path.into_boxed_str(), policy)),
        }
        Ok(self)
    }

    /// Throttles extra attempts with `budget` instead of the default.
    pub fn budget(mut self, budget: RetryBudget) -> Self {
        self.budget = budget;
        self
    }

    /// The policy of the method at `path`, if it is hedged.
    pub fn policy(&self, path: &str) -> Option<&HedgingPolicy> {
        self.index(path).map(|i| &self.methods[i].1)
    }

    /// The index of `path`'s policy: a binary search over the (few) hedged methods.
    #[inline]
    pub(crate) fn index(&self, path: &str) -> Option<usize> {
        if self.methods.is_empty() {
            return None;
        }
        self.methods.binary_search_by(|(p, _)| (**p).cmp(path)).ok()
    }
}

/// `/a/b`: a leading slash, then two non-empty parts, no whitespace.
fn is_method_path(path: &str) -> bool {
    let Some(rest) = path.strip_prefix('/') else { return false };
    let mut parts = rest.split('/');
    let (Some(service), Some(method), None) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    !service.is_empty() && !method.is_empty() && !path.contains(char::is_whitespace)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_values_name_their_field() {
        let ms = Duration::from_millis;
        assert_eq!(HedgingPolicy::new(0, ms(5)).unwrap_err().field(), "hedging.max_attempts");
        assert_eq!(HedgingPolicy::new(1, ms(5)).unwrap_err().field(), "hedging.max_attempts");
        assert_eq!(HedgingPolicy::new(6, ms(5)).unwrap_err().field(), "hedging.max_attempts");
        assert_eq!(HedgingPolicy::new(2, Duration::ZERO).unwrap_err().field(), "hedging.delay");
        assert_eq!(HedgingPolicy::new(2, Duration::from_secs(61)).unwrap_err().field(), "hedging.delay");
        let policy = HedgingPolicy::new(5, ms(5)).unwrap();
        let ok = policy.clone().with_non_fatal_codes([Code::Unavailable, Code::Ok]);
        assert_eq!(ok.unwrap_err().field(), "hedging.non_fatal_codes");
        for bad in ["", "/", "echo", "/svc", "/svc/", "//m", "/a/b/c", "/a b/c"] {
            let e = HedgeConfig::new().method(bad, policy.clone()).unwrap_err();
            assert_eq!(e.field(), "hedging.method", "{bad:?}");
        }
    }

    #[test]
    fn methods_are_found_by_path_and_others_are_not_hedged() {
        let ms = Duration::from_millis;
        let config = HedgeConfig::new()
            .method("/b.S/M", HedgingPolicy::new(2, ms(1)).unwrap())
            .unwrap()
            .method("/a.S/M", HedgingPolicy::new(3, ms(2)).unwrap())
            .unwrap()
            .method("/b.S/M", HedgingPolicy::new(4, ms(3)).unwrap())
            .unwrap();
        assert_eq!(config.policy("/b.S/M").map(HedgingPolicy::max_attempts), Some(4));
        assert_eq!(config.policy("/a.S/M").map(HedgingPolicy::delay), Some(ms(2)));
        assert_eq!(config.policy("/a.S/N"), None);
        assert_eq!(HedgeConfig::new().policy("/a.S/M"), None);
    }
}
