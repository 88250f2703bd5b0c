//! The binary's certificates rotate without a restart: its certificate, key and client
//! CA bundle are read again when the files change (on a period, and at once on SIGHUP),
//! while a Watch stream opened before stays open; bad files are refused with one line
//! and the old material stays.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use steady_proto::assignment::assignment_distributor_client::AssignmentDistributorClient;
use steady_proto::assignment::WatchRequest;
use steady_proto::tls::ClientTlsSource;
use steady_testing::tls::{Leaf, TestPki};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

const BIN: &str = env!("CARGO_BIN_EXE_steady-slicer");

/// How long any one change may take to show.
const WAIT: Duration = Duration::from_secs(15);

/// The binary, killed when the test ends, with its stderr lines collected.
struct Running {
    child: std::process::Child,
    address: String,
    stderr: Arc<std::sync::Mutex<Vec<String>>>,
    _stdout: std::io::Lines<BufReader<std::process::ChildStdout>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Running {
    fn start(args: &[&str]) -> Self {
        let mut child = Command::new(BIN)
            .args(args)
            .args(["--listen", "127.0.0.1:0", "--cadence-ms", "100"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = stdout.next().unwrap().unwrap();
        let address = first.split_whitespace().nth(4).unwrap().to_owned();
        let stderr = Arc::new(std::sync::Mutex::new(Vec::new()));
        let lines = stderr.clone();
        let pipe = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                lines.lock().unwrap().push(line);
            }
        });
        Self { child, address, stderr, _stdout: stdout }
    }

    fn stderr_lines(&self, containing: &str) -> Vec<String> {
        self.stderr.lock().unwrap().iter().filter(|l| l.contains(containing)).cloned().collect()
    }

    fn hangup(&self) {
        let status = Command::new("kill").args(["-HUP", &self.child.id().to_string()]).status().unwrap();
        assert!(status.success());
    }
}

/// A client configuration trusting `cas`, presenting `me`.
fn client_tls(cas: &[&TestPki], me: Option<&Leaf>) -> ClientTlsConfig {
    let mut tls =
        ClientTlsConfig::new().ca_certificates(cas.iter().map(|ca| Certificate::from_pem(ca.ca_pem())));
    if let Some(me) = me {
        tls = tls.identity(Identity::from_pem(me.cert_pem(), me.key_pem()));
    }
    tls
}

/// A new connection to the binary with `tls`, its handshake made and one Watch answered
/// (the first assignment): `Ok` with the channel, or why not.
async fn watch_once(address: &str, tls: ClientTlsConfig) -> Result<Channel, String> {
    let endpoint = Endpoint::from_shared(format!("https://{address}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .tls_config(tls)
        .map_err(|e| e.to_string())?;
    let channel = endpoint.connect().await.map_err(|e| steady_core::error_chain(&e))?;
    first_assignment(&channel).await?;
    Ok(channel)
}

/// One Watch on `channel`, answered with the first assignment.
async fn first_assignment(
    channel: &Channel,
) -> Result<tonic::Streaming<steady_proto::assignment::AssignmentUpdate>, String> {
    let mut client = AssignmentDistributorClient::new(channel.clone());
    let request = WatchRequest { job: "users".into(), known_generation: 0 };
    let call = tokio::time::timeout(Duration::from_secs(5), client.watch(request));
    let mut stream = call.await.map_err(|_| "no answer".to_owned())?.map_err(|s| s.to_string())?.into_inner();
    let first = tokio::time::timeout(Duration::from_secs(5), stream.message()).await;
    match first {
        Ok(Ok(Some(_))) => Ok(stream),
        other => Err(format!("no first assignment: {other:?}")),
    }
}

/// Until `check` passes (polled every 50 ms), within [`WAIT`].
async fn until<F: std::future::Future<Output = bool>>(what: &str, mut check: impl FnMut() -> F) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn copy(from: &Path, to: &Path) {
    put(to, std::fs::read(from).unwrap());
}

/// Writes `contents` to `to` as a rotation tool does: to a temporary name, then renamed
/// (the binary, reading the file every 100 ms, never sees half of it).
fn put(to: &Path, contents: impl AsRef<[u8]>) {
    let tmp = to.with_extension("tmp");
    std::fs::write(&tmp, contents).unwrap();
    std::fs::rename(&tmp, to).unwrap();
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Every certificate the binary uses rotates while clients keep connecting: the client
/// CA bundle gains the new CA, the serving certificate moves to the new CA, the clients
/// move to new certificates, the bundle drops the old CA. No connection made along the
/// way fails; a Watch stream opened before the rotation is still open after it, on its
/// first connection; a client presenting the old certificate is refused at the end; a
/// bad certificate file is refused with one line and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_reloads_rotated_files_without_dropping_watch_streams_and_refuses_bad_ones() {
    let (old_ca, new_ca) = (TestPki::new("old CA"), TestPki::new("new CA"));
    let dir = old_ca.dir();
    let (cert, key, bundle): (PathBuf, PathBuf, PathBuf) =
        (dir.join("serving.pem"), dir.join("serving.key"), dir.join("clients.pem"));
    let old_server = old_ca.issue(&["127.0.0.1"]);
    copy(old_server.cert_file(), &cert);
    copy(old_server.key_file(), &key);
    put(&bundle, old_ca.ca_pem());
    let binary = Running::start(&[
        "--job",
        "users",
        "--tasks",
        "3",
        "--tls-cert",
        path(&cert),
        "--tls-key",
        path(&key),
        "--tls-client-ca",
        path(&bundle),
        "--tls-reload-ms",
        "100",
    ]);
    let address = binary.address.clone();
    let (old_client, new_client) = (old_ca.issue(&["users-1"]), new_ca.issue(&["users-1"]));

    // A watcher that connected before the rotation, with the old certificate, holds its
    // stream (and its connection) throughout.
    let held = watch_once(&address, client_tls(&[&old_ca], Some(&old_client))).await.unwrap();
    let mut held_stream = first_assignment(&held).await.unwrap();

    // Load: fresh connections one after another, each with the identity in force, each
    // trusting both CAs, each answered.
    let identity = ClientTlsSource::new(client_tls(&[&old_ca, &new_ca], Some(&old_client))).unwrap();
    let (made, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = tokio::spawn({
        let (identity, made, failed, stop, address) =
            (identity.clone(), made.clone(), failed.clone(), stop.clone(), address.clone());
        async move {
            let mut errors = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                match watch_once(&address, identity.current()).await {
                    Ok(_) => made.fetch_add(1, Ordering::Relaxed),
                    Err(error) => {
                        errors.push(error);
                        failed.fetch_add(1, Ordering::Relaxed)
                    }
                };
            }
            errors
        }
    });
    let after = |n: u64| {
        let made = made.clone();
        async move {
            let from = made.load(Ordering::Relaxed);
            until("connections under load", || {
                let made = made.clone();
                async move { made.load(Ordering::Relaxed) >= from + n }
            })
            .await;
        }
    };
    after(3).await;

    // 1. The bundle gains the new CA: a client of the new CA gets in.
    put(&bundle, format!("{}{}", old_ca.ca_pem(), new_ca.ca_pem()));
    until("the new CA trusted", || watch_ok(&address, client_tls(&[&old_ca], Some(&new_client)))).await;
    after(3).await;

    // 2. The serving certificate moves to the new CA: a client trusting only it gets in.
    let new_server = new_ca.issue(&["127.0.0.1"]);
    copy(new_server.key_file(), &key);
    copy(new_server.cert_file(), &cert);
    until("the new certificate served", || watch_ok(&address, client_tls(&[&new_ca], Some(&new_client))))
        .await;
    after(3).await;

    // 3. The clients move to certificates of the new CA (at their next connection).
    identity.replace(client_tls(&[&old_ca, &new_ca], Some(&new_client))).unwrap();
    after(3).await;

    // 4. The bundle drops the old CA: the old certificate is refused at its next handshake.
    put(&bundle, new_ca.ca_pem());
    until("the old client certificate refused", || async {
        !watch_ok(&address, client_tls(&[&new_ca], Some(&old_client))).await
    })
    .await;
    after(3).await;

    // A bad certificate file is refused with one line; the certificate in force stays.
    std::fs::write(&cert, "-----BEGIN CERTIFICATE-----\nnot a certificate\n-----END CERTIFICATE-----\n")
        .unwrap();
    until("the bad file refused", || async {
        !binary.stderr_lines("TLS: refused the new --tls-cert").is_empty()
    })
    .await;
    after(3).await;
    assert!(watch_ok(&address, client_tls(&[&new_ca], Some(&new_client))).await);

    stop.store(true, Ordering::Relaxed);
    let errors = load.await.unwrap();
    assert_eq!(failed.load(Ordering::Relaxed), 0, "connections failed under rotation: {errors:?}");
    assert!(made.load(Ordering::Relaxed) >= 18);

    // The watcher from before holds its stream, on its first connection: a new call on
    // it is answered although its certificate is no longer trusted for a handshake (a
    // reconnection would have been refused).
    let pending = tokio::time::timeout(Duration::from_millis(300), held_stream.message()).await;
    assert!(pending.is_err(), "the held Watch stream ended: {pending:?}");
    first_assignment(&held).await.expect("the connection from before the rotation still serves");

    let reloaded = binary.stderr_lines("TLS: reloaded");
    assert!(reloaded.iter().any(|l| l.contains("certificate and key")), "{reloaded:?}");
    assert!(reloaded.iter().filter(|l| l.contains("client CA bundle")).count() >= 2, "{reloaded:?}");
    let refused = binary.stderr_lines("TLS: refused");
    assert!(
        refused.iter().all(|l| l.starts_with("steady-slicer: TLS: refused the new --tls-cert/--tls-key: ")),
        "{refused:?}"
    );
}

async fn watch_ok(address: &str, tls: ClientTlsConfig) -> bool {
    watch_once(address, tls).await.is_ok()
}

/// With a long period, SIGHUP alone makes the binary read its files at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_files_at_once() {
    let (old_ca, new_ca) = (TestPki::new("old CA"), TestPki::new("new CA"));
    let dir = old_ca.dir();
    let (cert, key) = (dir.join("serving.pem"), dir.join("serving.key"));
    let old_server = old_ca.issue(&["127.0.0.1"]);
    copy(old_server.cert_file(), &cert);
    copy(old_server.key_file(), &key);
    let binary = Running::start(&[
        "--job",
        "users",
        "--tasks",
        "3",
        "--tls-cert",
        path(&cert),
        "--tls-key",
        path(&key),
        "--tls-reload-ms",
        "3600000",
    ]);
    let address = binary.address.clone();
    assert!(watch_ok(&address, client_tls(&[&old_ca], None)).await);
    let new_server = new_ca.issue(&["127.0.0.1"]);
    copy(new_server.key_file(), &key);
    copy(new_server.cert_file(), &cert);
    assert!(!watch_ok(&address, client_tls(&[&new_ca], None)).await, "not read before SIGHUP");
    binary.hangup();
    until("the new certificate served after SIGHUP", || watch_ok(&address, client_tls(&[&new_ca], None)))
        .await;
    assert!(!binary.stderr_lines("TLS: reloaded the certificate and key").is_empty());
    // The process is still serving (SIGHUP did not end it).
    assert!(binary.stderr_lines("TLS: refused").is_empty());
}
