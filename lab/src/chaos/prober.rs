//! The prober: every second, each running steady-slicer instance's `/metrics` page
//! (answered at all; who leads; whether the leader's Assigner runs; whether its load
//! collector accepts reports), and every process's resident memory; and, after a
//! certificate rotation, whether a server lets in a certificate of the dropped CA.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use steady_testing::echo::echo_client::EchoClient;
use steady_testing::echo::EchoRequest;
use tonic::transport::{ClientTlsConfig, Endpoint};
use tonic::Code;

use super::memory::rss_kib;
use super::roster::{lock, Life, Roster, GRACE};
use super::Observations;

/// What the prober last saw of one steady-slicer instance's life.
#[derive(Debug, Clone, Copy)]
struct Seen {
    pid: u32,
    answered: Instant,
    /// Since when it leads, by its page (`None`: it does not).
    leading: Option<Instant>,
    accepted: u64,
    accepted_at: Instant,
}

/// The prober's loop: the instances' pages, and every process's memory.
pub(super) fn probe(
    roster: &Roster,
    metrics: &[SocketAddr],
    observations: &Mutex<Observations>,
    stop: &AtomicBool,
    began: Instant,
) {
    let mut seen: Vec<Option<Seen>> = vec![None; metrics.len()];
    let mut runs: Vec<u64> = vec![0; metrics.len()];
    let (mut led_at, mut ran_at) = (Instant::now(), Instant::now());
    let mut next = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        if Instant::now() < next {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        next += Duration::from_secs(1);
        let slicers = roster.lock().slicers.clone();
        let mut gaps = Vec::new();
        for (i, m) in slicers.iter().enumerate() {
            let (Some(pid), Life::Up) = (m.pid, m.life) else { continue };
            let page = http_get(metrics[i], "/metrics");
            let now = Instant::now();
            let mut s = seen[i].filter(|s| s.pid == pid).unwrap_or(Seen {
                pid,
                answered: m.since,
                leading: None,
                accepted: 0,
                accepted_at: m.since,
            });
            // The time since its last answer, at each probe (a probe a second: a
            // healthy page shows about a second).
            let unanswered = now - s.answered;
            if let Some(page) = page {
                s.answered = now;
                if metric(&page, "steady_assigner_leader", "").unwrap_or(0.0) >= 1.0 {
                    led_at = now;
                    s.leading.get_or_insert(now);
                } else {
                    s.leading = None;
                }
                let r = metric(&page, "steady_assigner_runs_total", "").unwrap_or(0.0) as u64;
                if r != runs[i] {
                    runs[i] = r;
                    ran_at = now;
                }
                let accepted =
                    metric(&page, "steady_collector_reports_total", "accepted").unwrap_or(0.0) as u64;
                if accepted > s.accepted {
                    s.accepted = accepted;
                    s.accepted_at = now;
                }
            }
            // A standby's collector drops every report (its book knows the job only
            // once it publishes): only the leader's must accept them.
            let collected =
                s.leading.filter(|since| now - *since >= GRACE).map(|since| now - s.accepted_at.max(since));
            if now - m.since >= GRACE {
                gaps.push((m.name.clone(), unanswered, collected));
            }
            seen[i] = Some(s);
        }
        let processes = roster.lock().processes();
        let at = began.elapsed().as_secs_f64();
        let mut samples: Vec<(String, u32, u64)> =
            processes.into_iter().filter_map(|(name, pid)| Some((name, pid, rss_kib(pid)?))).collect();
        if let Some(kib) = rss_kib(std::process::id()) {
            samples.push(("lab".to_owned(), std::process::id(), kib));
        }
        let now = Instant::now();
        let mut o = lock(observations);
        for (name, page, collected) in gaps {
            o.page_gap.observe(page, &name);
            if let Some(collected) = collected {
                o.collector_gap.observe(collected, &name);
            }
        }
        o.leaderless.observe(now - led_at, "control plane");
        o.runless.observe(now - ran_at, "control plane");
        for (name, pid, kib) in samples {
            o.memory.record(&name, pid, at, kib);
        }
    }
}

/// Whether the steady-slicer instance whose pages are at `metrics` says it leads.
pub(super) fn leads(metrics: SocketAddr) -> bool {
    http_get(metrics, "/metrics").and_then(|page| metric(&page, "steady_assigner_leader", "")).unwrap_or(0.0)
        >= 1.0
}

/// The value of the first sample of `name` whose labels contain `label` (a Prometheus
/// text page).
fn metric(page: &str, name: &str, label: &str) -> Option<f64> {
    page.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' ')))
        .find(|l| l.contains(label))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// The body of `GET path` at `addr` over plain HTTP/1.1, or `None` when it does not
/// answer 200 within two seconds.
fn http_get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream.set_write_timeout(Some(Duration::from_secs(1))).ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    let mut response = String::new();
    stream.take(8 << 20).read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_owned())
}

/// Whether the server at `addr` (an instance or a backend, on TLS) lets in a client
/// presenting `tls`: what it answered when it did (an echo, or the status of a service
/// it does not serve: its TLS let the call through), `None` when the handshake or the
/// first call on the connection failed.
pub(super) async fn accepts(addr: &str, tls: ClientTlsConfig) -> Option<String> {
    let endpoint = Endpoint::from_shared(format!("https://{addr}"))
        .ok()?
        .tls_config(tls)
        .ok()?
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(2));
    let channel = endpoint.connect().await.ok()?;
    let request = EchoRequest { payload: b"stale".to_vec() };
    match EchoClient::new(channel).echo(request).await {
        Ok(_) => Some("an echo".to_owned()),
        // In TLS 1.3 the server checks the client's certificate after the client's half
        // of the handshake: a refusal shows on the first call, as a transport error.
        Err(status) if status.code() == Code::Unimplemented => Some(format!("{:?}", status.code())),
        Err(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_metric_is_read_by_name_and_label() {
        let page = "# TYPE steady_assigner_runs_total counter\n\
                    steady_assigner_runs_total{steady_job=\"chaos\"} 17\n\
                    steady_assigner_leader{steady_job=\"chaos\"} 1\n\
                    steady_collector_reports_total{steady_outcome=\"dropped\"} 4\n\
                    steady_collector_reports_total{steady_outcome=\"accepted\"} 40\n";
        assert_eq!(metric(page, "steady_assigner_runs_total", ""), Some(17.0));
        assert_eq!(metric(page, "steady_assigner_leader", ""), Some(1.0));
        assert_eq!(metric(page, "steady_collector_reports_total", "accepted"), Some(40.0));
        assert_eq!(metric(page, "steady_assigner_runs", ""), None);
    }
}
