//! [`HeldLease`]'s two modes on a real etcd on 127.0.0.1 (`steady_testing::Etcd`,
//! skipped when etcd is missing unless STEADY_REQUIRE_ETCD is set), killed (SIGKILL) and
//! restarted on its data: a strict lease (a lock) is lost at its own deadline while etcd
//! is down, and survives an outage shorter than its TTL because a failed renewal is
//! retried soon; a tolerant lease (an identity) lives through an outage of three TTLs
//! and is lost only on etcd's word. Every wait is bounded; the measured times are
//! printed (`--nocapture`).

use std::time::Duration;

use etcd_client::Client;
use steady_etcd::{HeldLease, LeaseMode};
use steady_testing::{eventually_within, Etcd};
use tokio::time::{timeout_at, Instant};

/// The most any single step may take.
const WAIT: Duration = Duration::from_secs(20);
/// One request's timeout.
const REQUEST: Duration = Duration::from_secs(3);

async fn connect(etcd: &Etcd) -> Client {
    tokio::time::timeout(WAIT, steady_etcd::connect(&[etcd.endpoint()], REQUEST))
        .await
        .expect("connecting: not within the bound")
        .expect("connecting")
}

async fn grant(client: &Client, ttl: Duration, mode: LeaseMode) -> HeldLease {
    HeldLease::grant(client, ttl, REQUEST, "test", mode).await.expect("lease grant")
}

/// The TTL etcd reports for `id` now (negative when it does not know the lease).
async fn ttl_in_etcd(etcd: &Etcd, id: i64) -> i64 {
    let client = connect(etcd).await;
    client.lease_client().time_to_live(id, None).await.expect("time to live").ttl()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strict_lease_is_lost_at_its_own_deadline_while_etcd_is_down_and_stays_lost() {
    let Some(mut etcd) = Etcd::start() else { return };
    let client = connect(&etcd).await;
    let ttl = Duration::from_secs(2);
    let lease = grant(&client, ttl, LeaseMode::Strict).await;
    let mut held = lease.held();
    etcd.kill();
    let deadline = lease.renewed_until();
    // (A second of slack for a busy machine's scheduling; etcd stays down long after.)
    timeout_at(deadline + Duration::from_secs(1), held.wait_for(|alive| !*alive))
        .await
        .expect("a strict lease outlived its deadline while etcd was down")
        .expect("the keeper reports before it ends");
    let lost_at = Instant::now();
    assert!(lost_at >= deadline, "lost {:?} before its deadline", deadline - lost_at);
    eprintln!("strict lease lost {:?} after its deadline (TTL {ttl:?})", lost_at - deadline);

    // etcd comes back with the lease (a restart restores leases with a fresh TTL), but
    // a lock once given up is not taken back: the keeper has stopped.
    etcd.restart();
    assert!(ttl_in_etcd(&etcd, lease.id()).await > 0, "etcd restored the lease");
    assert!(!lease.is_alive() && !lease.is_confirmed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strict_lease_survives_an_outage_shorter_than_its_ttl_by_retrying_soon_after_a_failure() {
    let Some(mut etcd) = Etcd::start() else { return };
    let client = connect(&etcd).await;
    // 30 s: renewals every 10 s. With etcd down from the grant until 20.2 s after it
    // (and then restarting, which takes one to two seconds, more on a loaded machine),
    // the renewals due at 10 s and 20 s both fail; only a retry sooner than the next
    // period renews before the deadline at 30 s.
    let ttl = Duration::from_secs(30);
    let lease = grant(&client, ttl, LeaseMode::Strict).await;
    let first_deadline = lease.renewed_until();
    let granted = first_deadline - ttl;
    let held = lease.held();
    etcd.kill();
    // The outage itself: the fault lasts this long, whatever the keeper does.
    tokio::time::sleep_until(granted + Duration::from_millis(20_200)).await;
    etcd.restart();
    let back = Instant::now();
    eprintln!("etcd back {:?} after the grant (strict lease, TTL {ttl:?})", back - granted);

    // Renewed after the restart: its deadline moves past the first one.
    eventually_within(WAIT, "a renewal after the restart", || {
        assert!(lease.is_alive(), "lost before a renewal after the restart");
        lease.renewed_until() > first_deadline
    })
    .await;
    eprintln!("strict lease renewed {:?} after etcd was back", back.elapsed());
    assert!(lease.is_alive(), "lost although a renewal was answered");
    // And never lost meanwhile.
    assert!(!held.has_changed().expect("the keeper runs"), "the lease was reported lost");
    assert!(ttl_in_etcd(&etcd, lease.id()).await > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tolerant_lease_lives_through_an_outage_of_three_ttls_and_is_renewed_when_etcd_returns() {
    let Some(mut etcd) = Etcd::start() else { return };
    let client = connect(&etcd).await;
    let ttl = Duration::from_secs(2);
    let lease = grant(&client, ttl, LeaseMode::Tolerant).await;
    let (id, held) = (lease.id(), lease.held());
    etcd.kill();
    let killed = Instant::now();
    // The outage itself: three TTLs.
    tokio::time::sleep(ttl * 3).await;
    assert!(lease.is_alive(), "a tolerant lease was given up while etcd could not be asked");
    assert!(!lease.is_confirmed(), "confirmed, with no answer from etcd for three TTLs");
    etcd.restart();
    let back = Instant::now();

    eventually_within(WAIT, "the lease confirmed again", || lease.is_confirmed()).await;
    eprintln!(
        "tolerant lease confirmed {:?} after etcd was back ({:?} after the kill, TTL {ttl:?})",
        back.elapsed(),
        killed.elapsed()
    );
    assert!(!held.has_changed().expect("the keeper runs"), "the lease was reported lost");
    assert_eq!(lease.id(), id);
    assert!(ttl_in_etcd(&etcd, id).await > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tolerant_lease_is_lost_when_etcd_says_so_or_when_left_to_lapse() {
    let Some(etcd) = Etcd::start() else { return };
    let client = connect(&etcd).await;
    let ttl = Duration::from_secs(3);

    // Revoked behind the holder's back: lost at the next renewal (within a third of the
    // TTL), well before the deadline.
    let lease = grant(&client, ttl, LeaseMode::Tolerant).await;
    let other = connect(&etcd).await;
    other.lease_client().revoke(lease.id()).await.expect("revoke");
    let revoked = Instant::now();
    let mut held = lease.held();
    timeout_at(revoked + ttl / 3 + Duration::from_secs(1), held.wait_for(|alive| !*alive))
        .await
        .expect("a revoked tolerant lease still counts as held")
        .expect("the keeper reports before it ends");
    eprintln!("revoked tolerant lease lost {:?} after the revocation", revoked.elapsed());
    assert!(!lease.is_confirmed());

    // Left to lapse (a crash drill): lost at its deadline, as etcd lets it go.
    let lease = grant(&client, ttl, LeaseMode::Tolerant).await;
    lease.stop_renewing();
    let mut held = lease.held();
    let deadline = lease.renewed_until();
    timeout_at(deadline + Duration::from_secs(1), held.wait_for(|alive| !*alive))
        .await
        .expect("a lease left to lapse still counts as held past its deadline")
        .expect("the keeper reports before it ends");
    assert!(Instant::now() >= deadline);
}
