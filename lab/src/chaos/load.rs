//! The soak's frontends and their load: `SteadyChannel`s in the lab's process that follow
//! the backend job in the etcd registry and the assignments of every steady-slicer
//! instance (whichever has the newest: one instance dead, the other still serves them),
//! sending keyed and unkeyed requests open loop at a fixed rate, each bounded by a
//! deadline. What became of the requests is counted per window: the schedule opens one
//! per fault, and a request counts in the window it was sent in.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use steady_balance::BalanceConfig;
use steady_discovery::registry::{self, Registry, RegistryConfig};
use steady_discovery::Discovery;
use steady_proto::tls::ClientTlsSource;
use steady_proto::WatchEndpoint;
use steady_subset::prng::SplitMix64;
use steady_testing::echo::echo_client::EchoClient;
use steady_testing::echo::EchoRequest;
use steady_tonic::{EndpointTemplate, SteadyChannel};
use tokio::task::JoinHandle;
use tonic::transport::Endpoint;

use crate::slicer_demo::workload::Popularity;

/// Latency buckets: bucket `i` holds latencies below `2^((i+1)/4)` µs (the last, the rest).
const BUCKETS: usize = 100;
/// How long past its deadline a call is waited for (the channel ends it at the deadline).
const NET: Duration = Duration::from_millis(500);
/// The errors kept per window, to show what failed.
const ERRORS_KEPT: usize = 3;
/// The hot keys move this often (through a few rankings, over and over: the lab's own
/// memory must not grow with the run).
const SHIFT_EVERY: Duration = Duration::from_secs(10);
const RANKINGS: u64 = 6;

/// The frontends' channels (and the registry watches they follow).
pub(super) struct Frontends {
    pub(super) channels: Vec<SteadyChannel>,
    _views: Vec<Discovery>,
}

impl Frontends {
    /// `count` frontends of `backends` backend tasks of `job`: each follows the job in the
    /// registry on `etcd` (a watch of its own) and the assignments of `slicers`, and
    /// gives every call `deadline`.
    pub(super) async fn start(
        etcd: &[String],
        job: &str,
        slicers: &[String],
        count: usize,
        backends: usize,
        deadline: Duration,
        tls: Option<ClientTlsSource>,
    ) -> Result<Self, Box<dyn std::error::Error>> {
        let registry = Registry::connect(RegistryConfig::new(etcd.to_vec())).await?;
        let mut slicers: Vec<WatchEndpoint> = slicers
            .iter()
            .map(|s| Endpoint::from_shared(s.clone()).map(WatchEndpoint::new))
            .collect::<Result<_, _>>()?;
        let mut template = EndpointTemplate::new().timeout(deadline);
        if let Some(tls) = tls {
            slicers = slicers.into_iter().map(|s| s.tls(tls.clone())).collect();
            template = template.tls_source(tls);
        }
        let mut channels = Vec::new();
        let mut views = Vec::new();
        for m in 0..count {
            let view = registry::watch_job(&registry, job).await?;
            // k = every backend: each frontend keeps a connection to each. The deadline
            // is the channel's own: a call that passes it is a timeout the balancer sees
            // (outlier ejection), where a call its caller gives up on says nothing.
            let channel = SteadyChannel::builder(BalanceConfig::new(m, backends))
                .endpoint_template(template.clone())
                .from_addresses(view.views())?;
            channel.follow_assignments(steady_proto::watch_assignments_any(
                slicers.clone(),
                job,
                Default::default(),
            )?);
            channels.push(channel);
            views.push(view);
        }
        Ok(Self { channels, _views: views })
    }

    /// The generation each frontend routes keyed requests by (0 before the first).
    pub(super) fn generations(&self) -> Vec<u64> {
        self.channels.iter().map(|c| c.balance().assignment_generation().unwrap_or(0)).collect()
    }
}

/// What became of the requests sent in one window.
#[derive(Debug, Clone)]
pub(super) struct Counts {
    pub(super) sent: u64,
    pub(super) ok: u64,
    /// Answered with an error.
    pub(super) failed: u64,
    /// No answer within the deadline.
    pub(super) timed_out: u64,
    /// Of the failed and timed out, keyed requests.
    pub(super) lost_keyed: u64,
    /// Sent and not ended yet.
    in_flight: u64,
    /// The answered requests' latencies (see [`BUCKETS`]).
    latency: Vec<u64>,
    /// The first few errors: which kind of request, when it was sent, what it got.
    pub(super) errors: Vec<String>,
}

impl Default for Counts {
    fn default() -> Self {
        Self {
            sent: 0,
            ok: 0,
            failed: 0,
            timed_out: 0,
            lost_keyed: 0,
            in_flight: 0,
            latency: vec![0; BUCKETS],
            errors: Vec::new(),
        }
    }
}

impl Counts {
    /// Requests that did not succeed: failed or timed out.
    pub(super) fn lost(&self) -> u64 {
        self.failed + self.timed_out
    }

    /// The latency below which a share `q` of the answered requests fell (a bucket's
    /// upper edge: within 19%).
    pub(super) fn latency(&self, q: f64) -> Duration {
        let total: u64 = self.latency.iter().sum();
        let mut seen = 0;
        for (i, n) in self.latency.iter().enumerate() {
            seen += n;
            if total > 0 && seen as f64 >= q * total as f64 {
                return Duration::from_micros(2f64.powf((i + 1) as f64 / 4.0) as u64);
            }
        }
        Duration::ZERO
    }

    fn record(&mut self, answer: Result<Duration, String>, timed_out: bool, keyed: bool) {
        self.in_flight = self.in_flight.saturating_sub(1);
        match answer {
            Ok(took) => {
                self.ok += 1;
                let micros = took.as_micros().max(1) as f64;
                self.latency[((micros.log2() * 4.0) as usize).min(BUCKETS - 1)] += 1;
            }
            Err(error) => {
                self.lost_keyed += u64::from(keyed);
                if timed_out {
                    self.timed_out += 1;
                } else {
                    self.failed += 1;
                }
                if self.errors.len() < ERRORS_KEPT {
                    self.errors.push(error);
                }
            }
        }
    }
}

/// The windows requests are counted in; window 0 is before the first fault.
#[derive(Debug)]
pub(super) struct Windows {
    /// When the load started: errors are stamped from it.
    started: Instant,
    current: AtomicUsize,
    counts: Mutex<Vec<Counts>>,
}

impl Windows {
    fn new() -> Self {
        Self {
            started: Instant::now(),
            current: AtomicUsize::new(0),
            counts: Mutex::new(vec![Counts::default()]),
        }
    }

    /// Opens the next window; requests sent from now on count in it. Then waits (at most
    /// `within`) until the requests of the window before have all ended, so that a fault
    /// done next does not harm requests counted before it. Returns the new window's index.
    pub(super) fn open(&self, within: Duration) -> usize {
        let index = {
            let mut counts = self.lock();
            counts.push(Counts::default());
            let index = counts.len() - 1;
            self.current.store(index, Ordering::Release);
            index
        };
        let deadline = Instant::now() + within;
        while self.lock()[index - 1].in_flight > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        index
    }

    /// Every window's counts so far.
    pub(super) fn snapshot(&self) -> Vec<Counts> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Counts>> {
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The load under way.
pub(super) struct Traffic {
    pub(super) windows: Arc<Windows>,
    stop: Arc<AtomicBool>,
    drivers: Vec<JoinHandle<()>>,
    in_flight: Arc<AtomicU64>,
}

/// Starts the load on every frontend: `keyed` keyed requests a second (keys `key-<i>`
/// of `keys`, Zipf popularity whose ranking moves every 10 s) and `unkeyed` unkeyed
/// ones, each given up after `deadline`.
pub(super) fn start(
    frontends: &Frontends,
    keyed: u32,
    unkeyed: u32,
    keys: usize,
    deadline: Duration,
) -> Traffic {
    let windows = Arc::new(Windows::new());
    let stop = Arc::new(AtomicBool::new(false));
    let in_flight = Arc::new(AtomicU64::new(0));
    let popularity = Arc::new(Popularity::new(keys.max(1), 1.0));
    let mut drivers = Vec::new();
    let shift = popularity.clone();
    let stopped = stop.clone();
    drivers.push(tokio::spawn(async move {
        let mut tick = tokio::time::interval(SHIFT_EVERY);
        tick.tick().await;
        while !stopped.load(Ordering::Relaxed) {
            tick.tick().await;
            let next = (shift.epoch.load(Ordering::Relaxed) + 1) % RANKINGS;
            shift.epoch.store(next, Ordering::Relaxed);
        }
    }));
    for (m, channel) in frontends.channels.iter().enumerate() {
        for (rate, is_keyed) in [(keyed, true), (unkeyed, false)] {
            if rate == 0 {
                continue;
            }
            let client = EchoClient::new(channel.clone());
            let (stop, in_flight, windows, popularity) =
                (stop.clone(), in_flight.clone(), windows.clone(), popularity.clone());
            let mut rng = SplitMix64::new(0xC4A05 + 2 * m as u64 + u64::from(is_keyed));
            drivers.push(tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate)));
                // Open loop: ticks missed while the runtime was busy are sent at once.
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                while !stop.load(Ordering::Relaxed) {
                    tick.tick().await;
                    let mut request = tonic::Request::new(EchoRequest { payload: vec![7; 16] });
                    if is_keyed {
                        let u = (rng.next() >> 11) as f64 / (1u64 << 53) as f64;
                        let key = format!("key-{}", popularity.index(u));
                        request.metadata_mut().insert("x-slice-key", key.parse().expect("an ascii key"));
                    }
                    // Counted under the lock `Windows::open` switches windows under: a
                    // window's requests in flight are known once the next one is open.
                    let window = {
                        let mut counts = windows.lock();
                        let window = windows.current.load(Ordering::Acquire);
                        counts[window].sent += 1;
                        counts[window].in_flight += 1;
                        window
                    };
                    in_flight.fetch_add(1, Ordering::Relaxed);
                    let (mut client, in_flight, windows) =
                        (client.clone(), in_flight.clone(), windows.clone());
                    tokio::spawn(async move {
                        let sent = Instant::now();
                        // The channel ends a call at the deadline; this bound is a net
                        // under it (a call the channel never ended is counted too).
                        let answer = tokio::time::timeout(deadline + NET, client.echo(request)).await;
                        let (answer, timed_out) = match answer {
                            Ok(Ok(_)) => (Ok(sent.elapsed()), false),
                            Ok(Err(status)) => {
                                let timed_out = sent.elapsed() >= deadline;
                                (Err(format!("{:?}: {}", status.code(), status.message())), timed_out)
                            }
                            Err(_) => (Err(format!("no answer within {:?}", deadline + NET)), true),
                        };
                        // Which request, sent when (from the load's start).
                        let answer = match answer {
                            Ok(took) => Ok(took),
                            Err(error) => Err(format!(
                                "{} sent at {:.2} s: {error}",
                                if is_keyed { "keyed" } else { "unkeyed" },
                                (sent - windows.started).as_secs_f64()
                            )),
                        };
                        windows.lock()[window].record(answer, timed_out, is_keyed);
                        in_flight.fetch_sub(1, Ordering::Relaxed);
                    });
                }
            }));
        }
    }
    Traffic { windows, stop, drivers, in_flight }
}

impl Traffic {
    /// Stops sending, waits (at most `drain`) for the requests in flight, and returns
    /// every window's counts.
    pub(super) async fn finish(self, drain: Duration) -> Vec<Counts> {
        self.stop.store(true, Ordering::Relaxed);
        for driver in self.drivers {
            driver.abort();
        }
        let until = tokio::time::Instant::now() + drain;
        while self.in_flight.load(Ordering::Relaxed) > 0 && tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.windows.snapshot()
    }
}
