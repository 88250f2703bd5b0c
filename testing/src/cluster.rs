//! [`EtcdCluster`]: several real `etcd` members on 127.0.0.1, one cluster.

use std::time::{Duration, Instant};

use crate::{free_ports, http_get, installed, temp_dir, Etcd, EtcdOptions, PORT_ATTEMPTS, START_TIMEOUT};

/// A running etcd cluster of three (or more) members on 127.0.0.1, for one test: what
/// production runs, so that a test can kill the leader and watch another be elected, stop
/// one member while the others keep quorum, or restart them all on their data.
///
/// Each member is an [`Etcd`] of its own (free ports below the ephemeral range, a fresh
/// data directory, killed and removed on drop), started with the others in its
/// `--initial-cluster`. Members are numbered from 0; [`EtcdCluster::endpoints`] lists
/// every member's client URL, in that order, for a client that fails over between them.
/// Plaintext and without authentication (the single [`Etcd`] covers TLS and users).
///
/// ```no_run
/// # fn test() {
/// let Some(mut etcd) = steady_testing::EtcdCluster::start() else { return };
/// let endpoints = etcd.endpoints(); // three "http://127.0.0.1:<port>"
/// let leader = etcd.wait_for_leader();
/// etcd.kill(leader);                // the others elect a new leader
/// etcd.restart(leader);             // and it rejoins as a follower
/// # let _ = endpoints;
/// # }
/// ```
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<Etcd>,
}

impl EtcdCluster {
    /// Starts three members and waits (at most [`START_TIMEOUT`]) until every one reports
    /// healthy, which needs an elected leader.
    ///
    /// Returns `None` when `etcd` is not installed and the etcd tests are not mandatory,
    /// as [`Etcd::start`] does.
    ///
    /// # Panics
    ///
    /// As [`Etcd::start`]: `etcd` missing while [`crate::REQUIRE_ETCD`] is set, or a
    /// cluster that does not come up healthy (the message holds each member's log).
    pub fn start() -> Option<Self> {
        Self::start_members(3)
    }

    /// [`EtcdCluster::start`] with `count` members (at least 1).
    ///
    /// # Panics
    ///
    /// As [`EtcdCluster::start`]; also when `count` is 0.
    pub fn start_members(count: usize) -> Option<Self> {
        assert!(count > 0, "a cluster has at least one member");
        if !installed() {
            return None;
        }
        let dir = temp_dir("steady-etcd-cluster");
        let mut failures = Vec::new();
        for _ in 0..PORT_ATTEMPTS {
            let mut taken = Vec::new();
            let mut members: Vec<Etcd> = (0..count)
                .map(|i| {
                    // Each draw is free of itself; members must not share one either.
                    let [client, peer, metrics] = loop {
                        let ports = free_ports();
                        if !ports.iter().any(|p| taken.contains(p)) {
                            taken.extend(ports);
                            break ports;
                        }
                    };
                    Etcd {
                        child: None,
                        dir: dir.join(format!("m{i}")),
                        client,
                        peer,
                        metrics,
                        setup: None,
                        options: EtcdOptions::new(),
                        name: format!("m{i}"),
                        initial_cluster: None,
                        reserved: Vec::new(),
                    }
                })
                .collect();
            let initial: Vec<String> =
                members.iter().map(|m| format!("{}=http://{}", m.name, m.peer)).collect();
            for member in &mut members {
                member.initial_cluster = Some(initial.join(","));
            }
            let mut cluster = Self { members };
            match cluster.spawn_all() {
                Ok(()) => return Some(cluster),
                Err(failure) => {
                    failures.push(failure);
                    drop(cluster);
                }
            }
        }
        panic!("the etcd cluster did not start in {PORT_ATTEMPTS} attempts:\n{}", failures.join("\n"));
    }

    /// How many members the cluster has (running or not).
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Always `false`: a cluster has at least one member.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Every member's client URL (`http://127.0.0.1:<port>`), member 0 first.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(Etcd::endpoint).collect()
    }

    /// Member `member`'s client URL.
    ///
    /// # Panics
    ///
    /// When there is no such member.
    pub fn endpoint(&self, member: usize) -> String {
        self.members[member].endpoint()
    }

    /// Member `member`'s process id while it runs (`None` after [`EtcdCluster::kill`]):
    /// for a caller that samples the members' memory.
    ///
    /// # Panics
    ///
    /// When there is no such member.
    pub fn pid(&self, member: usize) -> Option<u32> {
        self.members[member].child.as_ref().map(std::process::Child::id)
    }

    /// Which member leads now, by the members' own word (`etcd_server_is_leader` on their
    /// metrics port); `None` while no running member says it leads.
    pub fn leader(&self) -> Option<usize> {
        self.members.iter().position(|m| {
            m.child.is_some()
                && http_get(m.metrics, "/metrics", 4 << 20)
                    .is_ok_and(|text| text.lines().any(|line| line.trim() == "etcd_server_is_leader 1"))
        })
    }

    /// Waits (at most [`START_TIMEOUT`]) until a member leads, and returns it.
    ///
    /// # Panics
    ///
    /// When no member leads in time (fewer than a quorum running, for instance).
    pub fn wait_for_leader(&self) -> usize {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(leader) = self.leader() {
                return leader;
            }
            assert!(Instant::now() < deadline, "no etcd member leads after {START_TIMEOUT:?}");
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// Whether member `member` is running and reports healthy (a leader is known to it
    /// and it answers through it).
    pub fn is_healthy(&self, member: usize) -> bool {
        let m = &self.members[member];
        m.child.is_some() && crate::healthy(m.metrics)
    }

    /// Kills member `member` at once (SIGKILL), keeping its data and ports: a crash, or a
    /// member cut off from the others and from clients.
    pub fn kill(&mut self, member: usize) {
        // Its ports are not held (`Etcd::kill`): the other members connect to its peer
        // port, and a listener there would take what a dead member refuses.
        self.members[member].stop();
    }

    /// Starts member `member` again on its ports and data after [`EtcdCluster::kill`] and
    /// waits (at most [`START_TIMEOUT`]) until it is healthy, that is back in the cluster.
    ///
    /// # Panics
    ///
    /// When it does not come back healthy (no quorum without it, or its port taken).
    pub fn restart(&mut self, member: usize) {
        let m = &mut self.members[member];
        m.stop();
        if let Err(failure) = m.launch() {
            panic!("etcd member {member} did not restart: {failure}");
        }
    }

    /// Kills every member at once (SIGKILL).
    pub fn kill_all(&mut self) {
        for member in &mut self.members {
            member.stop();
        }
    }

    /// Starts every member again on its ports and data (after [`EtcdCluster::kill_all`],
    /// or some of them killed) and waits until all are healthy: they are started together,
    /// since none is healthy before a quorum is up.
    ///
    /// # Panics
    ///
    /// When the cluster does not come back healthy in [`START_TIMEOUT`].
    pub fn restart_all(&mut self) {
        self.kill_all();
        if let Err(failure) = self.spawn_all() {
            panic!("the etcd cluster did not restart: {failure}");
        }
    }

    /// Spawns every member, then waits until each is healthy; on failure stops them all
    /// and says why, with each member's log.
    fn spawn_all(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + START_TIMEOUT;
        let mut result = Ok(());
        for member in &mut self.members {
            result = result.and_then(|()| member.spawn());
        }
        for member in &mut self.members {
            result = result.and_then(|()| member.wait_healthy(deadline));
        }
        if let Err(failure) = &result {
            let logs: Vec<String> = self
                .members
                .iter()
                .map(|m| format!("member {}'s log ends:\n{}", m.name, m.log_tail()))
                .collect();
            self.kill_all();
            return Err(format!("{failure}\n{}", logs.join("\n")));
        }
        result
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        // Each member removes its own directory; the cluster's is left empty.
        let parent = self.members.first().and_then(|m| m.dir.parent().map(std::path::Path::to_path_buf));
        self.members.clear();
        if let Some(parent) = parent {
            let _ = std::fs::remove_dir_all(parent);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_elects_a_new_leader_when_its_leader_dies_and_survives_a_full_restart() {
        let Some(mut etcd) = EtcdCluster::start() else { return };
        assert_eq!(etcd.len(), 3);
        let endpoints = etcd.endpoints();
        assert_eq!(endpoints.len(), 3);
        assert!((0..3).all(|m| etcd.is_healthy(m)));
        let leader = etcd.wait_for_leader();

        etcd.kill(leader);
        assert!(!etcd.is_healthy(leader));
        let next = etcd.wait_for_leader();
        assert_ne!(next, leader, "a dead member cannot lead");
        etcd.restart(leader);
        assert!(etcd.is_healthy(leader), "the old leader is back, as a member");

        etcd.kill_all();
        assert_eq!(etcd.leader(), None);
        etcd.restart_all();
        assert!((0..3).all(|m| etcd.is_healthy(m)));
        assert_eq!(etcd.endpoints(), endpoints, "the same ports after a restart");
        let dir = etcd.members[0].dir.parent().unwrap().to_path_buf();
        drop(etcd);
        assert!(!dir.exists(), "the data directories are still there");
    }
}
