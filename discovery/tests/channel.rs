//! The whole frontend setup on a real etcd: backends register, a frontend claims its
//! index, its `SteadyChannel` follows the registry's view; a backend that drains gets no
//! new requests and no request fails through the drain.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use steady_balance::BalanceConfig;
use steady_discovery::identity::Origin;
use steady_discovery::registry::{self, Registry, RegistryConfig};
use steady_discovery::TaskState;
use steady_testing::echo::echo_client::EchoClient;
use steady_testing::echo::{serve_echo, EchoRequest};
use steady_testing::{eventually, Etcd};
use steady_tonic::SteadyChannel;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_backend_gets_no_new_requests_and_none_fail() {
    let Some(etcd) = Etcd::start() else { return };
    let config = || RegistryConfig::new([etcd.endpoint()]).lease_ttl(Duration::from_secs(2));
    let registry = Registry::connect(config()).await.unwrap();
    let mut servers = Vec::new();
    let mut registrations = Vec::new();
    for task in 0..3u32 {
        let (address, stop) = serve_echo(task).await;
        registrations.push(registry.register("web", task as usize, &address.to_string()).await.unwrap());
        servers.push(stop);
    }
    // The frontend: an index from the registry, backends from the registry.
    let frontends = Registry::connect(config()).await.unwrap();
    let identity = frontends.claim_index("web-frontends", "frontend-a").await.unwrap();
    assert_eq!((identity.index(), identity.origin()), (0, &Origin::Registry));
    let backends = registry::watch_job(&frontends, "web").await.unwrap();
    let channel =
        SteadyChannel::builder(BalanceConfig::new(identity.index(), 3).with_algorithm(identity.algorithm()))
            .from_addresses(backends.views())
            .unwrap();

    // Steady load through the drain.
    // `dropped`: set once the balancer has dropped backend 2; of the requests sent after
    // that, `sent_after` counts the answered ones and `served_by_2_after` those backend 2
    // served (none may be).
    let (stop, failed, served_by_2) =
        (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let (dropped, sent_after, served_by_2_after) =
        (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut loops = Vec::new();
    for _ in 0..4 {
        let (mut client, stop, failed, served_by_2) =
            (EchoClient::new(channel.clone()), stop.clone(), failed.clone(), served_by_2.clone());
        let (dropped, sent_after, served_by_2_after) =
            (dropped.clone(), sent_after.clone(), served_by_2_after.clone());
        loops.push(tokio::spawn(async move {
            let mut sent = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let after_drop = dropped.load(Ordering::SeqCst);
                let reply = client.echo(EchoRequest { payload: vec![1; 16] }).await;
                if after_drop && reply.is_ok() {
                    sent_after.fetch_add(1, Ordering::Relaxed);
                }
                match reply {
                    Ok(reply) if reply.get_ref().task == 2 => {
                        served_by_2.fetch_add(1, Ordering::Relaxed);
                        if after_drop {
                            served_by_2_after.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Ok(_) => {}
                    Err(_) => {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
                sent += 1;
            }
            sent
        }));
    }
    eventually("backend 2 to serve", || served_by_2.load(Ordering::Relaxed) > 10).await;
    registrations[2].drain().await.unwrap();
    eventually("the view to show the drain", || {
        backends.current().tasks.get(&2).is_some_and(|t| t.state == TaskState::Draining)
    })
    .await;
    // Once the balancer has the view, backend 2 gets nothing new.
    eventually("the balancer to drop backend 2", || channel.stats().members.iter().all(|m| m.task != 2))
        .await;
    // Requests already in flight to it finish; every request sent from now on goes
    // elsewhere. The load runs on until 200 more were answered.
    dropped.store(true, Ordering::SeqCst);
    eventually("200 requests answered after the drop", || sent_after.load(Ordering::Relaxed) >= 200).await;
    stop.store(true, Ordering::Relaxed);
    let mut sent = 0;
    for l in loops {
        sent += l.await.unwrap();
    }
    assert!(sent > 100, "{sent}");
    assert!(served_by_2.load(Ordering::Relaxed) > 10);
    assert_eq!(served_by_2_after.load(Ordering::Relaxed), 0, "backend 2 served requests sent after draining");
    assert_eq!(failed.load(Ordering::Relaxed), 0, "requests failed through the drain");
    drop(servers);
}
