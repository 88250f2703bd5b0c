//! A client of a three-member cluster (`steady_testing::EtcdCluster`, real `etcd`
//! processes on 127.0.0.1) while members die: calls go to the members that are up.
//! etcd-client's own balance kept picking a dead member (it has no calls in flight), and
//! most calls failed while one member of three was away; steady's clients speak through
//! a channel that passes dead members over. (Skipped when etcd is missing unless
//! STEADY_REQUIRE_ETCD is set.)

use std::time::Duration;

use etcd_client::GetOptions;
use steady_etcd::{connect_with, EtcdAccess};
use steady_testing::{within, EtcdCluster};

const REQUEST: Duration = Duration::from_secs(2);
const WAIT: Duration = Duration::from_secs(30);
const CALLS: usize = 60;

/// How many of [`CALLS`] reads and writes, one after another, fail.
async fn failures(client: &etcd_client::Client) -> usize {
    let mut failed = 0;
    for n in 0..CALLS {
        let mut kv = client.kv_client();
        let call = async {
            if n % 2 == 0 {
                kv.put("/steady/members/probe", n.to_string(), None).await.map(drop)
            } else {
                kv.get("/steady/members/probe", None).await.map(drop)
            }
        };
        if !matches!(tokio::time::timeout(REQUEST, call).await, Ok(Ok(()))) {
            failed += 1;
        }
    }
    failed
}

async fn connect(etcd: &EtcdCluster) -> etcd_client::Client {
    let (endpoints, access) = (etcd.endpoints(), EtcdAccess::new());
    let connecting = connect_with(&endpoints, REQUEST, &access, "/steady/members/");
    within(WAIT, "connecting", connecting).await.expect("connects with a member down")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_dead_before_the_client_starts_costs_no_call() {
    let Some(mut etcd) = EtcdCluster::start() else { return };
    let leader = etcd.wait_for_leader();
    etcd.kill(leader);
    etcd.wait_for_leader();
    let client = connect(&etcd).await;
    assert_eq!(failures(&client).await, 0, "a call went to the dead member");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_dies_under_a_client_costs_at_most_one_call_and_is_used_again_once_back() {
    let Some(mut etcd) = EtcdCluster::start() else { return };
    let client = connect(&etcd).await;
    // Every member used, so that each has a live connection when one dies.
    assert_eq!(failures(&client).await, 0);

    let leader = etcd.wait_for_leader();
    etcd.kill(leader);
    etcd.wait_for_leader();
    let failed = failures(&client).await;
    assert!(failed <= 1, "{failed} of {CALLS} calls failed: only the one that found the member dead may");

    // Back, then both others killed: only it can answer (a serializable read needs no
    // quorum), so the client must be using it again; the two newly dead members cost at
    // most one call each.
    etcd.restart(leader);
    for member in (0..etcd.len()).filter(|&m| m != leader) {
        etcd.kill(member);
    }
    let mut failed = 0;
    for _ in 0..CALLS {
        let mut kv = client.kv_client();
        let read = kv.get("/steady/members/probe", Some(GetOptions::new().with_serializable()));
        if !matches!(tokio::time::timeout(REQUEST, read).await, Ok(Ok(_))) {
            failed += 1;
        }
    }
    assert!(failed <= 2, "{failed} of {CALLS} reads failed with only the restarted member up");
}
