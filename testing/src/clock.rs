//! The machine's monotonic clock (feature `clock`), as one number every process on the
//! machine can compare.
//!
//! [`std::time::Instant`] reads the same clock on Linux but hides its value: an instant
//! cannot leave its process. A test that runs several processes and compares when things
//! happened in each (an interval of ownership that one process recorded against
//! another's) needs the value itself: [`monotonic_nanos`] is `CLOCK_MONOTONIC` in
//! nanoseconds, the same clock in every process on the machine (since boot; it never
//! goes back and is not moved by setting the wall clock, though NTP may slew its rate).
//! Readings from different machines cannot be compared.

use rustix::time::{clock_gettime, ClockId};

/// `CLOCK_MONOTONIC` now, in nanoseconds: readings taken in any process on this machine
/// are on one timeline, and never decrease.
pub fn monotonic_nanos() -> u64 {
    let now = clock_gettime(ClockId::Monotonic);
    // The kernel keeps both fields non-negative and the nanoseconds below 10^9; u64
    // nanoseconds overflow after 584 years of uptime.
    let seconds = u64::try_from(now.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(now.tv_nsec).unwrap_or(0);
    seconds.saturating_mul(1_000_000_000).saturating_add(nanos)
}
