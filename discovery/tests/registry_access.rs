//! The etcd registry on etcd servers run as deployments run them (real etcd on
//! 127.0.0.1 via `steady_testing::Etcd`): over TLS with client certificates required,
//! and with authentication as a user confined to the registry's prefix. In both, tasks
//! claim and register, watchers see them, drains and releases reach every view; settings
//! that cannot work (a wrong CA, no client certificate, a wrong password, a user without
//! the prefix) fail at connect with [`RegistryError::Connect`] naming the cause.

#![cfg(feature = "etcd")]

use std::time::Duration;

use steady_discovery::registry::{
    self, ConnectError, EtcdAccess, EtcdTls, Registry, RegistryConfig, RegistryError, DEFAULT_KEY_PREFIX,
};
use steady_discovery::{JobView, TaskState};
use steady_testing::tls::TestPki;
use steady_testing::{within, Etcd, EtcdOptions};

/// The most any single step may take.
const WAIT: Duration = Duration::from_secs(15);

async fn connect(etcd: &Etcd, access: EtcdAccess) -> Result<Registry, RegistryError> {
    let config = RegistryConfig::new([etcd.endpoint()])
        .lease_ttl(Duration::from_secs(2))
        .request_timeout(Duration::from_secs(2))
        .access(access);
    within(WAIT, "connecting", Registry::connect(config)).await
}

/// What a fleet does with its registry: frontends claim indices, a backend registers,
/// a watcher on each connection sees them, a drain and a release reach the view.
async fn a_fleet_works_through(registry: &Registry, other: &Registry) {
    let first = within(WAIT, "claim", registry.claim("web", "web-a")).await.unwrap();
    let second = within(WAIT, "claim", other.claim("web", "web-b")).await.unwrap();
    assert_eq!((first.index(), second.index()), (0, 1));
    let backend = within(WAIT, "register", registry.register("api", 3, "10.0.0.3:443")).await.unwrap();
    let watch = within(WAIT, "watch", registry::watch_job(other, "api")).await.unwrap();
    let mut views = watch.views();
    let state = |v: &JobView<String>| v.tasks.get(&3).map(|t| t.state);
    within(WAIT, "the backend in the view", views.wait_for(|v| state(v) == Some(TaskState::Serving)))
        .await
        .unwrap();
    within(WAIT, "drain", backend.drain()).await.unwrap();
    within(WAIT, "the drain in the view", views.wait_for(|v| state(v) == Some(TaskState::Draining)))
        .await
        .unwrap();
    within(WAIT, "release", backend.release()).await.unwrap();
    within(WAIT, "the release in the view", views.wait_for(|v| state(v).is_none())).await.unwrap();
    assert_eq!(within(WAIT, "job size", registry.job_size("web")).await.unwrap(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_with_client_certificates_the_registry_works_and_bad_settings_fail_at_connect() {
    let pki = TestPki::new("etcd CA");
    let server = pki.issue(&["127.0.0.1"]);
    let options =
        EtcdOptions::new().tls(server.cert_file(), server.key_file()).client_cert_auth(pki.ca_file());
    let Some(etcd) = Etcd::start_with(options) else { return };
    let client = pki.issue(&["web-frontend"]);
    let trusted =
        EtcdAccess::new().tls(EtcdTls::new(pki.ca_pem()).identity(client.cert_pem(), client.key_pem()));
    let (one, two) = (connect(&etcd, trusted.clone()).await.unwrap(), connect(&etcd, trusted).await.unwrap());
    a_fleet_works_through(&one, &two).await;

    let stranger = TestPki::new("another CA");
    for (what, tls) in [
        ("a wrong CA", EtcdTls::new(stranger.ca_pem()).identity(client.cert_pem(), client.key_pem())),
        ("no client certificate", EtcdTls::new(pki.ca_pem())),
    ] {
        match connect(&etcd, EtcdAccess::new().tls(tls)).await {
            Err(RegistryError::Connect(ConnectError::Tls { .. })) => {}
            other => panic!("{what}: {:?}", other.map(drop)),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_auth_a_user_confined_to_the_prefix_runs_the_registry_and_bad_credentials_fail_at_connect() {
    let options = EtcdOptions::new().auth("root-secret").user("web", "web-secret", DEFAULT_KEY_PREFIX);
    let Some(etcd) = Etcd::start_with(options) else { return };
    let user = EtcdAccess::new().user("web", "web-secret");
    let (one, two) = (connect(&etcd, user.clone()).await.unwrap(), connect(&etcd, user).await.unwrap());
    a_fleet_works_through(&one, &two).await;

    let refused = connect(&etcd, EtcdAccess::new().user("web", "wrong")).await.map(drop);
    assert!(
        matches!(&refused, Err(RegistryError::Connect(ConnectError::Unauthenticated { .. }))),
        "{refused:?}"
    );
    let refused = connect(&etcd, EtcdAccess::new()).await.map(drop);
    assert!(
        matches!(&refused, Err(RegistryError::Connect(ConnectError::Unauthenticated { .. }))),
        "{refused:?}"
    );
    let elsewhere = RegistryConfig::new([etcd.endpoint()])
        .key_prefix("/elsewhere/")
        .access(EtcdAccess::new().user("web", "web-secret"));
    let refused = within(WAIT, "connecting", Registry::connect(elsewhere)).await.map(drop);
    assert!(
        matches!(&refused, Err(RegistryError::Connect(ConnectError::PermissionDenied { .. }))),
        "{refused:?}"
    );
}
