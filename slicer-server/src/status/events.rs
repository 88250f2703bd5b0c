//! The event log: what changed in the fleet as this instance sees it, each event naming
//! its job (or none: the instance's own), the last [`MAX_EVENTS`] kept.
//!
//! It is made by comparing two looks ([`Seen`]) at the sources: the [`FleetStatus`]
//! (jobs created, changed and removed, instances joined and gone, leadership won and
//! lost here) and, for each job whose Assigner runs here, its statistics and task set
//! (generations published, tasks joined, drained and gone, the placement missed and met
//! again), and the collector's refusals. Jobs led elsewhere make no event of their own
//! (their generations are on their leader's pages): a fleet of thousands of jobs would
//! otherwise push everything else out of the log.
//!
//! One change that concerns many jobs at once (an instance joining takes jobs from every
//! other; a spec store read at start creates them all) is one event naming the first
//! [`SPELLED_OUT`] of them and how many more, not one event per job.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use steady_assigner::TaskState;
use steady_slicer::assigner_service::AssignerStats;

use super::StatusSources;
use crate::fleet::FleetStatus;

/// How many events the log keeps.
pub(crate) const MAX_EVENTS: usize = 100;
/// How many items of one kind one look turns into events of their own; past it, one
/// event names the first this many and counts the rest.
pub(crate) const SPELLED_OUT: usize = 5;

/// One event.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Event {
    pub(crate) at: SystemTime,
    /// The job it concerns; `None`: the instance or the fleet.
    pub(crate) job: Option<String>,
    pub(crate) text: String,
}

/// The last [`MAX_EVENTS`] events.
#[derive(Debug, Default)]
pub(crate) struct EventLog {
    events: Mutex<VecDeque<Event>>,
}

impl EventLog {
    pub(crate) fn push(&self, job: Option<String>, text: String) {
        match &job {
            Some(job) => tracing::info!(job = %job, event = %text, "status"),
            None => tracing::info!(event = %text, "status"),
        }
        let mut events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        if events.len() == MAX_EVENTS {
            events.pop_front();
        }
        events.push_back(Event { at: SystemTime::now(), job, text });
    }

    /// Every event, oldest first.
    pub(crate) fn all(&self) -> Vec<Event> {
        self.events.lock().unwrap_or_else(|p| p.into_inner()).iter().cloned().collect()
    }

    /// The events of `job`, oldest first.
    pub(crate) fn of(&self, job: &str) -> Vec<(SystemTime, String)> {
        let events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        events.iter().filter(|e| e.job.as_deref() == Some(job)).map(|e| (e.at, e.text.clone())).collect()
    }
}

/// What the event log compares between two looks.
#[derive(Debug)]
pub(crate) struct Seen {
    fleet: Arc<FleetStatus>,
    /// The jobs whose Assigner runs here.
    here: BTreeMap<String, SeenJob>,
    refused: u64,
    dropped: u64,
    invalid: u64,
}

/// A job whose Assigner runs here.
#[derive(Debug)]
struct SeenJob {
    /// Its statistics: counts are compared only within one service's.
    stats: Arc<AssignerStats>,
    leading: bool,
    generation: u64,
    tasks: Vec<(u32, TaskState)>,
    /// The constraints the last run misses, by name, and why they cannot be met.
    missed: Vec<&'static str>,
    infeasible: Option<String>,
}

/// One change, before [`fold`] decides whether it is an event of its own.
struct Item {
    job: Option<String>,
    text: String,
    /// What a summary of many lists for it.
    label: String,
}

impl Item {
    fn of(job: &str, text: String) -> Self {
        Self { job: Some(job.to_owned()), text, label: job.to_owned() }
    }
}

/// `items` as events: each its own while they are at most [`SPELLED_OUT`], else one,
/// `summary(count, the first labels)`, of no job.
fn fold(
    events: &mut Vec<(Option<String>, String)>,
    items: Vec<Item>,
    summary: impl FnOnce(usize, String) -> String,
) {
    if items.len() <= SPELLED_OUT {
        events.extend(items.into_iter().map(|i| (i.job, i.text)));
        return;
    }
    let mut named = items.iter().take(SPELLED_OUT).map(|i| i.label.as_str()).collect::<Vec<_>>().join(", ");
    named.push_str(&format!(" and {} more", items.len() - SPELLED_OUT));
    events.push((None, summary(items.len(), named)));
}

impl Seen {
    pub(crate) fn read(s: &StatusSources) -> Self {
        let fleet = s.fleet.borrow().clone();
        let here = fleet
            .jobs
            .iter()
            .filter_map(|(name, job)| {
                let stats = job.assigner.as_ref()?;
                let placement = stats.placement();
                let seen = SeenJob {
                    stats: stats.clone(),
                    leading: stats.is_leading(),
                    generation: stats.generation(),
                    tasks: job.tasks.as_ref().map(|t| t.borrow().iter().collect()).unwrap_or_default(),
                    missed: placement.violations.iter().map(|v| v.constraint.name()).collect(),
                    infeasible: placement.infeasible.map(|why| why.to_string()),
                };
                Some((name.clone(), seen))
            })
            .collect();
        Self {
            fleet,
            here,
            refused: s.collector.refused(),
            dropped: s.collector.book().dropped(),
            invalid: s.collector.invalid(),
        }
    }

    /// The events from `self` to `now`, each with its job; `instance` is this one's name.
    pub(crate) fn changes(&self, now: &Self, instance: &str) -> Vec<(Option<String>, String)> {
        let mut events = Vec::new();
        if !Arc::ptr_eq(&self.fleet, &now.fleet) {
            self.fleet_changes(now, &mut events);
        }
        let (mut won, mut lost) = (Vec::new(), Vec::new());
        for name in self.here.keys().chain(now.here.keys().filter(|n| !self.here.contains_key(*n))) {
            let was = self.here.get(name).is_some_and(|j| j.leading);
            let is = now.here.get(name).is_some_and(|j| j.leading);
            match (was, is) {
                (false, true) => won.push(Item::of(name, format!("{instance} became the leader"))),
                (true, false) => lost.push(Item::of(name, format!("{instance} lost the leadership"))),
                _ => {}
            }
        }
        fold(&mut events, won, |n, named| format!("{instance} became the leader of {n} jobs: {named}"));
        fold(&mut events, lost, |n, named| format!("{instance} lost the leadership of {n} jobs: {named}"));
        let mut generations = Vec::new();
        for (name, job) in &now.here {
            let Some(before) = self.here.get(name).filter(|b| Arc::ptr_eq(&b.stats, &job.stats)) else {
                continue;
            };
            if job.generation > before.generation {
                generations.push(Item {
                    job: Some(name.clone()),
                    text: published(&job.stats, job.generation),
                    label: format!("{name} {}", job.generation),
                });
            }
            task_changes(name, &before.tasks, &job.tasks, &mut events);
            if job.infeasible != before.infeasible {
                events.push((
                    Some(name.clone()),
                    match &job.infeasible {
                        Some(why) => format!("placement infeasible: {why}"),
                        None => "placement feasible again".to_owned(),
                    },
                ));
            }
            if job.missed != before.missed {
                events.push((
                    Some(name.clone()),
                    if job.missed.is_empty() {
                        "placement met: no slice misses a constraint".to_owned()
                    } else {
                        format!("placement missed: {}", job.missed.join(", "))
                    },
                ));
            }
        }
        fold(&mut events, generations, |n, named| format!("{n} generations published here: {named}"));
        for (what, before, after) in [
            ("load reports refused (sender not authorized for the task)", self.refused, now.refused),
            ("load reports dropped (unknown job, task or generation)", self.dropped, now.dropped),
            ("invalid load report messages", self.invalid, now.invalid),
        ] {
            if after > before {
                events.push((None, format!("{} {what}", after - before)));
            }
        }
        events
    }

    /// Instances joined and gone; jobs created, changed and removed.
    fn fleet_changes(&self, now: &Self, events: &mut Vec<(Option<String>, String)>) {
        let (before, after) = (&self.fleet, &now.fleet);
        let joined = after
            .instances
            .iter()
            .filter(|(name, _)| !before.instances.contains_key(*name))
            .map(|(name, i)| Item {
                job: None,
                text: format!("instance {name} joined (gRPC at {})", i.address),
                label: name.clone(),
            })
            .collect();
        fold(events, joined, |n, named| format!("{n} instances joined: {named}"));
        let gone = before
            .instances
            .keys()
            .filter(|name| !after.instances.contains_key(*name))
            .map(|name| Item { job: None, text: format!("instance {name} is gone"), label: name.clone() })
            .collect();
        fold(events, gone, |n, named| format!("{n} instances gone: {named}"));
        let created = after
            .jobs
            .iter()
            .filter(|(name, _)| !before.jobs.contains_key(*name))
            .map(|(name, j)| {
                Item::of(name, format!("job created ({}, {})", j.config.algorithm, j.config.consistency))
            })
            .collect();
        fold(events, created, |n, named| format!("{n} jobs created: {named}"));
        let removed = before
            .jobs
            .keys()
            .filter(|name| !after.jobs.contains_key(*name))
            .map(|name| Item::of(name, "job removed".to_owned()))
            .collect();
        fold(events, removed, |n, named| format!("{n} jobs removed: {named}"));
        let mut changed = Vec::new();
        for (name, job) in &after.jobs {
            let Some(old) = before.jobs.get(name) else { continue };
            if Arc::ptr_eq(&old.config, &job.config) || old.config == job.config {
                continue;
            }
            let (old, new) = (&old.config, &job.config);
            let drained: Vec<String> = new.drained.difference(&old.drained).map(u32::to_string).collect();
            let undrained: Vec<String> = old.drained.difference(&new.drained).map(u32::to_string).collect();
            let mut text = Vec::new();
            if !drained.is_empty() {
                text.push(format!("tasks drained: {}", list(&drained)));
            }
            if !undrained.is_empty() {
                text.push(format!("tasks undrained: {}", list(&undrained)));
            }
            let (mut old_rest, mut new_rest) = ((**old).clone(), (**new).clone());
            old_rest.drained.clear();
            new_rest.drained.clear();
            if old_rest != new_rest {
                text.push("spec changed".to_owned());
            }
            changed.push(Item::of(name, text.join("; ")));
        }
        fold(events, changed, |n, named| format!("{n} job specs changed: {named}"));
    }
}

/// The first [`SPELLED_OUT`] of `items`, and how many more.
fn list(items: &[String]) -> String {
    let mut text = items.iter().take(SPELLED_OUT).cloned().collect::<Vec<_>>().join(", ");
    if items.len() > SPELLED_OUT {
        text.push_str(&format!(" and {} more", items.len() - SPELLED_OUT));
    }
    text
}

/// The event of `generation`, published by the service of `stats`.
fn published(stats: &AssignerStats, generation: u64) -> String {
    match stats.history().into_iter().find(|r| r.generation == generation) {
        Some(r) => format!(
            "generation {} published: imbalance {} to {:.2}, key churn {:.2}%",
            r.generation,
            r.imbalance_before.map_or("n/a".to_owned(), |b| format!("{b:.2}")),
            r.imbalance_after,
            r.key_churn * 100.0
        ),
        None => format!("generation {generation} published"),
    }
}

/// Tasks joined, changed state and left `job`'s task set.
fn task_changes(
    job: &str,
    before: &[(u32, TaskState)],
    now: &[(u32, TaskState)],
    events: &mut Vec<(Option<String>, String)>,
) {
    let before_map: BTreeMap<u32, TaskState> = before.iter().copied().collect();
    let now_map: BTreeMap<u32, TaskState> = now.iter().copied().collect();
    let (mut joined, mut changed) = (Vec::new(), Vec::new());
    for (&task, &state) in &now_map {
        match before_map.get(&task) {
            None => joined.push(Item {
                job: Some(job.to_owned()),
                text: format!("task {task} joined ({state:?})"),
                label: task.to_string(),
            }),
            Some(&b) if b != state => changed.push(Item {
                job: Some(job.to_owned()),
                text: format!("task {task}: {b:?} to {state:?}"),
                label: format!("{task} ({b:?} to {state:?})"),
            }),
            Some(_) => {}
        }
    }
    let left = before_map
        .keys()
        .filter(|t| !now_map.contains_key(t))
        .map(|task| Item {
            job: Some(job.to_owned()),
            text: format!("task {task} left the job"),
            label: task.to_string(),
        })
        .collect();
    // A summary of a job's tasks still names the job.
    let mut own = Vec::new();
    fold(&mut own, joined, |n, named| format!("{n} tasks joined: {named}"));
    fold(&mut own, changed, |n, named| format!("{n} tasks changed state: {named}"));
    fold(&mut own, left, |n, named| format!("{n} tasks left the job: {named}"));
    events.extend(own.into_iter().map(|(j, text)| (j.or_else(|| Some(job.to_owned())), text)));
}
