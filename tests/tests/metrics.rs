//! The instruments, read as a scrape reads them (`steady_slicer_server::status::MetricsRegistry`,
//! Prometheus text): a balancer's series follow its membership and its requests, stop
//! once it is dropped, and stay bounded (one series per member, no address); discovery's
//! counters appear under the job.

use std::convert::Infallible;
use std::time::Duration;

use steady_balance::{Balance, BalanceConfig, JobView, Locality, Zone, ZoneRouting, ZoneSizes};
use steady_slicer_server::status::MetricsRegistry;
use steady_testing::holds_within;
use steady_testing::wait::PATIENCE;
use tower::{service_fn, Service, ServiceExt};

/// The value of the one sample of `text` that starts with `series` (name and labels).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series).and_then(|rest| rest.trim().parse().ok()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_balancer_s_series_follow_its_members_and_requests_and_end_with_it() {
    let registry = MetricsRegistry::new();
    let n = 5;
    let connect = service_fn(|_address: String| async {
        Ok::<_, Infallible>(service_fn(|req: u64| std::future::ready(Ok::<_, Infallible>(req))))
    });
    let addresses: Vec<String> = (0..n).map(|i| format!("10.0.0.{i}:80")).collect();
    let mut balance = Balance::from_addresses(BalanceConfig::new(0, 3), connect, addresses).unwrap();
    assert!(balance.wait_for_members(3, Duration::from_secs(10)).await);
    balance.observe_metrics(&registry.meter(), "users");
    for i in 0..10u64 {
        balance.ready().await.unwrap().call(i).await.unwrap();
    }
    let text = registry.render();
    let target = "{grpc_target=\"users\"}";
    assert_eq!(sample(&text, &format!("steady_lb_requests_total{target}")), Some(10.0), "{text}");
    assert_eq!(sample(&text, &format!("steady_lb_subset_size{target}")), Some(3.0));
    assert_eq!(sample(&text, &format!("grpc_subchannel_open_connections{target}")), Some(3.0));
    assert_eq!(
        sample(&text, &format!("grpc_subchannel_connection_attempts_succeeded_total{target}")),
        Some(3.0)
    );
    assert_eq!(sample(&text, "steady_lb_members{grpc_target=\"users\",steady_state=\"ready\"}"), Some(3.0));
    // One series per member, labelled by task index only: no address is a label.
    let per_member: Vec<&str> =
        text.lines().filter(|l| l.starts_with("steady_lb_member_requests_total{")).collect();
    assert_eq!(per_member.len(), 3, "{per_member:?}");
    assert!(per_member.iter().all(|l| l.contains("steady_task=\"") && !l.contains("10.0.0.")));
    let total: f64 = per_member.iter().map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap()).sum();
    assert_eq!(total, 10.0);
    // Nothing before the first assignment.
    assert!(!text.contains("steady_lb_assignment_generation"), "{text}");
    // Dropped, the balancer's control task ends soon after (it holds the shared state
    // until then); from then on its instruments report nothing.
    drop(balance);
    let ended = holds_within(PATIENCE, || !registry.render().contains("grpc_target=\"users\"")).await;
    assert!(ended, "a dropped balancer still reports: {}", registry.render());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zone_aware_balancer_reports_what_it_keeps_in_its_zone_and_spills_to_each_other() {
    let registry = MetricsRegistry::new();
    let connect = service_fn(|_address: String| async {
        Ok::<_, Infallible>(service_fn(|req: u64| std::future::ready(Ok::<_, Infallible>(req))))
    });
    // Two zones of two backends; frontends 3/1: zone a keeps two thirds and spills a third.
    let (a, b) = (Zone::new("a").unwrap(), Zone::new("b").unwrap());
    let view = JobView::serving((0..4).map(|i| format!("10.0.0.{i}:80")))
        .with_locality(0, Locality::new(a.clone(), 0))
        .with_locality(1, Locality::new(a.clone(), 1))
        .with_locality(2, Locality::new(b.clone(), 0))
        .with_locality(3, Locality::new(b.clone(), 1));
    let frontends = ZoneSizes::new().with(a.clone(), 3).with(b, 1);
    let config = BalanceConfig::new(0, 2).with_zones(ZoneRouting::new(a, frontends));
    let balance = Balance::new(config, connect, tokio_stream::iter([view])).unwrap();
    balance.observe_metrics(&registry.meter(), "users");
    let spilling =
        holds_within(PATIENCE, || balance.stats().spill.first().is_some_and(|z| z.members.len() == 2)).await;
    assert!(spilling, "{:?}", balance.stats());
    let text = registry.render();
    let local = sample(&text, "steady_lb_zone_local_share{grpc_target=\"users\"}").unwrap();
    assert!((local - 2.0 / 3.0).abs() < 1e-6, "{text}");
    let spilled =
        sample(&text, "steady_lb_zone_spill_share{grpc_target=\"users\",steady_zone=\"b\"}").unwrap();
    assert!((spilled - 1.0 / 3.0).abs() < 1e-6, "{text}");
}

#[test]
fn discovery_s_counters_appear_under_the_job() {
    let registry = MetricsRegistry::new();
    let counters = steady_discovery::dns::DnsCounters::default();
    counters.observe_metrics(&registry.meter(), "web");
    let text = registry.render();
    assert_eq!(
        sample(&text, "steady_discovery_dns_resolutions_total{steady_job=\"web\"}"),
        Some(0.0),
        "{text}"
    );
    assert_eq!(sample(&text, "steady_discovery_dns_failures_total{steady_job=\"web\"}"), Some(0.0));
}
