//! The frontends' open-loop keyed load: each frontend sends a request every `1/rate`
//! seconds on a fixed schedule, whatever the answers (a key that pauses does not slow
//! the others), each bounded by the deadline; and what became of every request.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use steady_proto::MOVED_HEADER;
use steady_subset::prng::SplitMix64;
use steady_testing::echo::echo_client::EchoClient;
use steady_testing::echo::EchoRequest;
use steady_tonic::SteadyChannel;
use tokio::task::JoinHandle;

use super::owner::OWNED;
use crate::slicer_demo::workload::Popularity;

/// What became of the requests sent.
#[derive(Debug, Default)]
pub(super) struct Tally {
    /// Answered OK within the deadline.
    pub(super) satisfied: u64,
    /// ...of which by a backend that did not hold the key (eventual mode).
    pub(super) satisfied_unowned: u64,
    /// Ended with the misroute status (refused, and refused again or not routed again).
    pub(super) refused: u64,
    /// No answer within the deadline.
    pub(super) timed_out: u64,
    /// Any other error.
    pub(super) failed: u64,
    /// The satisfied requests' latencies, µs.
    pub(super) latencies_us: Vec<u32>,
}

impl Tally {
    pub(super) fn requests(&self) -> u64 {
        self.satisfied + self.refused + self.timed_out + self.failed
    }
}

/// Requests under way.
pub(super) struct Traffic {
    stop: Arc<AtomicBool>,
    drivers: Vec<JoinHandle<()>>,
    in_flight: Arc<AtomicU64>,
    tally: Arc<Mutex<Tally>>,
}

/// Starts `rate` requests a second on each of `frontends`, keys drawn from `popularity`,
/// each given up after `deadline`.
pub(super) fn start(
    frontends: &[SteadyChannel],
    popularity: Arc<Popularity>,
    rate: f64,
    deadline: Duration,
) -> Traffic {
    let stop = Arc::new(AtomicBool::new(false));
    let in_flight = Arc::new(AtomicU64::new(0));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let period = Duration::from_secs_f64(1.0 / rate.max(0.1));
    let drivers = frontends
        .iter()
        .enumerate()
        .map(|(m, channel)| {
            let client = EchoClient::new(channel.clone());
            let (stop, in_flight, tally, popularity) =
                (stop.clone(), in_flight.clone(), tally.clone(), popularity.clone());
            // The same seeds in every mode: the same keys in the same order.
            let mut rng = SplitMix64::new(0xC0_5157 + m as u64);
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(period);
                // Open loop: ticks missed while the runtime was busy are sent at once.
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                loop {
                    tick.tick().await;
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let key =
                        format!("key-{}", popularity.index((rng.next() >> 11) as f64 / (1u64 << 53) as f64));
                    in_flight.fetch_add(1, Ordering::Relaxed);
                    let (mut client, in_flight, tally) = (client.clone(), in_flight.clone(), tally.clone());
                    tokio::spawn(async move {
                        let mut request = tonic::Request::new(EchoRequest { payload: vec![OWNED; 32] });
                        request.metadata_mut().insert("x-slice-key", key.parse().expect("an ascii key"));
                        let sent = Instant::now();
                        let answer = tokio::time::timeout(deadline, client.echo(request)).await;
                        let took = sent.elapsed();
                        let mut tally = tally.lock().unwrap_or_else(|p| p.into_inner());
                        match answer {
                            Ok(Ok(reply)) => {
                                tally.satisfied += 1;
                                if reply.get_ref().payload.first() != Some(&OWNED) {
                                    tally.satisfied_unowned += 1;
                                }
                                tally.latencies_us.push(took.as_micros().min(u128::from(u32::MAX)) as u32);
                            }
                            Ok(Err(status))
                                if status.code() == tonic::Code::FailedPrecondition
                                    && status.metadata().contains_key(MOVED_HEADER) =>
                            {
                                tally.refused += 1
                            }
                            Ok(Err(_)) => tally.failed += 1,
                            Err(_) => tally.timed_out += 1,
                        }
                        drop(tally);
                        in_flight.fetch_sub(1, Ordering::Relaxed);
                    });
                }
            })
        })
        .collect();
    Traffic { stop, drivers, in_flight, tally }
}

impl Traffic {
    /// Stops sending, waits (at most `drain`) for the requests in flight, and returns
    /// what became of them all.
    pub(super) async fn finish(self, drain: Duration) -> Tally {
        self.stop.store(true, Ordering::Relaxed);
        for driver in self.drivers {
            let _ = driver.await;
        }
        let until = tokio::time::Instant::now() + drain;
        while self.in_flight.load(Ordering::Relaxed) > 0 && tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        std::mem::take(&mut *self.tally.lock().unwrap_or_else(|p| p.into_inner()))
    }
}
