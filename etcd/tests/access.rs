//! [`connect_with`] against real etcd servers run as deployments run them: clients over
//! TLS with client certificates required, and authentication with a user confined to a
//! prefix. A working setting connects and its client reads and writes; each setting that
//! cannot work fails at once with the [`ConnectError`] that names its cause, within the
//! bound. (Skipped when etcd is missing unless STEADY_REQUIRE_ETCD is set.)

use std::time::{Duration, Instant};

use steady_etcd::{connect_with, ConnectError, EtcdAccess, EtcdTls};
use steady_testing::tls::TestPki;
use steady_testing::{Etcd, EtcdOptions};

/// One request's timeout.
const REQUEST: Duration = Duration::from_secs(2);
/// The most a failing connection may take: [`connect_with`] promises about two timeouts.
const FAILS_WITHIN: Duration = Duration::from_secs(3 * 2);
const PREFIX: &str = "/steady/test/";

/// Connects as `access` and, when that works, writes and reads back a key under
/// [`PREFIX`]; the error (and how long it took) when it does not.
async fn try_access(etcd: &Etcd, access: &EtcdAccess) -> Result<(), ConnectError> {
    let started = Instant::now();
    let result = connect_with(&[etcd.endpoint()], REQUEST, access, PREFIX).await;
    let outcome = result.as_ref().map(drop);
    assert!(started.elapsed() < FAILS_WITHIN, "took {:?}: {outcome:?}", started.elapsed());
    let client = result?;
    let key = format!("{PREFIX}probe");
    client.kv_client().put(key.as_str(), "works", None).await.expect("put");
    let read = client.kv_client().get(key.as_str(), None).await.expect("get");
    assert_eq!(read.kvs()[0].value(), b"works");
    Ok(())
}

/// A server over TLS with client certificates from `pki`'s CA required.
fn etcd_with_client_certs(pki: &TestPki) -> Option<Etcd> {
    let server = pki.issue(&["127.0.0.1", "localhost"]);
    Etcd::start_with(
        EtcdOptions::new().tls(server.cert_file(), server.key_file()).client_cert_auth(pki.ca_file()),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_a_client_with_a_trusted_certificate_reads_and_writes() {
    let pki = TestPki::new("etcd CA");
    let Some(etcd) = etcd_with_client_certs(&pki) else { return };
    assert!(etcd.endpoint().starts_with("https://"));
    let client = pki.issue(&["steady-slicer"]);
    let tls = EtcdTls::new(pki.ca_pem()).identity(client.cert_pem(), client.key_pem());
    try_access(&etcd, &EtcdAccess::new().tls(tls)).await.expect("a trusted client connects");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_a_wrong_ca_a_missing_or_untrusted_client_certificate_and_plaintext_each_fail_at_start() {
    let pki = TestPki::new("etcd CA");
    let Some(etcd) = etcd_with_client_certs(&pki) else { return };
    let client = pki.issue(&["steady-slicer"]);
    let stranger = TestPki::new("another CA");
    let untrusted = stranger.issue(&["steady-slicer"]);

    // The client does not trust the server's CA.
    let wrong_ca = EtcdTls::new(stranger.ca_pem()).identity(client.cert_pem(), client.key_pem());
    let error = try_access(&etcd, &EtcdAccess::new().tls(wrong_ca)).await.unwrap_err();
    assert!(matches!(error, ConnectError::Tls { .. }), "{error}");
    assert!(error.to_string().contains("UnknownIssuer"), "the cause is named: {error}");

    // The server requires a client certificate and gets none.
    let no_identity = EtcdTls::new(pki.ca_pem());
    let error = try_access(&etcd, &EtcdAccess::new().tls(no_identity)).await.unwrap_err();
    assert!(matches!(error, ConnectError::Tls { .. }), "{error}");

    // The client's certificate is signed by a CA the server does not trust.
    let untrusted = EtcdTls::new(pki.ca_pem()).identity(untrusted.cert_pem(), untrusted.key_pem());
    let error = try_access(&etcd, &EtcdAccess::new().tls(untrusted)).await.unwrap_err();
    assert!(matches!(error, ConnectError::Tls { .. }), "{error}");

    // An https endpoint without TLS settings cannot work.
    let error = try_access(&etcd, &EtcdAccess::new()).await.unwrap_err();
    assert!(matches!(error, ConnectError::InvalidConfig { .. } | ConnectError::Tls { .. }), "{error}");
    assert_eq!(error.to_string().lines().count(), 1, "one line: {error}");
}

fn etcd_with_auth() -> Option<Etcd> {
    Etcd::start_with(EtcdOptions::new().auth("root-secret").user("slicer", "slicer-secret", PREFIX))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_auth_a_user_reads_and_writes_its_prefix_and_a_wrong_password_or_prefix_fails_at_start() {
    let Some(etcd) = etcd_with_auth() else { return };
    try_access(&etcd, &EtcdAccess::new().user("slicer", "slicer-secret")).await.expect("the user connects");
    try_access(&etcd, &EtcdAccess::new().user("root", "root-secret")).await.expect("root connects");

    let error = try_access(&etcd, &EtcdAccess::new().user("slicer", "wrong")).await.unwrap_err();
    assert!(matches!(&error, ConnectError::Unauthenticated { user, .. } if user == "slicer"), "{error}");
    assert!(!error.to_string().contains("wrong"), "the password is never printed: {error}");

    let error = try_access(&etcd, &EtcdAccess::new()).await.unwrap_err();
    assert!(
        matches!(error, ConnectError::PermissionDenied { .. } | ConnectError::Unauthenticated { .. }),
        "{error}"
    );

    // The user may not read another prefix.
    let started = Instant::now();
    let access = EtcdAccess::new().user("slicer", "slicer-secret");
    let error =
        connect_with(&[etcd.endpoint()], REQUEST, &access, "/elsewhere/").await.map(drop).unwrap_err();
    assert!(started.elapsed() < FAILS_WITHIN);
    assert!(matches!(&error, ConnectError::PermissionDenied { key, .. } if key == "/elsewhere/"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_is_not_there_is_unreachable_within_the_bound() {
    // A port nothing listens on: bound, then released.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let started = Instant::now();
    let error = connect_with(&[format!("http://127.0.0.1:{port}")], REQUEST, &EtcdAccess::new(), PREFIX)
        .await
        .map(drop)
        .unwrap_err();
    assert!(started.elapsed() < FAILS_WITHIN);
    assert!(matches!(error, ConnectError::Unreachable { .. }), "{error}");
}
