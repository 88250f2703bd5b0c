//! [`Roster`]: what the soak knows of each of its processes, shared between the schedule
//! (which kills, stalls and drains them), the readers of their output (heartbeats) and
//! the monitors that judge the invariants.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A process just started (or resumed) is given this long before it must beat, report
/// or answer.
pub(super) const GRACE: Duration = Duration::from_secs(2);

/// `m` locked; a poisoned lock is taken as it is (the soak's shared state is plain data).
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Where a process is in its life, as the schedule made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Life {
    /// Spawned, not yet serving.
    Starting,
    /// Serving (a backend: registered; a steady-slicer: listening).
    Up,
    /// Killed by the schedule, not restarted yet.
    Killed,
    /// Stalled by the schedule (SIGSTOP).
    Stopped,
}

/// A backend's last heartbeat.
#[derive(Debug, Clone, Copy)]
pub(super) struct Beat {
    /// When it was read.
    pub(super) at: Instant,
    /// The generation its Slicelet holds.
    pub(super) generation: u64,
    /// Load reports its reporters sent, over its life.
    pub(super) reports: u64,
}

/// One process of the soak (a steady-slicer instance, a backend, an etcd member).
#[derive(Debug, Clone)]
pub(super) struct Member {
    /// Its name in the tables (`slicer-a`, `backend-2`, `etcd-1`).
    pub(super) name: String,
    /// Its process, while it has one.
    pub(super) pid: Option<u32>,
    pub(super) life: Life,
    /// When `life` last changed.
    pub(super) since: Instant,
    /// A backend drained by the schedule (and not undrained yet).
    pub(super) draining: bool,
    /// A backend's last heartbeat in this life; a steady-slicer's last status line.
    pub(super) beat: Option<Beat>,
    /// Rotated certificates taken in this life (a backend's `done rotate`, an
    /// instance's `TLS: reloaded` lines).
    pub(super) rotations: u64,
    /// Rotated certificates refused in this life.
    pub(super) rotations_failed: u64,
    /// A backend's serving address in this life, once it said it.
    pub(super) addr: Option<String>,
}

impl Member {
    fn new(name: String) -> Self {
        Self {
            name,
            pid: None,
            life: Life::Starting,
            since: Instant::now(),
            draining: false,
            beat: None,
            rotations: 0,
            rotations_failed: 0,
            addr: None,
        }
    }

    /// Whether it serves now: up, and not drained.
    pub(super) fn serving(&self) -> bool {
        self.life == Life::Up && !self.draining
    }

    /// Marks a new life stage.
    pub(super) fn set(&mut self, life: Life) {
        if self.life != life {
            self.life = life;
            self.since = Instant::now();
        }
    }

    /// A fresh process: `pid`, starting, no heartbeat yet.
    pub(super) fn spawned(&mut self, pid: u32) {
        self.pid = Some(pid);
        self.beat = None;
        self.rotations = 0;
        self.rotations_failed = 0;
        self.addr = None;
        self.set(Life::Starting);
    }
}

/// Which group a member is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Group {
    /// The control plane's instances.
    Slicers,
    /// The backend tasks.
    Backends,
}

/// Every member, by group.
#[derive(Debug, Default)]
pub(super) struct Members {
    pub(super) slicers: Vec<Member>,
    pub(super) backends: Vec<Member>,
    pub(super) etcd: Vec<Member>,
}

impl Members {
    pub(super) fn group(&mut self, group: Group) -> &mut Vec<Member> {
        match group {
            Group::Slicers => &mut self.slicers,
            Group::Backends => &mut self.backends,
        }
    }

    pub(super) fn get(&self, group: Group) -> &[Member] {
        match group {
            Group::Slicers => &self.slicers,
            Group::Backends => &self.backends,
        }
    }

    /// Every member with a process, for memory sampling: (name, pid).
    pub(super) fn processes(&self) -> Vec<(String, u32)> {
        let all = self.slicers.iter().chain(&self.backends).chain(&self.etcd);
        all.filter(|m| m.life != Life::Killed).filter_map(|m| Some((m.name.clone(), m.pid?))).collect()
    }
}

/// The shared roster; clones share it.
#[derive(Debug, Clone, Default)]
pub(super) struct Roster(Arc<Mutex<Members>>);

impl Roster {
    /// A roster of `slicers`, `backends` and `etcd` members, all starting.
    pub(super) fn new(slicers: &[String], backends: usize, etcd: usize) -> Self {
        let members = Members {
            slicers: slicers.iter().map(|s| Member::new(s.clone())).collect(),
            backends: (0..backends).map(|i| Member::new(format!("backend-{i}"))).collect(),
            etcd: (0..etcd).map(|i| Member::new(format!("etcd-{i}"))).collect(),
        };
        Self(Arc::new(Mutex::new(members)))
    }

    /// The members, locked (a poisoned lock is taken as it is: the state is plain data).
    pub(super) fn lock(&self) -> MutexGuard<'_, Members> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on member `index` of `group`, if its process is still `pid` (a line read
    /// from a killed process after its successor started is dropped).
    pub(super) fn update(&self, group: Group, index: usize, pid: u32, f: impl FnOnce(&mut Member)) {
        let mut members = self.lock();
        if let Some(member) = members.group(group).get_mut(index) {
            if member.pid == Some(pid) {
                f(member);
            }
        }
    }
}
