//! `clock::monotonic_nanos`: CLOCK_MONOTONIC, the same timeline in every process.

use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use steady_testing::clock::monotonic_nanos;

#[test]
fn readings_never_decrease() {
    let mut last = monotonic_nanos();
    assert!(last > 0);
    for _ in 0..1000 {
        let now = monotonic_nanos();
        assert!(now >= last, "{now} after {last}");
        last = now;
    }
}

#[test]
fn it_measures_what_std_instant_measures_to_a_millisecond() {
    // std's Instant reads CLOCK_MONOTONIC too: over a span, both agree. The best of a few
    // spans, so that the thread being preempted between two readings does not count.
    let mut best = Duration::MAX;
    for _ in 0..5 {
        let (start, start_nanos) = (Instant::now(), monotonic_nanos());
        std::thread::sleep(Duration::from_millis(20)); // The span measured, not a wait for a state.
        let (elapsed_nanos, elapsed) = (monotonic_nanos() - start_nanos, start.elapsed());
        assert!(elapsed >= Duration::from_millis(20), "{elapsed:?}");
        best = best.min(Duration::from_nanos(elapsed_nanos).abs_diff(elapsed));
    }
    assert!(best < Duration::from_millis(1), "{best:?} apart over 20 ms");
}

#[test]
fn it_is_not_the_wall_clock() {
    // CLOCK_MONOTONIC counts from boot, not from 1970.
    let wall = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let monotonic = Duration::from_nanos(monotonic_nanos());
    assert!(wall.abs_diff(monotonic) > Duration::from_secs(365 * 24 * 3600), "{monotonic:?} is the date");
}

/// Set in a child process this test binary runs: the child prints one reading.
const CHILD: &str = "STEADY_TESTING_CLOCK_CHILD";

#[test]
fn another_process_reads_the_same_timeline() {
    if std::env::var_os(CHILD).is_some() {
        println!("monotonic_nanos={}", monotonic_nanos());
        return;
    }
    let before = monotonic_nanos();
    let output = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "another_process_reads_the_same_timeline", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let after = monotonic_nanos();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "the child failed: {stdout}");
    let reading: u64 = stdout
        .lines()
        .find_map(|line| line.split_once("monotonic_nanos=").map(|(_, reading)| reading.trim()))
        .unwrap_or_else(|| panic!("no reading in the child's output: {stdout}"))
        .parse()
        .unwrap();
    // The child read the clock after it started and before it exited: between ours.
    assert!(before < reading && reading < after, "{before} < {reading} < {after}");
}
