//! The channel over TLS and mutual TLS, through addresses as discovery publishes them:
//! real rustls handshakes on loopback, certificates made for each test.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;

use steady_balance::{BalanceConfig, JobView};
use steady_testing::echo::echo_client::EchoClient;
use steady_testing::echo::echo_server::EchoServer;
use steady_testing::echo::{echo, RecordingEcho};
use steady_testing::eventually;
use steady_testing::loopback::{Loopback, ServerGuard};
use steady_testing::tls::{Leaf, TestPki};
use steady_tonic::{EndpointTemplate, SteadyChannel};
use tokio::sync::watch;
use tonic::transport::{Certificate, ClientTlsConfig, Identity, Server, ServerTlsConfig};

/// A TLS echo backend for `task`; with `client_ca`, it requires client certificates
/// signed by it (mutual TLS).
struct TlsBackend {
    addr: SocketAddr,
    backend: RecordingEcho,
    _stop: ServerGuard,
}

async fn serve_tls(task: u32, leaf: &Leaf, client_ca: Option<&str>) -> TlsBackend {
    let mut tls = ServerTlsConfig::new().identity(Identity::from_pem(leaf.cert_pem(), leaf.key_pem()));
    if let Some(ca) = client_ca {
        tls = tls.client_ca_root(Certificate::from_pem(ca));
    }
    let port = Loopback::bind().await;
    let addr = port.addr();
    let backend = RecordingEcho { task, ..RecordingEcho::default() };
    let server = Server::builder().tls_config(tls).unwrap().add_service(EchoServer::new(backend.clone()));
    let stop = port.serve_with(|incoming, stopped| server.serve_with_incoming_shutdown(incoming, stopped));
    TlsBackend { addr, backend, _stop: stop }
}

fn served(backends: &[TlsBackend]) -> Vec<usize> {
    backends.iter().map(|b| b.backend.requests.load(Ordering::SeqCst)).collect()
}

/// A channel over `backends`' `host:port` addresses (as a discovery source publishes
/// them), every one in the subset.
fn channel(backends: &[TlsBackend], template: EndpointTemplate) -> SteadyChannel {
    let addresses: Vec<String> = backends.iter().map(|b| b.addr.to_string()).collect();
    let (_job, views) = watch::channel(JobView::serving(addresses));
    SteadyChannel::builder(BalanceConfig::new(0, backends.len()))
        .endpoint_template(template)
        .from_addresses(views)
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_reaches_tls_backends_given_as_plain_addresses() {
    let pki = TestPki::new("backends CA");
    let server = pki.issue(&["127.0.0.1"]);
    let backends = vec![serve_tls(0, &server, None).await, serve_tls(1, &server, None).await];
    let tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pki.ca_pem()));
    let channel = channel(&backends, EndpointTemplate::new().tls(tls));
    let mut client = EchoClient::new(channel.clone());
    for _ in 0..40 {
        echo(&mut client, None, b"over tls").await.unwrap();
    }
    let served = served(&backends);
    assert_eq!(served.iter().sum::<usize>(), 40);
    assert!(served.iter().all(|&n| n > 0), "both backends serve: {served:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_presents_the_client_certificate_and_the_sni_name_of_the_job() {
    let pki = TestPki::new("fleet CA");
    // The backends' certificate names the job, not their addresses: the template names
    // it once for every task.
    let server = pki.issue(&["users.backend.example"]);
    let backends = vec![
        serve_tls(0, &server, Some(pki.ca_pem())).await,
        serve_tls(1, &server, Some(pki.ca_pem())).await,
        serve_tls(2, &server, Some(pki.ca_pem())).await,
    ];
    let me = pki.issue(&["frontend-0.web.example"]);
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(pki.ca_pem()))
        .identity(Identity::from_pem(me.cert_pem(), me.key_pem()))
        .domain_name("users.backend.example");
    let channel = channel(&backends, EndpointTemplate::new().tls(tls.clone()));
    let mut client = EchoClient::new(channel.clone());
    for _ in 0..60 {
        echo(&mut client, None, b"mtls").await.unwrap();
    }
    let served = served(&backends);
    assert_eq!(served.iter().sum::<usize>(), 60);
    assert!(served.iter().all(|&n| n > 0), "every backend serves: {served:?}");

    // Without a client certificate the backends refuse the handshake. In TLS 1.3 the
    // client finishes its side first and learns of the refusal only when it next reads
    // or writes, so the refusal shows at connect or at the first call, and what the call
    // reports depends on which comes first (the server's alert, `CertificateRequired`,
    // or the closed connection): the test asserts that it fails and reaches no backend.
    let anonymous = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(pki.ca_pem()))
        .domain_name("users.backend.example");
    let _refused = match EndpointTemplate::new().tls(anonymous).connect(&backends[0].addr.to_string()).await {
        Err(error) => error.to_string(),
        Ok(connected) => EchoClient::new(connected)
            .echo(steady_testing::echo::EchoRequest { payload: b"x".to_vec() })
            .await
            .expect_err("a client without a certificate is refused")
            .to_string(),
    };
    assert_eq!(served.iter().sum::<usize>(), 60, "nothing reached a backend without a certificate");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_whose_certificate_is_not_trusted_gets_no_request_and_the_others_serve_every_one() {
    let pki = TestPki::new("fleet CA");
    let stranger = TestPki::new("some other CA");
    let trusted = pki.issue(&["127.0.0.1"]);
    let untrusted = stranger.issue(&["127.0.0.1"]);
    let backends = vec![
        serve_tls(0, &trusted, None).await,
        serve_tls(1, &untrusted, None).await,
        serve_tls(2, &trusted, None).await,
    ];
    let template = EndpointTemplate::new()
        .tls(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pki.ca_pem())));

    // The handshake's failure names its cause.
    let error = template.connect(&backends[1].addr.to_string()).await.unwrap_err();
    assert!(error.reason().contains("UnknownIssuer"), "{error}");
    assert!(error.to_string().starts_with(&format!("connecting to https://{}", backends[1].addr)), "{error}");

    let channel = channel(&backends, template);
    let mut client = EchoClient::new(channel.clone());
    for _ in 0..60 {
        echo(&mut client, None, b"x").await.expect("the trusted backends serve every request");
    }
    let served = served(&backends);
    assert_eq!(served[1], 0, "the untrusted backend got nothing: {served:?}");
    assert_eq!(served[0] + served[2], 60);
    // Its failures are connection failures, counted, and the balancer keeps retrying it
    // (with backoff) rather than giving up on the member or panicking.
    eventually("the untrusted member's handshakes counted as connection failures", || {
        channel.stats().connect_failures >= 1
    })
    .await;
    assert!(!channel.stats().members.iter().any(|m| m.task == 1), "{:?}", channel.stats().members);
}
