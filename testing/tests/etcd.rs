//! The etcd harness's fault injection: a killed server keeps its ports for its restart.

use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use steady_testing::Etcd;

/// While a server is killed, no one else can bind its peer port (another test's server
/// once took a killed server's port in that window, and its restart failed: "bind:
/// address already in use"), a connection to its client port is refused as a dead
/// server's is, and the restart gets every port back.
#[test]
fn a_killed_server_holds_its_ports_for_its_restart_and_refuses_connections() {
    let Some(mut etcd) = Etcd::start() else { return };
    let client = etcd.endpoint().trim_start_matches("http://").parse::<std::net::SocketAddr>().unwrap();
    let peer = etcd.peer_address();
    etcd.kill();
    // A single member's peer port has no connection to linger in TIME_WAIT: it is held.
    let taken = TcpListener::bind(peer);
    assert!(taken.is_err(), "another socket bound the killed server's peer port {peer}");
    // Killed again (a test's cleanup, say): still held.
    etcd.kill();
    assert!(TcpListener::bind(peer).is_err(), "a second kill let the peer port {peer} go");
    let refused = TcpStream::connect_timeout(&client, Duration::from_secs(5)).unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused, "{refused}");
    etcd.restart();
    TcpStream::connect_timeout(&client, Duration::from_secs(5)).expect("the restarted server answers");
}
