//! The commands on a job's assignment: `show` (the spec's summary, the leader, every
//! slice) and `tasks` (each task's slices, share of the key space and load).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;
use steady_slice::{Assignment, SliceKey};
use steady_slicer::fleet::EtcdFleet;
use steady_slicer::specs::{JobConfig, TaskSource};
use steady_slicer::store::{AssignmentStore, Snapshot};

use super::commands::{document_field, source_words};
use super::output::{cell, hex, json, load, or_dash, percent, words, Align, Summary, Table};
use super::pages::job_page;
use super::stores::Stores;
use super::{CtlError, Report};

/// The most tasks a `count N` source adds to `tasks` by itself (a stored spec's count is
/// at most what a first assignment can hold, far fewer, unless written around the
/// store): tasks the assignment names, the drained ones and the page's are listed anyway.
const MAX_COUNTED_TASKS: u32 = 1 << 20;

/// One slice as `show --json` prints it: the keys `start` to `end`, both included, in 16
/// hex digits; the replicas; the warming tasks.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SliceRow {
    /// The slice's first key.
    pub start: String,
    /// Its last key (the next slice's start minus one; `ffffffffffffffff` for the last).
    pub end: String,
    /// The tasks that serve it.
    pub replicas: Vec<u32>,
    /// The tasks warming up to take it over.
    pub warming: Vec<u32>,
}

/// Every slice of `assignment`, in key order.
pub fn slice_rows(assignment: &Assignment) -> Vec<SliceRow> {
    let slices = assignment.slices();
    slices
        .iter()
        .enumerate()
        .map(|(i, slice)| {
            let end = slices.get(i + 1).map_or(u64::MAX, |next| next.start.get() - 1);
            SliceRow {
                start: hex(slice.start),
                end: hex(SliceKey(end)),
                replicas: slice.replicas().to_vec(),
                warming: slice.warming().to_vec(),
            }
        })
        .collect()
}

/// The slices as a table: START END REPLICAS, warming tasks marked `*` (and a legend
/// line after the table when any is).
pub fn slice_table(rows: &[SliceRow]) -> String {
    let mut table = Table::new(&[("START", Align::Left), ("END", Align::Left), ("REPLICAS", Align::Left)]);
    let mut warming = false;
    for row in rows {
        let replicas = row.replicas.iter().map(u32::to_string);
        let marked = row.warming.iter().map(|t| format!("{t}*"));
        warming |= !row.warming.is_empty();
        table.row([row.start.clone(), row.end.clone(), words(replicas.chain(marked))]);
    }
    let mut text = table.render();
    if warming {
        text.push_str("* warming: named to take the slice over, not serving it yet\n");
    }
    text
}

/// A note for a stored assignment that does not read.
fn unreadable(snapshot: &Snapshot) -> Option<String> {
    snapshot
        .rejected()
        .map(|why| format!("the stored assignment of job {:?} does not read: {why}", snapshot.job()))
}

/// `show JOB`.
pub(super) async fn show(stores: &Stores, job: &str, as_json: bool) -> Result<Report, CtlError> {
    let (store, fleet) = stores.etcd("show")?;
    let config = stores.spec(job).await?;
    let leader = fleet.leader(job).await?;
    let snapshot = store.read(job).await?;
    let notes: Vec<String> = unreadable(&snapshot).into_iter().collect();
    let generation = snapshot.assignment().map(Assignment::generation);
    let slices = snapshot.assignment().map(slice_rows).unwrap_or_default();
    if as_json {
        #[derive(Serialize)]
        struct Show<'a> {
            job: &'a str,
            spec: &'a JobConfig,
            leader: Option<String>,
            generation: Option<u64>,
            slices: Vec<SliceRow>,
        }
        let show = Show { job, spec: &config, leader, generation, slices };
        return Ok(Report { stdout: json(&show), notes });
    }
    let mut summary = spec_summary(&config);
    summary.line("leader", leader.as_deref().map_or_else(|| "-".to_owned(), cell));
    summary.line("generation", or_dash(generation));
    summary.line("slices", slices.len().to_string());
    let mut text = summary.render();
    text.push('\n');
    text.push_str(&slice_table(&slices));
    Ok(Report { stdout: text, notes })
}

/// The spec's lines of `show`.
fn spec_summary(config: &JobConfig) -> Summary {
    let mut summary = Summary::default();
    summary.line("job", cell(&config.job));
    summary.line("algorithm", cell(&config.algorithm));
    summary.line("tasks", source_words(config));
    summary.line("consistency", document_field(config, "consistency").as_str().unwrap_or("-").to_owned());
    summary.line("cadence", format!("{} ms", config.cadence.as_millis()));
    summary.line("lease", format!("{} s", config.lease_ttl.as_secs()));
    summary.line(
        "handover",
        config.handover.map_or_else(|| "-".to_owned(), |h| format!("{} ms", h.as_millis())),
    );
    let replicas = &config.spec.replicas;
    summary.line("replicas", format!("{} to {}", replicas.min(), replicas.max()));
    summary.line("drained", words(config.drained.iter().map(u32::to_string)));
    summary
}

/// One task as `tasks` prints it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TaskRow {
    /// Its index.
    pub task: u32,
    /// `serving`, or `draining` (drained in the spec, or draining at its source as the
    /// leader's page says).
    pub state: &'static str,
    /// How many slices it serves (as a replica).
    pub slices: u64,
    /// The share of the key space those slices hold, in `[0, 1]`.
    pub key_share: f64,
    /// Its load as the leader's Assigner estimates it (`None`: unknown).
    pub load: Option<f64>,
}

/// Each task of the job: those of a `count N` source, those the assignment names
/// (serving or warming), the drained ones; draining when drained.
pub fn task_rows(config: &JobConfig, assignment: Option<&Assignment>) -> BTreeMap<u32, TaskRow> {
    let mut rows = BTreeMap::new();
    let row = |task| TaskRow { task, state: "serving", slices: 0, key_share: 0.0, load: None };
    if let TaskSource::Count(n) = config.tasks {
        rows.extend((0..n.min(MAX_COUNTED_TASKS)).map(|t| (t, row(t))));
    }
    if let Some(assignment) = assignment {
        for (i, slice) in assignment.slices().iter().enumerate() {
            let share = assignment.range(i).fraction();
            for &task in slice.replicas() {
                let entry = rows.entry(task).or_insert_with(|| row(task));
                entry.slices += 1;
                entry.key_share += share;
            }
            for &task in slice.warming() {
                rows.entry(task).or_insert_with(|| row(task));
            }
        }
    }
    for &task in &config.drained {
        rows.entry(task).or_insert_with(|| row(task)).state = "draining";
    }
    rows
}

/// `tasks JOB`: the assignment's view of each task, with the loads from the leader's page
/// when it can be read (else `-`, and a note saying why).
pub(super) async fn tasks(
    stores: &Stores,
    job: &str,
    as_json: bool,
    timeout: Duration,
) -> Result<Report, CtlError> {
    let (store, fleet) = stores.etcd("tasks")?;
    let config = stores.spec(job).await?;
    let leader = fleet.leader(job).await?;
    let snapshot = store.read(job).await?;
    let mut notes: Vec<String> = unreadable(&snapshot).into_iter().collect();
    let mut rows = task_rows(&config, snapshot.assignment());
    match loads(fleet, leader.as_deref(), job, timeout).await {
        Ok(page) => {
            for (task, (state, load)) in page {
                let entry = rows.entry(task).or_insert_with(|| TaskRow {
                    task,
                    state: "serving",
                    slices: 0,
                    key_share: 0.0,
                    load: None,
                });
                if let Some(state) = state {
                    entry.state = state;
                }
                entry.load = load;
            }
        }
        Err(why) => notes.push(format!("no loads (LOAD shows -): {why}")),
    }
    let generation = snapshot.assignment().map(Assignment::generation);
    if as_json {
        #[derive(Serialize)]
        struct Tasks<'a> {
            job: &'a str,
            generation: Option<u64>,
            leader: Option<String>,
            tasks: Vec<TaskRow>,
        }
        let tasks = Tasks { job, generation, leader, tasks: rows.into_values().collect() };
        return Ok(Report { stdout: json(&tasks), notes });
    }
    let mut table = Table::new(&[
        ("TASK", Align::Right),
        ("STATE", Align::Left),
        ("SLICES", Align::Right),
        ("KEY-SHARE", Align::Right),
        ("LOAD", Align::Right),
    ]);
    for row in rows.into_values() {
        table.row([
            row.task.to_string(),
            row.state.to_owned(),
            row.slices.to_string(),
            percent(row.key_share),
            load(row.load),
        ]);
    }
    Ok(Report { stdout: table.render(), notes })
}

/// Each task's state (draining or not) and load on the page of `job`'s leader, or why
/// they cannot be had (one line).
async fn loads(
    fleet: &EtcdFleet,
    leader: Option<&str>,
    job: &str,
    timeout: Duration,
) -> Result<BTreeMap<u32, (Option<&'static str>, Option<f64>)>, String> {
    let Some(leader) = leader else {
        return Err(format!("job {job:?} has no leader now"));
    };
    let instances = fleet.instances().await.map_err(|e| e.to_string())?;
    let Some(instance) = instances.get(leader) else {
        return Err(format!("its leader {leader:?} is not a live instance of the fleet (no pages known)"));
    };
    let Some(pages) = &instance.pages else {
        return Err(format!("its leader {leader:?} serves no pages"));
    };
    let page = job_page(pages, job, timeout)
        .await
        .map_err(|e| format!("the page of job {job:?} on {leader:?} at {pages}: {e}"))?;
    if page.job != job {
        return Err(format!("{leader:?} at {pages} answered with the page of job {:?}", page.job));
    }
    if page.here != "leading" {
        return Err(format!(
            "{leader:?} says it is {:?} for job {job:?}, not leading (the leader changed?)",
            page.here
        ));
    }
    Ok(page
        .tasks
        .into_iter()
        .map(|t| (t.task, (page_state(t.state.as_deref()), t.load.filter(|l| l.is_finite()))))
        .collect())
}

/// A state the leader's page gives a task that overrides the assignment's view: a task
/// draining, or one the task set no longer has (`gone`, while the assignment still names
/// it).
fn page_state(state: Option<&str>) -> Option<&'static str> {
    match state {
        Some("draining") => Some("draining"),
        Some("gone") => Some("gone"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use steady_slice::Slice;

    use super::*;

    fn assignment() -> Assignment {
        Assignment::new(
            7,
            vec![
                Slice::new(SliceKey(0), [3, 1]),
                Slice::new(SliceKey(1 << 62), [2]).with_warming([7]),
                Slice::new(SliceKey(1 << 63), [1]),
            ],
        )
        .unwrap()
    }

    #[test]
    fn every_slice_with_its_inclusive_end_in_hex() {
        let rows = slice_rows(&assignment());
        assert_eq!(rows.len(), 3);
        assert_eq!((rows[0].start.as_str(), rows[0].end.as_str()), ("0000000000000000", "3fffffffffffffff"));
        assert_eq!((rows[1].start.as_str(), rows[1].end.as_str()), ("4000000000000000", "7fffffffffffffff"));
        assert_eq!((rows[2].start.as_str(), rows[2].end.as_str()), ("8000000000000000", "ffffffffffffffff"));
        assert_eq!((rows[1].replicas.as_slice(), rows[1].warming.as_slice()), (&[2][..], &[7][..]));
        assert_eq!(
            slice_table(&rows),
            "START             END               REPLICAS\n\
             0000000000000000  3fffffffffffffff  3 1\n\
             4000000000000000  7fffffffffffffff  2 7*\n\
             8000000000000000  ffffffffffffffff  1\n\
             * warming: named to take the slice over, not serving it yet\n"
        );
    }

    #[test]
    fn tasks_from_the_source_the_assignment_and_the_drained_set() {
        let mut config = JobConfig::new("users", TaskSource::Count(5));
        config.drained.insert(4);
        config.drained.insert(9);
        let rows = task_rows(&config, Some(&assignment()));
        let got: Vec<(u32, &str, u64, f64)> =
            rows.values().map(|r| (r.task, r.state, r.slices, r.key_share)).collect();
        assert_eq!(
            got,
            [
                (0, "serving", 0, 0.0),
                (1, "serving", 2, 0.75),
                (2, "serving", 1, 0.25),
                (3, "serving", 1, 0.25),
                (4, "draining", 0, 0.0),
                (7, "serving", 0, 0.0),
                (9, "draining", 0, 0.0),
            ]
        );
        let registry = JobConfig::new("users", TaskSource::Dns("users.svc".into()));
        assert!(task_rows(&registry, None).is_empty());
    }
}
