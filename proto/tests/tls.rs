//! Certificates that rotate, at the level of handshakes (real TLS on loopback): a
//! replaced server certificate is served from the next handshake while a connection
//! made before keeps working; a replaced client CA bundle refuses the old CA's clients
//! at their next handshake; bad material is refused with a typed error and the old
//! material stays.

#![cfg(feature = "tls")]

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use steady_proto::tls::rustls::pki_types::{CertificateDer, ServerName};
use steady_proto::tls::rustls::{ClientConfig, RootCertStore};
use steady_proto::tls::{server_config, ClientAuth, ClientCas, ServerIdentity, TlsError, TlsIncoming};
use steady_testing::tls::{Leaf, TestPki};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

const WAIT: Duration = Duration::from_secs(10);

fn der(pem: &str) -> CertificateDer<'static> {
    use steady_proto::tls::rustls::pki_types::pem::PemObject;
    CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
}

/// A client trusting `cas`, presenting `me` when given.
fn client(cas: &[&TestPki], me: Option<&Leaf>) -> TlsConnector {
    let mut roots = RootCertStore::empty();
    for ca in cas {
        roots.add(der(ca.ca_pem())).unwrap();
    }
    let builder = ClientConfig::builder_with_provider(Arc::new(
        steady_proto::tls::rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let config = match me {
        Some(leaf) => {
            use steady_proto::tls::rustls::pki_types::pem::PemObject;
            let key = steady_proto::tls::rustls::pki_types::PrivateKeyDer::from_pem_slice(
                leaf.key_pem().as_bytes(),
            )
            .unwrap();
            builder.with_client_auth_cert(vec![der(leaf.cert_pem())], key).unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    TlsConnector::from(Arc::new(config))
}

/// A server on loopback echoing one byte per connection; returns its address.
async fn serve(identity: &ServerIdentity, clients: Option<&ClientCas>) -> std::net::SocketAddr {
    let config = server_config(
        Arc::new(identity.clone()),
        clients.map(|c| {
            Arc::new(c.clone()) as Arc<dyn steady_proto::tls::rustls::server::danger::ClientCertVerifier>
        }),
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let mut incoming = TlsIncoming::new(listener, config);
    tokio::spawn(async move {
        while let Some(Ok(mut tls)) = incoming.next().await {
            tokio::spawn(async move {
                let mut byte = [0u8; 1];
                while tls.read_exact(&mut byte).await.is_ok() {
                    if tls.write_all(&byte).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    address
}

/// Connects, completes the handshake with one round trip, and returns the connection
/// and the leaf the server presented.
async fn connect(
    address: std::net::SocketAddr,
    connector: &TlsConnector,
) -> Result<(tokio_rustls::client::TlsStream<TcpStream>, CertificateDer<'static>), String> {
    let tcp = TcpStream::connect(address).await.map_err(|e| e.to_string())?;
    let name = ServerName::try_from("127.0.0.1").unwrap();
    let mut tls = tokio::time::timeout(WAIT, connector.connect(name, tcp))
        .await
        .map_err(|_| "handshake timed out".to_owned())?
        .map_err(|e| e.to_string())?;
    // In TLS 1.3 a refused client certificate shows at the first read.
    round_trip(&mut tls).await?;
    let leaf = tls.get_ref().1.peer_certificates().unwrap()[0].clone();
    Ok((tls, leaf))
}

async fn round_trip(tls: &mut tokio_rustls::client::TlsStream<TcpStream>) -> Result<(), String> {
    tls.write_all(b"x").await.map_err(|e| e.to_string())?;
    let mut byte = [0u8; 1];
    tokio::time::timeout(WAIT, tls.read_exact(&mut byte))
        .await
        .map_err(|_| "no echo".to_owned())?
        .map_err(|e| e.to_string())?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_certificate_is_served_from_the_next_handshake_and_old_connections_keep_theirs() {
    let (old_ca, new_ca) = (TestPki::new("old CA"), TestPki::new("new CA"));
    let (old, new) = (old_ca.issue(&["127.0.0.1"]), new_ca.issue(&["127.0.0.1"]));
    let identity = ServerIdentity::from_pem(old.cert_pem().as_bytes(), old.key_pem().as_bytes()).unwrap();
    let address = serve(&identity, None).await;
    let both = client(&[&old_ca, &new_ca], None);
    let (mut before, leaf) = connect(address, &both).await.unwrap();
    assert_eq!(leaf, der(old.cert_pem()));

    identity.replace_pem(new.cert_pem().as_bytes(), new.key_pem().as_bytes()).unwrap();
    let (_after, leaf) = connect(address, &both).await.unwrap();
    assert_eq!(leaf, der(new.cert_pem()), "the next handshake gets the new certificate");
    assert_eq!(identity.leaf(), der(new.cert_pem()));
    // A client that trusts only the old CA is refused from now on...
    assert!(connect(address, &client(&[&old_ca], None)).await.is_err());
    // ...while the connection made before goes on.
    round_trip(&mut before).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_material_is_refused_with_a_typed_error_and_the_old_stays_in_use() {
    let ca = TestPki::new("CA");
    let (leaf, other) = (ca.issue(&["127.0.0.1"]), ca.issue(&["127.0.0.1"]));
    let identity = ServerIdentity::from_pem(leaf.cert_pem().as_bytes(), leaf.key_pem().as_bytes()).unwrap();
    let mismatched = identity.replace_pem(leaf.cert_pem().as_bytes(), other.key_pem().as_bytes());
    assert!(
        matches!(&mismatched, Err(TlsError::Key { reason }) if reason.contains("KeyMismatch")),
        "{mismatched:?}"
    );
    assert_eq!(
        identity.replace_pem(b"garbage", leaf.key_pem().as_bytes()),
        Err(TlsError::NoCertificate { what: "certificate" })
    );
    assert_eq!(identity.replace_pem(leaf.cert_pem().as_bytes(), b""), Err(TlsError::NoKey));
    let truncated = &leaf.cert_pem()[..leaf.cert_pem().len() / 2];
    assert!(identity.replace_pem(truncated.as_bytes(), leaf.key_pem().as_bytes()).is_err());
    assert_eq!(identity.leaf(), der(leaf.cert_pem()), "the old certificate is still served");

    let clients = ClientCas::from_pem(ca.ca_pem().as_bytes(), ClientAuth::Required).unwrap();
    assert_eq!(clients.replace_pem(b"not pem"), Err(TlsError::NoCertificate { what: "CA bundle" }));
    // Still the old bundle: its clients get in.
    let address = serve(&identity, Some(&clients)).await;
    connect(address, &client(&[&ca], Some(&other))).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_bundle_that_drops_the_old_ca_refuses_its_clients_at_their_next_handshake() {
    let (old_ca, new_ca) = (TestPki::new("old CA"), TestPki::new("new CA"));
    let server = old_ca.issue(&["127.0.0.1"]);
    let identity =
        ServerIdentity::from_pem(server.cert_pem().as_bytes(), server.key_pem().as_bytes()).unwrap();
    let clients = ClientCas::from_pem(old_ca.ca_pem().as_bytes(), ClientAuth::Required).unwrap();
    let address = serve(&identity, Some(&clients)).await;
    let (old_client, new_client) = (old_ca.issue(&["client-old"]), new_ca.issue(&["client-new"]));
    // One client config for the old client throughout: it would resume its session if
    // the server allowed it, and a resumed session skips the certificate check.
    let old_connector = client(&[&old_ca], Some(&old_client));
    let (mut held, _) = connect(address, &old_connector).await.unwrap();
    assert!(connect(address, &client(&[&old_ca], Some(&new_client))).await.is_err(), "not yet trusted");

    // The bundle gains the new CA: both get in.
    let bundle = format!("{}{}", old_ca.ca_pem(), new_ca.ca_pem());
    clients.replace_pem(bundle.as_bytes()).unwrap();
    connect(address, &old_connector).await.unwrap();
    connect(address, &client(&[&old_ca], Some(&new_client))).await.unwrap();

    // Then drops the old one: its clients are refused at their next handshake, and a
    // client without a certificate too (required).
    clients.replace_pem(new_ca.ca_pem().as_bytes()).unwrap();
    let refused = connect(address, &old_connector).await.unwrap_err();
    assert!(!refused.is_empty());
    assert!(connect(address, &client(&[&old_ca], None)).await.is_err());
    connect(address, &client(&[&old_ca], Some(&new_client))).await.unwrap();
    // The connection the old client made before goes on.
    round_trip(&mut held).await.unwrap();
}
