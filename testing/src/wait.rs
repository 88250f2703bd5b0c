//! Bounded waits for the state a test asserts: a condition polled until it holds, never
//! a fixed sleep, and never for longer than a bound.
//!
//! * `eventually` (feature `tokio`): waits at most [`PATIENCE`], then panics naming what
//!   it waited for. The one to use unless a test needs another bound.
//! * `eventually_within` (feature `tokio`): the same with another bound, for a state that
//!   takes longer to come (etcd back after an outage) or a test whose bound is what it
//!   asserts.
//! * `holds_within` (feature `tokio`): whether the condition held within the bound,
//!   without panicking, for an assertion that prints more than what it waited for, or a
//!   tool that reports a timeout as an error.
//! * [`eventually_blocking`] (std only): `eventually_within` for a test without a
//!   runtime on its thread.
//! * `within` (feature `tokio`): a future's output, awaited for at most a bound, for a
//!   state that comes as an event (a watch's next value, a connection) rather than one
//!   polled for.
//!
//! The async waits sleep on tokio's clock: under `#[tokio::test(start_paused = true)]`
//! time advances by itself while they sleep, so they wait no wall-clock time and a test
//! can measure on that clock when the state came (to [`POLL`]).

use std::time::{Duration, Instant};

/// How long `eventually` waits before it panics.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// How often the async waits look at their condition: every millisecond of tokio's
/// clock, so that a test on the paused clock measures when a state came to within 1 ms.
pub const POLL: Duration = Duration::from_millis(1);

/// How often [`eventually_blocking`] looks at its condition (a blocking condition is
/// typically a request to a server, which should not be asked a thousand times a second).
pub const POLL_BLOCKING: Duration = Duration::from_millis(10);

/// Waits until `condition` holds, looking at it every [`POLL`] of tokio's clock.
///
/// # Panics
///
/// When it does not hold within [`PATIENCE`]; the message names `what` the test waited
/// for ("timed out after 10s waiting for {what}").
#[cfg(feature = "tokio")]
pub async fn eventually(what: &str, condition: impl FnMut() -> bool) {
    eventually_within(PATIENCE, what, condition).await;
}

/// [`eventually`], bounded by `limit` instead of [`PATIENCE`].
///
/// # Panics
///
/// When `condition` does not hold within `limit` of tokio's clock; the message names
/// `what` the test waited for.
#[cfg(feature = "tokio")]
pub async fn eventually_within(limit: Duration, what: &str, condition: impl FnMut() -> bool) {
    if !holds_within(limit, condition).await {
        panic!("timed out after {limit:?} waiting for {what}");
    }
}

/// Whether `condition` holds within `limit` of tokio's clock, looking at it every
/// [`POLL`]: `true` as soon as it does, `false` once `limit` has passed without it (after
/// a last look). Never panics.
#[cfg(feature = "tokio")]
pub async fn holds_within(limit: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if condition() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The output of `future`, awaited for at most `limit` of tokio's clock.
///
/// # Panics
///
/// When `future` is not ready within `limit`; the message names `what` the test waited
/// for.
#[cfg(feature = "tokio")]
pub async fn within<T>(limit: Duration, what: &str, future: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(limit, future).await {
        Ok(output) => output,
        Err(_) => panic!("timed out after {limit:?} waiting for {what}"),
    }
}

/// Blocks the thread until `condition` holds, looking at it every [`POLL_BLOCKING`]:
/// `eventually_within` for a test that has no runtime on its thread.
///
/// # Panics
///
/// When it does not hold within `limit`; the message names `what` the test waited for.
#[track_caller]
pub fn eventually_blocking(limit: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out after {limit:?} waiting for {what}");
        std::thread::sleep(POLL_BLOCKING);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn a_blocking_wait_returns_once_the_condition_holds() {
        let looks = AtomicU32::new(0);
        eventually_blocking(Duration::from_secs(5), "the third look", || {
            looks.fetch_add(1, Ordering::Relaxed) == 2
        });
        assert_eq!(looks.load(Ordering::Relaxed), 3);
    }

    #[test]
    #[should_panic(expected = "waiting for a condition that never holds")]
    fn a_blocking_wait_panics_naming_what_it_waited_for() {
        eventually_blocking(Duration::from_millis(30), "a condition that never holds", || false);
    }

    #[cfg(feature = "tokio")]
    #[tokio::test(start_paused = true)]
    async fn on_the_paused_clock_a_wait_measures_when_the_state_came_to_a_millisecond() {
        let start = tokio::time::Instant::now();
        let came = start + Duration::from_millis(73);
        assert!(holds_within(Duration::from_secs(1), || tokio::time::Instant::now() >= came).await);
        let waited = start.elapsed();
        assert!(waited >= Duration::from_millis(73) && waited <= Duration::from_millis(74), "{waited:?}");
        let before = tokio::time::Instant::now();
        assert!(!holds_within(Duration::from_secs(5), || false).await);
        assert!(before.elapsed() >= Duration::from_secs(5));
    }

    #[cfg(feature = "tokio")]
    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "timed out after 1s waiting for the answer")]
    async fn within_panics_naming_what_it_waited_for() {
        assert_eq!(within(Duration::from_secs(1), "a ready answer", async { 42 }).await, 42);
        within(Duration::from_secs(1), "the answer", std::future::pending::<()>()).await;
    }

    #[cfg(feature = "tokio")]
    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "timed out after 10s waiting for the impossible")]
    async fn eventually_panics_naming_what_it_waited_for() {
        eventually("the impossible", || false).await;
    }
}
