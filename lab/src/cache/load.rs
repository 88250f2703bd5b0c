//! The experiment's traffic and what it records: keyed requests from the frontends, in a
//! closed loop (a fixed number of callers, each sending its next request when the last
//! one answers) or an open loop (requests at a fixed rate whatever the answers).
//!
//! Every answer is recorded with its latency, the backend that answered and the key;
//! failures are counted. Latency in the open loop runs from the request's scheduled time,
//! so a frontend that falls behind shows it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use steady_subset::prng::SplitMix64;
use steady_testing::echo::echo_client::EchoClient;
use steady_testing::echo::EchoRequest;
use steady_tonic::SteadyChannel;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use crate::slicer_demo::workload::Popularity;

/// Requests one frontend has in flight at most in the open loop; past it a request is
/// not sent and counts as failed.
const MAX_IN_FLIGHT: usize = 2_000;

/// How requests are offered.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Offered {
    /// `callers` callers per frontend, each waiting for its answer.
    Closed { callers: usize },
    /// `rate` requests per second over all frontends.
    Open { rate: f64 },
}

/// What the frontends saw, from the start of measuring.
#[derive(Debug)]
pub(crate) struct Recorder {
    start: Instant,
    measuring: bool,
    /// Every answered request's latency, µs.
    pub(crate) latencies_us: Vec<u32>,
    /// The same, per backend that answered.
    pub(crate) per_backend_us: Vec<Vec<u32>>,
    /// `key_backends[key * backends + b]`: requests for key answered by backend `b`.
    pub(crate) key_backends: Vec<u32>,
    keys: usize,
    backends: usize,
    /// Failed requests per second of measuring.
    pub(crate) failed_per_second: Vec<u64>,
    /// Answered requests per second of measuring.
    pub(crate) answered_per_second: Vec<u64>,
}

impl Recorder {
    pub(crate) fn new(keys: usize, backends: usize) -> Self {
        Self {
            start: Instant::now(),
            measuring: false,
            latencies_us: Vec::new(),
            per_backend_us: vec![Vec::new(); backends],
            key_backends: vec![0; keys * backends],
            keys,
            backends,
            failed_per_second: Vec::new(),
            answered_per_second: Vec::new(),
        }
    }

    /// Forgets the warm-up: records from now on.
    pub(crate) fn start_measuring(&mut self) {
        *self = Self { measuring: true, ..Self::new(self.keys, self.backends) };
    }

    fn second(&mut self, counts: fn(&mut Self) -> &mut Vec<u64>) -> &mut u64 {
        let s = self.start.elapsed().as_secs() as usize;
        let v = counts(self);
        if v.len() <= s {
            v.resize(s + 1, 0);
        }
        &mut v[s]
    }

    fn answered(&mut self, key: usize, backend: u32, latency: Duration) {
        if !self.measuring {
            return;
        }
        let us = latency.as_micros().min(u128::from(u32::MAX)) as u32;
        self.latencies_us.push(us);
        *self.second(|r| &mut r.answered_per_second) += 1;
        if let Some(v) = self.per_backend_us.get_mut(backend as usize) {
            v.push(us);
            self.key_backends[key * self.backends + backend as usize] += 1;
        }
    }

    fn failed(&mut self) {
        if self.measuring {
            *self.second(|r| &mut r.failed_per_second) += 1;
        }
    }

    /// Failed requests while measuring.
    pub(crate) fn failures(&self) -> u64 {
        self.failed_per_second.iter().sum()
    }

    /// For each key, the share of its requests answered by the backend that answered it
    /// most, over all requests: 1 when every key always reaches one backend.
    pub(crate) fn key_affinity(&self) -> f64 {
        let (mut most, mut all) = (0u64, 0u64);
        for key in self.key_backends.chunks(self.backends.max(1)) {
            most += u64::from(key.iter().copied().max().unwrap_or(0));
            all += key.iter().map(|&n| u64::from(n)).sum::<u64>();
        }
        if all == 0 {
            return f64::NAN;
        }
        most as f64 / all as f64
    }
}

/// The request loops of one run.
pub(crate) struct Traffic {
    stop: Arc<AtomicBool>,
    loops: Vec<JoinHandle<()>>,
}

/// One request: the key's name in the payload, and in `x-slice-key` when `keyed`.
async fn call(client: &mut EchoClient<SteadyChannel>, key: &str, keyed: bool) -> Result<u32, tonic::Status> {
    let mut request = tonic::Request::new(EchoRequest { payload: key.as_bytes().to_vec() });
    if keyed {
        request.metadata_mut().insert("x-slice-key", key.parse().expect("an ascii key"));
    }
    Ok(client.echo(request).await?.into_inner().task)
}

/// One request from `channel`, recorded into `recorder` against `scheduled`.
async fn request(
    channel: SteadyChannel,
    popularity: &Popularity,
    rng: &mut SplitMix64,
    keyed: bool,
    recorder: &Mutex<Recorder>,
    scheduled: Instant,
) {
    let key = popularity.index((rng.next() >> 11) as f64 / (1u64 << 53) as f64);
    let name = format!("key-{key}");
    let mut client = EchoClient::new(channel);
    let outcome = call(&mut client, &name, keyed).await;
    let mut recorder = recorder.lock().expect("not poisoned");
    match outcome {
        Ok(task) => recorder.answered(key, task, scheduled.elapsed()),
        Err(_) => recorder.failed(),
    }
}

impl Traffic {
    /// Starts the loops of every frontend in `channels`.
    pub(crate) fn start(
        channels: &[SteadyChannel],
        offered: Offered,
        keyed: bool,
        popularity: Arc<Popularity>,
        recorder: Arc<Mutex<Recorder>>,
        seed: u64,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let mut loops = Vec::new();
        for (m, channel) in channels.iter().enumerate() {
            let (stop, popularity, recorder, channel) =
                (stop.clone(), popularity.clone(), recorder.clone(), channel.clone());
            match offered {
                Offered::Closed { callers } => {
                    for c in 0..callers {
                        let (stop, popularity, recorder, channel) =
                            (stop.clone(), popularity.clone(), recorder.clone(), channel.clone());
                        let mut rng = SplitMix64::new(seed ^ ((m * 1024 + c) as u64));
                        loops.push(tokio::spawn(async move {
                            while !stop.load(Ordering::Relaxed) {
                                let now = Instant::now();
                                request(channel.clone(), &popularity, &mut rng, keyed, &recorder, now).await;
                            }
                        }));
                    }
                }
                Offered::Open { rate } => {
                    let period = Duration::from_secs_f64(channels.len() as f64 / rate.max(1.0));
                    let mut rng = SplitMix64::new(seed ^ ((m * 1024) as u64));
                    loops.push(tokio::spawn(async move {
                        let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
                        let mut ticks = tokio::time::interval(period);
                        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                        while !stop.load(Ordering::Relaxed) {
                            let scheduled = ticks.tick().await.into_std();
                            let Ok(permit) = in_flight.clone().try_acquire_owned() else {
                                recorder.lock().expect("not poisoned").failed();
                                continue;
                            };
                            let mut own = SplitMix64::new(rng.next());
                            let (popularity, recorder, channel) =
                                (popularity.clone(), recorder.clone(), channel.clone());
                            tokio::spawn(async move {
                                request(channel, &popularity, &mut own, keyed, &recorder, scheduled).await;
                                drop(permit);
                            });
                        }
                        // Wait (bounded) for the requests in flight to finish.
                        let _ = tokio::time::timeout(
                            Duration::from_secs(10),
                            in_flight.acquire_many(MAX_IN_FLIGHT as u32),
                        )
                        .await;
                    }));
                }
            }
        }
        Self { stop, loops }
    }

    /// Stops the loops and waits (at most 10 s each) for what is in flight.
    pub(crate) async fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for l in self.loops {
            let _ = tokio::time::timeout(Duration::from_secs(11), l).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_affinity_is_the_share_of_requests_reaching_each_key_s_most_common_backend() {
        let mut r = Recorder::new(3, 2);
        r.answered(0, 0, Duration::from_millis(1)); // nothing before measuring
        r.start_measuring();
        assert!(r.key_affinity().is_nan());
        for (key, backend) in [(0, 0), (0, 0), (0, 1), (1, 1), (2, 0), (2, 1)] {
            r.answered(key, backend, Duration::from_millis(1));
        }
        // key 0: 2 of 3, key 1: 1 of 1, key 2: 1 of 2 -> 4 of 6.
        assert!((r.key_affinity() - 4.0 / 6.0).abs() < 1e-12);
        assert_eq!(r.latencies_us.len(), 6);
        assert_eq!(r.per_backend_us.iter().map(Vec::len).collect::<Vec<_>>(), [3, 3]);
        // An answer naming no backend of the fleet counts for latency only.
        r.answered(1, 9, Duration::from_millis(1));
        assert_eq!(r.latencies_us.len(), 7);
        r.failed();
        assert_eq!(r.failures(), 1);
    }
}
