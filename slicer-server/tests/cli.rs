//! The `steady-slicer` binary: serves the job's assignment on loopback, and refuses bad
//! arguments with one line.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use futures_util::StreamExt;
use tonic::transport::Endpoint;

mod a119_client;
use a119_client::a119_endpoints;

const BIN: &str = env!("CARGO_BIN_EXE_steady-slicer");

/// Kills the child when the test ends, however it ends.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn the_binary_serves_the_first_generation_to_a_watcher() {
    let (_running, address, _stderr) = start(&["--job", "users", "--tasks", "3"]);
    let endpoint = Endpoint::from_shared(format!("http://{address}")).unwrap();
    let mut watch = Box::pin(steady_tonic::watch_assignments(endpoint, "users", Default::default()).unwrap());
    let assignment =
        tokio::time::timeout(Duration::from_secs(10), watch.next()).await.unwrap().unwrap().unwrap();
    assert!(assignment.generation() >= 1);
    let tasks: std::collections::BTreeSet<u32> =
        assignment.slices().iter().flat_map(|s| s.replicas().iter().copied()).collect();
    assert_eq!(tasks.into_iter().collect::<Vec<_>>(), [0, 1, 2]);
}

/// With `--registry` the binary follows the backend job as the registry has it: a task
/// that drains there loses its slices, and one that registers gets some, while the
/// process runs (before, `--tasks N` was fixed until a restart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_follows_the_backend_job_in_the_registry() {
    use steady_discovery::registry::{Registry, RegistryConfig};
    let Some(etcd) = steady_testing::Etcd::start() else { return };
    let config = RegistryConfig::new([etcd.endpoint()]).lease_ttl(Duration::from_secs(5));
    let registry = Registry::connect(config).await.unwrap();
    let mut registrations = Vec::new();
    for i in 0..3 {
        registrations.push(registry.register("users", i, &format!("10.0.0.{i}:50051")).await.unwrap());
    }
    let (_running, address, _stderr) = start(&["--job", "users", "--registry", &etcd.endpoint()]);
    let endpoint = Endpoint::from_shared(format!("http://{address}")).unwrap();
    let mut watch = Box::pin(steady_tonic::watch_assignments(endpoint, "users", Default::default()).unwrap());
    // The tasks that own slices in the next assignment that satisfies `done`.
    let mut until = async |what: &str, done: &dyn Fn(&[u32]) -> bool| {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let next = tokio::time::timeout_at(deadline, watch.next()).await;
            let a =
                next.unwrap_or_else(|_| panic!("no assignment where {what} within 20 s")).unwrap().unwrap();
            let owners: std::collections::BTreeSet<u32> =
                a.slices().iter().flat_map(|s| s.replicas().iter().copied()).collect();
            let owners: Vec<u32> = owners.into_iter().collect();
            if done(&owners) {
                return owners;
            }
        }
    };
    assert_eq!(until("the three registered tasks own slices", &|o| o == [0, 1, 2]).await, [0, 1, 2]);
    registrations[1].drain().await.unwrap();
    assert_eq!(until("task 1 has drained", &|o| !o.contains(&1)).await, [0, 2]);
    registrations.push(registry.register("users", 3, "10.0.0.3:50051").await.unwrap());
    assert!(until("task 3 has joined", &|o| o.contains(&3)).await.contains(&3));
    // A119 clients get the tasks by the addresses they registered.
    let names = a119_endpoints(&address, "users").await.unwrap();
    assert!(names.iter().all(|name| name.starts_with("10.0.0.")), "{names:?}");
}

/// The binary serves gRPC's autosharding protocol (gRFC A119) beside Watch: the job's
/// assignment, its tasks named by their index for `--tasks`; a job it does not serve is
/// `NOT_FOUND`.
#[tokio::test]
async fn the_binary_serves_a119_beside_watch() {
    let (_running, address, _stderr) = start(&["--job", "users", "--tasks", "3"]);
    let names = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            match a119_endpoints(&address, "users").await {
                Ok(names) => return names,
                // Until the first generation is published, after a spec it serves.
                Err(status) => assert_eq!(status.code(), tonic::Code::NotFound, "{status:?}"),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("an assignment within 60 s");
    assert_eq!(names, ["0", "1", "2"]);
    assert_eq!(a119_endpoints(&address, "nobody").await.unwrap_err().code(), tonic::Code::NotFound);
}

/// `--consistency exclusive` runs the job in exclusive mode on etcd: the generation it
/// publishes has one replica per slice and is granted (the job's guard in etcd says so).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_consistency_exclusive_the_binary_grants_what_it_publishes() {
    use steady_slice::guard::Guard;
    use steady_slicer::store::{EtcdConfig, EtcdStore};
    let Some(etcd) = steady_testing::Etcd::start() else { return };
    let endpoint = etcd.endpoint();
    let args = ["--job", "users", "--tasks", "3", "--store", "etcd", "--endpoints", &endpoint];
    let (_running, address, _stderr) = start(&[&args[..], &["--consistency", "exclusive"]].concat());
    let watcher = Endpoint::from_shared(format!("http://{address}")).unwrap();
    let mut watch = Box::pin(steady_tonic::watch_assignments(watcher, "users", Default::default()).unwrap());
    let assignment =
        tokio::time::timeout(Duration::from_secs(10), watch.next()).await.unwrap().unwrap().unwrap();
    assert!(assignment.slices().iter().all(|s| s.replicas().len() == 1), "{assignment:?}");
    let store = EtcdStore::connect(EtcdConfig::new([endpoint.clone()])).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match store.guard("users").await.unwrap() {
            Some(Guard::Granted(g)) if g >= assignment.generation() => break,
            other => assert!(tokio::time::Instant::now() < deadline, "the guard is {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// What exclusive mode cannot run on is one line naming the flags, before anything starts.
#[test]
fn exclusive_mode_without_etcd_or_with_replicas_is_refused_naming_the_flag() {
    let job = ["--job", "users", "--tasks", "3", "--consistency", "exclusive"];
    let (status, stderr) = refused(&job);
    assert!(!status.success());
    assert_eq!(
        stderr.trim(),
        "steady-slicer: --consistency exclusive needs --store etcd (exclusive mode runs on etcd's leases)"
    );
    // Refused before connecting: nothing answers at this endpoint.
    let etcd = ["--store", "etcd", "--endpoints", "http://127.0.0.1:1", "--max-replicas", "2"];
    let (status, stderr) = refused(&[&job[..], &etcd[..]].concat());
    assert!(!status.success());
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("steady-slicer: --max-replicas with --consistency exclusive: ")
            && stderr.contains("at most 1 per slice in exclusive mode"),
        "{stderr}"
    );
}

/// Runs the binary on `args` (on loopback, port 0), killed after 60 s at most: it must
/// have exited by itself by then.
fn refused(args: &[&str]) -> (std::process::ExitStatus, String) {
    let mut child = Child(
        Command::new(BIN)
            .args(args)
            .args(["--listen", "127.0.0.1:0"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "{args:?}: still running after 60 s");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.0.stderr.take().unwrap(), &mut stderr).unwrap();
    (status, stderr)
}

/// Every argument is checked before the process starts serving: a refusal that would
/// repeat for as long as it runs (before: an empty or 300-byte `--candidate` made every
/// campaign fail, and the process served nothing, never exiting) is one line and an exit.
#[test]
fn bad_arguments_exit_non_zero_with_one_line() {
    let long = "c".repeat(300);
    for args in [
        vec!["--job", "users", "--tasks", "0"],
        vec!["--job", "users", "--tasks", "16777217"],
        vec!["--job", "users", "--tasks", "4294967295"],
        vec!["--job", "", "--tasks", "3"],
        vec!["--job", &long, "--tasks", "3"],
        vec!["--job", "users", "--tasks", "3", "--candidate", ""],
        vec!["--job", "users", "--tasks", "3", "--candidate", &long],
        vec!["--job", "users", "--tasks", "3", "--algorithm", "slicer"],
        vec!["--job", "users", "--tasks", "3", "--store", "etcd"],
        vec!["--job", "users", "--tasks", "3", "--endpoints", "http://127.0.0.1:2379"],
        vec!["--job", "users", "--tasks", "3", "--lease-ttl-secs", "5"],
        vec!["--job", "users", "--tasks", "3", "--max-replicas", "0"],
        vec!["--job", "users", "--tasks", "3", "--cadence-ms", "0"],
        // Every write of this job would be too large for the store.
        vec!["--job", "users", "--tasks", "1024"],
        vec!["--job", "users", "--dns", ""],
        // Nothing answers there: one line, not a process that serves nothing.
        vec!["--job", "users", "--registry", "http://127.0.0.1:1"],
    ] {
        let (status, stderr) = refused(&args);
        assert!(!status.success(), "{args:?}");
        assert_eq!(stderr.trim().lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.starts_with("steady-slicer: --"), "{args:?}: {stderr}");
    }
    // The backend job is exactly one of --tasks, --registry, --dns (clap says so: exit 2).
    for args in [vec!["--job", "users"], vec!["--job", "users", "--tasks", "3", "--dns", "users.local."]] {
        let (status, stderr) = refused(&args);
        assert_eq!(status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains("--tasks") && stderr.contains("--dns"), "{args:?}: {stderr}");
    }
}

/// What clap refuses is one line too (before: 3 to 6 lines of usage), naming the argument
/// and pointing at `--help`, with clap's exit code 2; `--help` and `--version` still print
/// as usual.
#[test]
fn arguments_clap_refuses_are_one_line_naming_the_argument() {
    for (args, named) in [
        (vec!["--job", "users", "--tasks", "3", "--frob"], "--frob"),
        (vec!["--job", "users", "--tasks", "-1"], "--tasks"),
        (vec!["--job", "users", "--tasks", "abc"], "--tasks"),
        (vec!["--job", "users", "--tasks", "3", "--cadence-ms", "-5"], "--cadence-ms"),
        (vec!["--job", "users", "--tasks", "3", "--store", "mongo"], "--store"),
        (vec!["--job", "users", "--tasks", "3", "--consistency", "strong"], "--consistency"),
        (vec!["--job", "users", "--tasks", "3", "--listen", "nowhere"], "--listen"),
        (vec!["--tasks", "3"], "--job"),
        (vec!["--job", "users"], "--tasks"),
        (vec!["--job", "users", "--tasks"], "--tasks"),
    ] {
        let out = Command::new(BIN).args(&args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.starts_with("steady-slicer: "), "{args:?}: {stderr}");
        assert!(stderr.contains(named), "{args:?} should name {named}: {stderr}");
        assert!(stderr.contains("'steady-slicer --help'"), "{args:?}: {stderr}");
    }
    let help = Command::new(BIN).arg("--help").output().unwrap();
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(help.status.success() && text.contains("--candidate <CANDIDATE>"), "{text}");
    let version = Command::new(BIN).arg("--version").output().unwrap();
    let text = String::from_utf8_lossy(&version.stdout);
    assert!(version.status.success() && text.starts_with("steady-slicer "), "{text}");
}

/// The TLS options are read and parsed before anything starts: a missing, unreadable or
/// wrong file, or an option without the ones it needs, is one line naming it.
#[test]
fn the_binary_refuses_a_missing_or_unreadable_key_file_in_one_line() {
    let pki = steady_testing::tls::TestPki::new("slicer CA");
    let leaf = pki.issue(&["127.0.0.1"]);
    let (cert, key) = (leaf.cert_file().to_str().unwrap(), leaf.key_file().to_str().unwrap());
    let other = pki.issue(&["127.0.0.1"]);
    let other_key = other.key_file().to_str().unwrap();
    let ca = pki.ca_file();
    let ca = ca.to_str().unwrap();
    let missing = pki.dir().join("missing.key");
    let missing = missing.to_str().unwrap();
    let directory = pki.dir().to_str().unwrap();
    let job = ["--job", "users", "--tasks", "3"];
    for (extra, named) in [
        (vec!["--tls-cert", cert, "--tls-key", missing], format!("--tls-key {missing}: ")),
        (vec!["--tls-cert", cert, "--tls-key", directory], format!("--tls-key {directory}: ")),
        (vec!["--tls-cert", missing, "--tls-key", key], format!("--tls-cert {missing}: ")),
        // A certificate where the key should be: no key in it.
        (vec!["--tls-cert", cert, "--tls-key", cert], "--tls-cert/--tls-key: the key holds no".to_owned()),
        // Another certificate's key.
        (
            vec!["--tls-cert", cert, "--tls-key", other_key],
            "--tls-cert/--tls-key: the key does not go with the certificate".to_owned(),
        ),
        // A client CA bundle with no certificate in it.
        (
            vec!["--tls-cert", cert, "--tls-key", key, "--tls-client-ca", key],
            "--tls-client-ca: the CA bundle holds no PEM certificate".to_owned(),
        ),
        (
            vec!["--tls-cert", cert, "--tls-key", key, "--tls-reload-ms", "5"],
            "--tls-reload-ms 5: ".to_owned(),
        ),
        (
            vec!["--tls-cert", cert, "--tls-key", key, "--tls-client-ca", missing],
            format!("--tls-client-ca {missing}: "),
        ),
        (vec!["--tls-cert", cert], "--tls-cert needs --tls-key".to_owned()),
        (vec!["--tls-client-ca", ca], "--tls-client-ca needs --tls-cert and --tls-key".to_owned()),
        (
            vec!["--tls-cert", cert, "--tls-key", key, "--require-client-cert"],
            "--require-client-cert needs --tls-client-ca".to_owned(),
        ),
        (
            vec!["--tls-cert", cert, "--tls-key", key, "--tls-client-ca", ca, "--reporter-names", "users"],
            "--reporter-names: ".to_owned(),
        ),
    ] {
        let args: Vec<&str> = job.iter().copied().chain(extra.iter().copied()).collect();
        let (status, stderr) = refused(&args);
        assert!(!status.success(), "{args:?}");
        assert_eq!(stderr.trim().lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.starts_with(&format!("steady-slicer: {named}")), "{args:?}: {stderr}");
    }
}

/// The etcd access options are read before anything starts and come in pairs: a missing
/// file, an empty password, or an option without the ones it needs is one line naming it.
#[test]
fn the_binary_refuses_bad_etcd_access_options_in_one_line() {
    let pki = steady_testing::tls::TestPki::new("etcd CA");
    let leaf = pki.issue(&["steady-slicer"]);
    let (cert, key) = (leaf.cert_file().to_str().unwrap(), leaf.key_file().to_str().unwrap());
    let ca = pki.ca_file();
    let ca = ca.to_str().unwrap();
    let missing = pki.dir().join("missing.pem");
    let missing = missing.to_str().unwrap();
    let empty = pki.dir().join("empty-password");
    std::fs::write(&empty, "\n").unwrap();
    let empty = empty.to_str().unwrap();
    let etcd = ["--job", "users", "--tasks", "3", "--store", "etcd", "--endpoints", "https://127.0.0.1:1"];
    let memory = ["--job", "users", "--tasks", "3"];
    let registry = ["--job", "users", "--registry", "https://127.0.0.1:1"];
    for (base, extra, named) in [
        (&memory[..], vec!["--etcd-ca", ca], "--etcd-ca is for --store etcd or --registry".to_owned()),
        (&memory[..], vec!["--etcd-user", "u"], "--etcd-user is for --store etcd or --registry".to_owned()),
        // With --registry the same checks apply (the registry is reached with them).
        (&registry[..], vec!["--etcd-ca", missing], format!("--etcd-ca {missing}: ")),
        (&registry[..], vec!["--etcd-user", "slicer"], "--etcd-user needs --etcd-password-file".to_owned()),
        (&etcd[..], vec!["--etcd-ca", missing], format!("--etcd-ca {missing}: ")),
        (
            &etcd[..],
            vec!["--etcd-ca", ca, "--etcd-cert", cert, "--etcd-key", missing],
            format!("--etcd-key {missing}: "),
        ),
        (&etcd[..], vec!["--etcd-ca", ca, "--etcd-cert", cert], "--etcd-cert needs --etcd-key".to_owned()),
        (
            &etcd[..],
            vec!["--etcd-cert", cert, "--etcd-key", key],
            "--etcd-cert and --etcd-key need --etcd-ca".to_owned(),
        ),
        (&etcd[..], vec!["--etcd-user", "slicer"], "--etcd-user needs --etcd-password-file".to_owned()),
        (&etcd[..], vec!["--etcd-password-file", empty], "--etcd-password-file needs --etcd-user".to_owned()),
        (
            &etcd[..],
            vec!["--etcd-user", "s", "--etcd-password-file", missing],
            format!("--etcd-password-file {missing}: "),
        ),
        (
            &etcd[..],
            vec!["--etcd-user", "s", "--etcd-password-file", empty],
            format!("--etcd-password-file {empty}: the first line is empty"),
        ),
    ] {
        let args: Vec<&str> = base.iter().copied().chain(extra.iter().copied()).collect();
        let (status, stderr) = refused(&args);
        assert!(!status.success(), "{args:?}");
        assert_eq!(stderr.trim().lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.starts_with(&format!("steady-slicer: {named}")), "{args:?}: {stderr}");
    }
}

/// The first generation the binary at `address` serves (plaintext), within 10 s.
async fn first_generation(address: &str) -> u64 {
    let endpoint = Endpoint::from_shared(format!("http://{address}")).unwrap();
    let mut watch = Box::pin(steady_tonic::watch_assignments(endpoint, "users", Default::default()).unwrap());
    let assignment =
        tokio::time::timeout(Duration::from_secs(10), watch.next()).await.unwrap().unwrap().unwrap();
    assignment.generation()
}

/// The binary keeps its assignments on an etcd that serves over TLS and requires client
/// certificates; given the wrong CA it exits at start with one line naming TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_runs_on_etcd_over_tls_with_a_client_certificate_and_refuses_a_wrong_ca_in_one_line() {
    let pki = steady_testing::tls::TestPki::new("etcd CA");
    let server = pki.issue(&["127.0.0.1"]);
    let options = steady_testing::EtcdOptions::new()
        .tls(server.cert_file(), server.key_file())
        .client_cert_auth(pki.ca_file());
    let Some(etcd) = steady_testing::Etcd::start_with(options) else { return };
    let client = pki.issue(&["steady-slicer"]);
    let endpoint = etcd.endpoint();
    let (cert, key) = (client.cert_file().to_str().unwrap(), client.key_file().to_str().unwrap());
    let ca = pki.ca_file();
    let mut args = vec!["--job", "users", "--tasks", "3", "--store", "etcd", "--endpoints", &endpoint];
    args.extend(["--etcd-cert", cert, "--etcd-key", key, "--etcd-ca"]);
    {
        let with_ca = [&args[..], &[ca.to_str().unwrap()]].concat();
        let (_running, address, _stderr) = start(&with_ca);
        assert!(first_generation(&address).await >= 1);
    }
    let stranger = steady_testing::tls::TestPki::new("another CA");
    let wrong_ca = stranger.ca_file();
    let with_wrong_ca = [&args[..], &[wrong_ca.to_str().unwrap()]].concat();
    let (status, stderr) = refused(&with_wrong_ca);
    assert!(!status.success());
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("steady-slicer: store: etcd at ") && stderr.contains("TLS failed"),
        "{stderr}"
    );
}

/// The binary logs in to an etcd with authentication as a user confined to its prefix;
/// with a wrong password it exits at start with one line naming the user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_runs_on_etcd_as_a_user_and_refuses_a_wrong_password_in_one_line() {
    let options = steady_testing::EtcdOptions::new().auth("root-secret").user(
        "slicer",
        "slicer-secret",
        steady_slicer::store::DEFAULT_KEY_PREFIX,
    );
    let Some(etcd) = steady_testing::Etcd::start_with(options) else { return };
    let dir = steady_testing::tls::TestPki::new("unused");
    let (right, wrong) = (dir.dir().join("right"), dir.dir().join("wrong"));
    std::fs::write(&right, "slicer-secret\n").unwrap();
    std::fs::write(&wrong, "not-the-password\n").unwrap();
    let endpoint = etcd.endpoint();
    let args = [
        "--job",
        "users",
        "--tasks",
        "3",
        "--store",
        "etcd",
        "--endpoints",
        &endpoint,
        "--etcd-user",
        "slicer",
    ];
    {
        let with_password = [&args[..], &["--etcd-password-file", right.to_str().unwrap()]].concat();
        let (_running, address, _stderr) = start(&with_password);
        assert!(first_generation(&address).await >= 1);
    }
    let with_wrong = [&args[..], &["--etcd-password-file", wrong.to_str().unwrap()]].concat();
    let (status, stderr) = refused(&with_wrong);
    assert!(!status.success());
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("steady-slicer: store: etcd refused user \"slicer\""), "{stderr}");
    assert!(!stderr.contains("not-the-password"), "{stderr}");
}

/// One set of `--etcd-*` flags reaches both the registry and the store: on an etcd that
/// serves over TLS, requires client certificates and runs with authentication, the binary
/// follows the tasks registered there (`--registry https://...`) while keeping its
/// assignments in the same cluster as a user confined to the prefix; a wrong password is
/// one line at start naming the registry's connection. (Before, `--registry` connected
/// in plaintext, without a user: it could not follow such a registry at all.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_follows_a_registry_on_etcd_over_tls_as_a_user_with_the_store_s_flags() {
    use steady_discovery::registry::{EtcdAccess, EtcdTls, Registry, RegistryConfig, DEFAULT_KEY_PREFIX};
    let pki = steady_testing::tls::TestPki::new("etcd CA");
    let server = pki.issue(&["127.0.0.1"]);
    let options = steady_testing::EtcdOptions::new()
        .tls(server.cert_file(), server.key_file())
        .client_cert_auth(pki.ca_file())
        .auth("root-secret")
        .user("slicer", "slicer-secret", DEFAULT_KEY_PREFIX);
    let Some(etcd) = steady_testing::Etcd::start_with(options) else { return };
    let endpoint = etcd.endpoint();
    assert!(endpoint.starts_with("https://"), "{endpoint}");
    // The job's tasks, registered by their own process (here, the test) with the same access.
    let backend = pki.issue(&["users-backend"]);
    let access = EtcdAccess::new()
        .tls(EtcdTls::new(pki.ca_pem()).identity(backend.cert_pem(), backend.key_pem()))
        .user("slicer", "slicer-secret");
    let config = RegistryConfig::new([endpoint.clone()]).lease_ttl(Duration::from_secs(5)).access(access);
    let registry = Registry::connect(config).await.unwrap();
    let mut registrations = Vec::new();
    for i in [0, 2, 5] {
        registrations.push(registry.register("users", i, &format!("10.0.0.{i}:50051")).await.unwrap());
    }

    let client = pki.issue(&["steady-slicer"]);
    let (right, wrong) = (pki.dir().join("right"), pki.dir().join("wrong"));
    std::fs::write(&right, "slicer-secret\n").unwrap();
    std::fs::write(&wrong, "not-the-password\n").unwrap();
    let ca = pki.ca_file();
    let args = [
        "--job",
        "users",
        "--registry",
        &endpoint,
        "--store",
        "etcd",
        "--endpoints",
        &endpoint,
        "--etcd-ca",
        ca.to_str().unwrap(),
        "--etcd-cert",
        client.cert_file().to_str().unwrap(),
        "--etcd-key",
        client.key_file().to_str().unwrap(),
        "--etcd-user",
        "slicer",
        "--etcd-password-file",
    ];
    {
        let with_password = [&args[..], &[right.to_str().unwrap()]].concat();
        let (_running, address, _stderr) = start(&with_password);
        let endpoint = Endpoint::from_shared(format!("http://{address}")).unwrap();
        let mut watch =
            Box::pin(steady_tonic::watch_assignments(endpoint, "users", Default::default()).unwrap());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let next = tokio::time::timeout_at(deadline, watch.next()).await;
            let a = next.expect("no assignment over the registered tasks within 20 s").unwrap().unwrap();
            let owners: std::collections::BTreeSet<u32> =
                a.slices().iter().flat_map(|s| s.replicas().iter().copied()).collect();
            if owners.into_iter().collect::<Vec<_>>() == [0, 2, 5] {
                break;
            }
        }
    }
    let with_wrong = [&args[..], &[wrong.to_str().unwrap()]].concat();
    let (status, stderr) = refused(&with_wrong);
    assert!(!status.success());
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("steady-slicer: --registry: registry: etcd refused user \"slicer\""),
        "{stderr}"
    );
    assert!(!stderr.contains("not-the-password"), "{stderr}");
    drop(registrations);
}

/// The binary, running: its stdout stays open (it prints a status line per cadence, and
/// a closed pipe would end it).
struct Running {
    _child: Child,
    _stdout: std::io::Lines<BufReader<std::process::ChildStdout>>,
}

/// Starts the binary with `args` on loopback and returns it with the address it serves
/// on (from its first line) and its stderr.
fn start(args: &[&str]) -> (Running, String, std::process::ChildStderr) {
    let mut child = Child(
        Command::new(BIN)
            .args(args)
            .args(["--listen", "127.0.0.1:0", "--cadence-ms", "100"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut stdout = BufReader::new(child.0.stdout.take().unwrap()).lines();
    let first = stdout.next().unwrap().unwrap();
    // "steady-slicer: job users on 127.0.0.1:PORT (Memory store), candidate assigner, eventual"
    let address = first.split_whitespace().nth(4).unwrap().to_owned();
    let stderr = child.0.stderr.take().unwrap();
    (Running { _child: child, _stdout: stdout }, address, stderr)
}

#[tokio::test]
async fn without_client_certificates_the_binary_warns_once_that_reports_are_unauthenticated() {
    let (_child, _address, stderr) = start(&["--job", "users", "--tasks", "3"]);
    let warning = BufReader::new(stderr).lines().next().unwrap().unwrap();
    assert!(warning.starts_with("steady-slicer: warning: load reports are unauthenticated"), "{warning}");
}

#[tokio::test]
async fn the_binary_serves_over_tls_and_takes_reports_only_from_the_task_a_certificate_names() {
    use steady_proto::load::load_collector_client::LoadCollectorClient;
    use steady_proto::load::{LoadReport, SliceLoad};
    use tonic::transport::{Certificate, ClientTlsConfig, Identity};

    let pki = steady_testing::tls::TestPki::new("fleet CA");
    let server = pki.issue(&["127.0.0.1"]);
    let ca = pki.ca_file();
    let (running, address, stderr) = start(&[
        "--job",
        "users",
        "--tasks",
        "3",
        "--tls-cert",
        server.cert_file().to_str().unwrap(),
        "--tls-key",
        server.key_file().to_str().unwrap(),
        "--tls-client-ca",
        ca.to_str().unwrap(),
    ]);
    let trust = || ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pki.ca_pem()));
    let endpoint = |tls: ClientTlsConfig| {
        Endpoint::from_shared(format!("https://{address}")).unwrap().tls_config(tls).unwrap()
    };

    // A frontend watches over TLS without a certificate of its own.
    let mut watch =
        Box::pin(steady_tonic::watch_assignments(endpoint(trust()), "users", Default::default()).unwrap());
    let assignment =
        tokio::time::timeout(Duration::from_secs(10), watch.next()).await.unwrap().unwrap().unwrap();
    // Task 1's first slice, in the generation the binary published.
    let start = assignment.slices().iter().find(|s| s.replicas().contains(&1)).unwrap().start.0;
    let report = |task| LoadReport {
        version: 1,
        job: "users".into(),
        task,
        generation: assignment.generation(),
        slices: vec![SliceLoad { start, rate: 5.0 }],
        hot_keys: vec![],
    };
    let send = |me: &steady_testing::tls::Leaf, task| {
        let tls = trust().identity(Identity::from_pem(me.cert_pem(), me.key_pem()));
        let endpoint = endpoint(tls);
        async move {
            let mut client = LoadCollectorClient::connect(endpoint).await.unwrap();
            client.report(tokio_stream::iter([report(task)])).await.map(tonic::Response::into_inner)
        }
    };
    // Task 1's certificate reports task 1's load: accepted.
    let summary = send(&pki.issue(&["users-1"]), 1).await.unwrap();
    assert_eq!(summary.accepted, 1, "{summary:?}");
    // Task 0's certificate cannot report task 1's load.
    let status = send(&pki.issue(&["users-0"]), 1).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
    // No warning: reports are authenticated.
    drop(running);
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut { stderr }, &mut rest).unwrap();
    assert!(!rest.contains("unauthenticated"), "{rest}");
}
