//! The commands on jobs, instances and specs: `jobs`, `instances`, `spec ...`, `drain`,
//! `undrain`, `run`. (`show` and `tasks`, on a job's assignment, are in
//! the sibling module `assignment`.)

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::Path;

use futures_util::{stream, StreamExt, TryStreamExt};
use serde::Serialize;
use serde_json::Value;
use steady_slicer::specs::{JobConfig, RejectedSpec, MAX_SPEC_BYTES};
use steady_slicer::store::AssignmentStore;

use super::output::{cell, json, or_dash, words, Align, Table};
use super::stores::Stores;
use super::{CtlError, Report};

/// How many jobs are read from etcd at once (each a leader key and an assignment).
pub(super) const CONCURRENT_READS: usize = 16;

/// A job as `jobs --json` prints it.
#[derive(Debug, Serialize)]
struct JobRow {
    job: String,
    algorithm: String,
    /// The spec's `tasks`, in the spec document's form (`{"count": 8}`).
    tasks: Value,
    consistency: Value,
    leader: Option<String>,
    generation: Option<u64>,
    drained: Vec<u32>,
    /// The table's TASKS-SOURCE cell.
    #[serde(skip)]
    source: String,
}

/// A stored spec that does not read, as the JSON output lists it.
#[derive(Debug, Serialize)]
struct Refused {
    job: String,
    error: String,
}

fn refused(rejected: &[RejectedSpec]) -> (Vec<Refused>, Vec<String>) {
    let json = rejected.iter().map(|r| Refused { job: r.job.clone(), error: r.error.to_string() }).collect();
    (json, rejected.iter().map(ToString::to_string).collect())
}

/// `tasks` of a spec as a table cell: `count 8`, `registry URL,URL`, `dns NAME`.
pub(super) fn source_words(config: &JobConfig) -> String {
    use steady_slicer::specs::TaskSource;
    match &config.tasks {
        TaskSource::Count(n) => format!("count {n}"),
        TaskSource::Registry { endpoints } => format!("registry {}", cell(&endpoints.join(","))),
        TaskSource::Dns(name) => format!("dns {}", cell(name)),
    }
}

/// A field of the spec's document (`consistency`, `tasks`), as the document writes it.
pub(super) fn document_field(config: &JobConfig, field: &str) -> Value {
    serde_json::to_value(config)
        .ok()
        .and_then(|mut v| v.get_mut(field).map(Value::take))
        .unwrap_or(Value::Null)
}

/// `jobs`: every job with a spec, its leader and generation.
pub(super) async fn jobs(stores: &Stores, as_json: bool) -> Result<Report, CtlError> {
    let (store, fleet) = stores.etcd("jobs")?;
    let listing = stores.specs().list().await?;
    let rows: Vec<JobRow> = stream::iter(listing.specs)
        .map(|config| async move {
            let leader = fleet.leader(&config.job).await?;
            let snapshot = store.read(&config.job).await?;
            Ok::<_, CtlError>(JobRow {
                job: config.job.clone(),
                algorithm: config.algorithm.clone(),
                tasks: document_field(&config, "tasks"),
                consistency: document_field(&config, "consistency"),
                leader,
                generation: snapshot.assignment().map(|a| a.generation()),
                drained: config.drained.iter().copied().collect(),
                source: source_words(&config),
            })
        })
        .buffered(CONCURRENT_READS)
        .try_collect()
        .await?;
    let (rejected, notes) = refused(&listing.rejected);
    if as_json {
        #[derive(Serialize)]
        struct Jobs {
            jobs: Vec<JobRow>,
            rejected: Vec<Refused>,
        }
        return Ok(Report { stdout: json(&Jobs { jobs: rows, rejected }), notes });
    }
    let mut table = Table::new(&[
        ("JOB", Align::Left),
        ("ALGORITHM", Align::Left),
        ("TASKS-SOURCE", Align::Left),
        ("CONSISTENCY", Align::Left),
        ("LEADER", Align::Left),
        ("GENERATION", Align::Right),
        ("DRAINED", Align::Left),
    ]);
    for row in rows {
        table.row([
            cell(&row.job),
            cell(&row.algorithm),
            row.source,
            row.consistency.as_str().unwrap_or("-").to_owned(),
            row.leader.as_deref().map_or_else(|| "-".to_owned(), cell),
            or_dash(row.generation),
            words(row.drained.iter().map(u32::to_string)),
        ]);
    }
    Ok(Report { stdout: table.render(), notes })
}

/// The leader of each job with a spec, by job (jobs with no leader left out).
async fn leaders(stores: &Stores) -> Result<(BTreeMap<String, String>, Vec<String>), CtlError> {
    let (_, fleet) = stores.etcd("instances")?;
    let listing = stores.specs().list().await?;
    let led: Vec<(String, Option<String>)> = stream::iter(listing.specs)
        .map(
            |config| async move { Ok::<_, CtlError>((config.job.clone(), fleet.leader(&config.job).await?)) },
        )
        .buffered(CONCURRENT_READS)
        .try_collect()
        .await?;
    let notes = refused(&listing.rejected).1;
    Ok((led.into_iter().filter_map(|(job, leader)| Some((job, leader?))).collect(), notes))
}

/// `instances`: the live instances, and the jobs each leads.
pub(super) async fn instances(stores: &Stores, as_json: bool) -> Result<Report, CtlError> {
    let (_, fleet) = stores.etcd("instances")?;
    let live = fleet.instances().await?;
    let (leaders, mut notes) = leaders(stores).await?;
    let mut led: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (job, leader) in &leaders {
        led.entry(leader.as_str()).or_default().push(job.as_str());
    }
    let strangers: Vec<&str> = led.keys().copied().filter(|name| !live.contains_key(*name)).collect();
    if !strangers.is_empty() {
        let jobs: usize = strangers.iter().map(|name| led[name].len()).sum();
        notes.push(format!(
            "{jobs} job(s) led by candidates that are not live instances of the fleet: {}",
            words(&strangers)
        ));
    }
    #[derive(Serialize)]
    struct InstanceRow<'a> {
        name: &'a str,
        address: &'a str,
        pages: Option<&'a str>,
        leads: usize,
        jobs: &'a [&'a str],
    }
    let rows: Vec<InstanceRow<'_>> = live
        .iter()
        .map(|(name, instance)| {
            let jobs = led.get(name.as_str()).map_or(&[][..], Vec::as_slice);
            InstanceRow {
                name,
                address: &instance.address,
                pages: instance.pages.as_deref(),
                leads: jobs.len(),
                jobs,
            }
        })
        .collect();
    if as_json {
        #[derive(Serialize)]
        struct Instances<'a> {
            instances: Vec<InstanceRow<'a>>,
        }
        return Ok(Report { stdout: json(&Instances { instances: rows }), notes });
    }
    let mut table = Table::new(&[
        ("NAME", Align::Left),
        ("ADDRESS", Align::Left),
        ("PAGES", Align::Left),
        ("LEADS", Align::Right),
    ]);
    for row in rows {
        table.row([
            cell(row.name),
            cell(row.address),
            row.pages.map_or_else(|| "-".to_owned(), cell),
            row.leads.to_string(),
        ]);
    }
    Ok(Report { stdout: table.render(), notes })
}

/// `spec get JOB`: the document, as stored (in both forms: it is JSON).
pub(super) async fn spec_get(stores: &Stores, job: &str) -> Result<Report, CtlError> {
    Ok(Report::out(stores.spec(job).await?.to_json()))
}

/// `spec put FILE`: read (at most [`MAX_SPEC_BYTES`]), validated, written.
pub(super) async fn spec_put(stores: &Stores, file: &Path, as_json: bool) -> Result<Report, CtlError> {
    let bytes = read_document(file)?;
    let config =
        JobConfig::from_json(&bytes).map_err(|error| CtlError::Document { path: file.to_owned(), error })?;
    // Whether it replaces one, for the message only (a stored spec that does not read is
    // replaced too).
    let existed = !matches!(stores.specs().get(&config.job).await, Ok(None));
    stores.specs().put(&config).await?;
    let what = if existed { "replaced" } else { "created" };
    Ok(done(&config.job, what, as_json))
}

/// The file's bytes, at most one past [`MAX_SPEC_BYTES`] (which the parser refuses as
/// too large, unread): `-` is standard input.
fn read_document(file: &Path) -> Result<Vec<u8>, CtlError> {
    let failed = |error| CtlError::File { path: file.to_owned(), error };
    let limit = MAX_SPEC_BYTES as u64 + 1;
    let mut bytes = Vec::new();
    if file.as_os_str() == "-" {
        std::io::stdin().lock().take(limit).read_to_end(&mut bytes).map_err(failed)?;
    } else {
        std::fs::File::open(file).and_then(|f| f.take(limit).read_to_end(&mut bytes)).map_err(failed)?;
    }
    Ok(bytes)
}

/// `spec delete JOB`.
pub(super) async fn spec_delete(stores: &Stores, job: &str, as_json: bool) -> Result<Report, CtlError> {
    if !stores.specs().delete(job).await? {
        return Err(CtlError::UnknownJob(job.to_owned()));
    }
    Ok(done(job, "removed", as_json))
}

/// `spec list`: the jobs with a spec.
pub(super) async fn spec_list(stores: &Stores, as_json: bool) -> Result<Report, CtlError> {
    let listing = stores.specs().list().await?;
    let (rejected, notes) = refused(&listing.rejected);
    let jobs: Vec<&str> = listing.specs.iter().map(|c| c.job.as_str()).collect();
    if as_json {
        #[derive(Serialize)]
        struct Specs<'a> {
            jobs: Vec<&'a str>,
            rejected: Vec<Refused>,
        }
        return Ok(Report { stdout: json(&Specs { jobs, rejected }), notes });
    }
    let mut table = Table::new(&[("JOB", Align::Left)]);
    for job in jobs {
        table.row([cell(job)]);
    }
    Ok(Report { stdout: table.render(), notes })
}

/// `<job>: spec <what>`, or `{"job": ..., "spec": what}`.
fn done(job: &str, what: &str, as_json: bool) -> Report {
    if as_json {
        Report::out(json(&serde_json::json!({ "job": job, "spec": what })))
    } else {
        Report::out(format!("{}: spec {what}\n", cell(job)))
    }
}

/// `drain` (`drain = true`) or `undrain`: the spec read, its drained set changed, the
/// spec put back (only when it changed). Two edits of one spec at once race: the last
/// write wins.
pub(super) async fn drain(
    stores: &Stores,
    job: &str,
    tasks: &[u32],
    drain: bool,
    as_json: bool,
) -> Result<Report, CtlError> {
    let mut config = stores.spec(job).await?;
    let before: BTreeSet<u32> = config.drained.clone();
    for task in tasks {
        if drain {
            config.drained.insert(*task);
        } else {
            config.drained.remove(task);
        }
    }
    let changed = config.drained != before;
    if changed {
        stores.specs().put(&config).await?;
    }
    let drained: Vec<u32> = config.drained.iter().copied().collect();
    if as_json {
        #[derive(Serialize)]
        struct Drained<'a> {
            job: &'a str,
            drained: Vec<u32>,
            changed: bool,
        }
        return Ok(Report::out(json(&Drained { job, drained, changed })));
    }
    let now = words(drained.iter().map(u32::to_string));
    let unchanged = if changed { "" } else { " (unchanged)" };
    Ok(Report::out(format!("{}: drained: {now}{unchanged}\n", cell(job))))
}

/// `run JOB`: a run requested of the job's leader.
pub(super) async fn run(stores: &Stores, job: &str, as_json: bool) -> Result<Report, CtlError> {
    let (_, fleet) = stores.etcd("run")?;
    stores.spec(job).await?;
    fleet.request_run(job).await?;
    let leader = fleet.leader(job).await?;
    if as_json {
        let out = serde_json::json!({ "job": job, "requested": true, "leader": leader });
        return Ok(Report::out(json(&out)));
    }
    let by = match &leader {
        Some(leader) => format!("its leader {} runs it", cell(leader)),
        None => "no instance leads it now; the next leader runs it when it starts".to_owned(),
    };
    Ok(Report::out(format!("{}: run requested; {by}\n", cell(job))))
}
