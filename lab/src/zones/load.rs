//! The traffic and what it records: every frontend sends the same open-loop rate (so a
//! zone's demand is its share of the frontends, whatever the latencies), and each
//! answer is recorded by the frontend's zone and the backend that served it, in the
//! phase it ended in.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use steady_subset::prng::SplitMix64;
use steady_testing::echo::echo_client::EchoClient;
use steady_testing::echo::{EchoRequest, KEY_HEADER};
use steady_tonic::SteadyChannel;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use super::fleet::{zone_of_backend, Traffic, ZONES};

/// Requests one frontend has in flight at most; past it a request is not sent and
/// counts as failed (a zone whose requests all wait cannot grow memory without bound).
const MAX_IN_FLIGHT: usize = 500;
/// A request not answered in this long counts as failed (the balancer's own waits
/// end sooner).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Answers in the first second of a phase count as failures only: the cross-zone share
/// and the balance are measured once the change has been seen.
pub(crate) const SETTLE: Duration = Duration::from_secs(1);

/// What one group of frontends (one strategy, one kind of traffic) saw in one phase.
#[derive(Debug, Clone, Default)]
pub(crate) struct PhaseCounts {
    /// `served[frontend zone][backend]`: answers after the first second.
    pub(crate) served: Vec<Vec<u64>>,
    /// Failed requests in the whole phase.
    pub(crate) failed: u64,
    /// Failed requests after its first second.
    pub(crate) failed_late: u64,
    /// `[crossed, answered]` in each second of the phase, the first included.
    pub(crate) per_second: Vec<[u64; 2]>,
    /// Failed requests in each second of the phase, the first included.
    pub(crate) failed_per_second: Vec<u64>,
}

/// The counts of one group, phase by phase.
#[derive(Debug)]
pub(crate) struct Recorder {
    backends: usize,
    started: Instant,
    phases: Vec<PhaseCounts>,
}

impl Recorder {
    pub(crate) fn new(backends: usize) -> Self {
        Self { backends, started: Instant::now(), phases: Vec::new() }
    }

    /// Starts the next phase's counts now; answers before the first phase are not kept.
    pub(crate) fn begin_phase(&mut self) {
        self.started = Instant::now();
        self.phases.push(PhaseCounts {
            served: vec![vec![0; self.backends]; ZONES.len()],
            ..PhaseCounts::default()
        });
    }

    /// The counts of every phase begun.
    pub(crate) fn phases(&self) -> &[PhaseCounts] {
        &self.phases
    }

    fn settled(&self) -> bool {
        self.started.elapsed() >= SETTLE
    }

    fn answered(&mut self, zone: usize, backend: u32) {
        let second = self.started.elapsed().as_secs() as usize;
        let settled = self.settled();
        let Some(p) = self.phases.last_mut() else { return };
        let Some(count) = p.served[zone].get_mut(backend as usize) else { return };
        if settled {
            *count += 1;
        }
        if p.per_second.len() <= second {
            p.per_second.resize(second + 1, [0, 0]);
        }
        p.per_second[second][0] += u64::from(zone_of_backend(backend as usize) != zone);
        p.per_second[second][1] += 1;
    }

    fn failed(&mut self) {
        let second = self.started.elapsed().as_secs() as usize;
        let settled = self.settled();
        if let Some(p) = self.phases.last_mut() {
            p.failed += 1;
            p.failed_late += u64::from(settled);
            if p.failed_per_second.len() <= second {
                p.failed_per_second.resize(second + 1, 0);
            }
            p.failed_per_second[second] += 1;
        }
    }
}

/// One request through `channel`, recorded.
async fn request(channel: SteadyChannel, zone: usize, key: Option<u64>, recorder: &Mutex<Recorder>) {
    let mut request = tonic::Request::new(EchoRequest { payload: vec![7; 16] });
    if let Some(key) = key {
        request.metadata_mut().insert(KEY_HEADER, format!("{key:016x}").parse().expect("hex is ASCII"));
    }
    let answer = tokio::time::timeout(REQUEST_TIMEOUT, EchoClient::new(channel).echo(request)).await;
    let mut recorder = recorder.lock().expect("not poisoned");
    match answer {
        Ok(Ok(reply)) => recorder.answered(zone, reply.into_inner().task),
        _ => recorder.failed(),
    }
}

/// The loops sending every frontend's requests.
pub(crate) struct Load {
    stop: Arc<AtomicBool>,
    loops: Vec<JoinHandle<()>>,
}

impl Load {
    pub(crate) fn new() -> Self {
        Self { stop: Arc::new(AtomicBool::new(false)), loops: Vec::new() }
    }

    /// Starts a frontend in `zone` sending `rate` requests per second through `channel`.
    pub(crate) fn start(
        &mut self,
        channel: SteadyChannel,
        zone: usize,
        traffic: Traffic,
        rate: f64,
        recorder: Arc<Mutex<Recorder>>,
        seed: u64,
    ) {
        let stop = self.stop.clone();
        let period = Duration::from_secs_f64(1.0 / rate.max(0.1));
        self.loops.push(tokio::spawn(async move {
            let mut rng = SplitMix64::new(seed);
            let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
            // Frontends started together do not send in lockstep.
            tokio::time::sleep(period.mul_f64((rng.next() % 1000) as f64 / 1000.0)).await;
            let mut ticks = tokio::time::interval(period);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            while !stop.load(Ordering::Relaxed) {
                ticks.tick().await;
                let Ok(permit) = in_flight.clone().try_acquire_owned() else {
                    recorder.lock().expect("not poisoned").failed();
                    continue;
                };
                let key = (traffic == Traffic::Keyed).then(|| rng.next());
                let (channel, recorder) = (channel.clone(), recorder.clone());
                tokio::spawn(async move {
                    request(channel, zone, key, &recorder).await;
                    drop(permit);
                });
            }
            // Wait (bounded) for the requests in flight.
            let _ = tokio::time::timeout(REQUEST_TIMEOUT, in_flight.acquire_many(MAX_IN_FLIGHT as u32)).await;
        }));
    }

    /// Stops every loop and waits for what is in flight.
    pub(crate) async fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for l in self.loops {
            let _ = tokio::time::timeout(REQUEST_TIMEOUT + Duration::from_secs(1), l).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_count_once_the_phase_settles_and_failures_always() {
        let mut r = Recorder::new(12);
        r.answered(0, 3); // before any phase: dropped
        r.failed();
        r.begin_phase();
        r.answered(0, 3); // the first second: not counted as served
        r.answered(1, 3); // zone b's frontend, zone a's backend
        r.failed();
        assert_eq!(r.phases()[0].served[0][3], 0);
        assert_eq!(r.phases()[0].per_second, [[1, 2]]);
        assert_eq!((r.phases()[0].failed, r.phases()[0].failed_late), (1, 0));
        r.started -= SETTLE;
        r.answered(1, 7);
        r.answered(1, 99); // no such backend: ignored
        r.failed();
        let p = &r.phases()[0];
        assert_eq!(p.served[1][7], 1);
        assert_eq!(p.served.iter().flatten().sum::<u64>(), 1);
        assert_eq!((p.failed, p.failed_late), (2, 1));
        assert_eq!((p.failed_per_second[0], p.failed_per_second.last()), (1, Some(&1)));
        assert_eq!(p.per_second[0], [1, 2]);
        assert_eq!(p.per_second.last(), Some(&[0, 1]));
    }
}
