//! The instance's overview (`/`): its name and store, the live instances, a row per job
//! of the fleet, and the recent events. One HTML document, no script, no external asset.
//!
//! Its size is linear in the jobs (at most `steady_slicer::specs::MAX_JOBS` rows, a few
//! hundred bytes each with names of ordinary length; a job's drained tasks are counted,
//! not listed, past [`DRAINED_LISTED`]) and the live instances (at most
//! `steady_slicer::fleet::MAX_INSTANCES`).

use std::fmt::Write as _;
use std::time::Duration;

use super::events::Event;
use super::html::{clock, esc, STYLE};
use super::route::job_path;
use super::view::Here;

/// How many of a job's drained tasks the overview lists (past it: how many).
pub(crate) const DRAINED_LISTED: usize = 4;

/// What the overview shows, read at request time.
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    pub(crate) instance: String,
    pub(crate) store: String,
    pub(crate) instances: Vec<InstanceRow>,
    pub(crate) jobs: Vec<JobRow>,
    pub(crate) watchers: usize,
    pub(crate) reports_accepted: u64,
    pub(crate) reports_refused: u64,
    /// Every event of the log, oldest first.
    pub(crate) events: Vec<Event>,
    pub(crate) refresh: Duration,
}

/// A live instance.
#[derive(Debug, Clone)]
pub(crate) struct InstanceRow {
    pub(crate) name: String,
    /// Where its gRPC services are.
    pub(crate) address: String,
    /// The base URL of its pages (`super::html::pages_base`), if it has some.
    pub(crate) pages: Option<String>,
}

/// A job's row.
#[derive(Debug, Clone)]
pub(crate) struct JobRow {
    pub(crate) name: String,
    pub(crate) algorithm: String,
    pub(crate) consistency: String,
    pub(crate) owner: Option<String>,
    /// The base URL of the owner's pages, when it is another instance with pages.
    pub(crate) owner_pages: Option<String>,
    pub(crate) here: Here,
    /// The generation in force (the Distributor's); `None` before the first.
    pub(crate) generation: Option<u64>,
    /// Its tasks ([`super::view::task_count`]).
    pub(crate) tasks: Option<usize>,
    /// The first [`DRAINED_LISTED`] drained tasks, and how many there are.
    pub(crate) drained: (Vec<u32>, usize),
    /// Runs, publications and errors of the Assigner here.
    pub(crate) counts: Option<[u64; 3]>,
}

pub(crate) fn render(s: &Snapshot) -> String {
    let leading = s.jobs.iter().filter(|j| j.here == Here::Leading).count();
    let campaigning = s.jobs.iter().filter(|j| j.here == Here::Campaigning).count();
    let mut html = String::with_capacity(4096 + 320 * s.jobs.len());
    let _ = write!(
        html,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"refresh\" content=\"{refresh}\">\
         <title>steady-slicer: {instance}</title><style>{STYLE}</style></head><body>\
         <h1>steady-slicer <span id=\"instance\">{instance}</span></h1>\
         <p class=\"summary\">store <span id=\"store\">{store}</span> · <b id=\"jobs-count\">{jobs}</b> jobs, \
         <b id=\"leading-count\">{leading}</b> led here, {campaigning} campaigning here · \
         {instances} live instances · {watchers} watchers · reports accepted {accepted}, refused {refused}</p>",
        refresh = s.refresh.as_secs().max(1),
        instance = esc(&s.instance),
        store = esc(&s.store),
        jobs = s.jobs.len(),
        instances = s.instances.len(),
        watchers = s.watchers,
        accepted = s.reports_accepted,
        refused = s.reports_refused,
    );
    html.push_str(
        "<h2>Instances</h2><table id=\"instances\"><tr><th>instance</th><th>gRPC</th><th>pages</th></tr>",
    );
    for i in &s.instances {
        let pages = match &i.pages {
            Some(base) => format!("<a href=\"{0}/\">{0}/</a>", esc(base)),
            None => "–".to_owned(),
        };
        let _ = write!(
            html,
            "<tr><td class=\"name\">{name}{this}</td><td>{address}</td><td>{pages}</td></tr>",
            name = esc(&i.name),
            this = if i.name == s.instance { " (this one)" } else { "" },
            address = esc(&i.address),
        );
    }
    html.push_str("</table><h2>Jobs</h2>");
    jobs(&mut html, &s.jobs);
    html.push_str("<h2>Recent events</h2><ol id=\"events\">");
    for e in s.events.iter().rev() {
        let _ = write!(html, "<li><time>{}</time> ", clock(e.at));
        if let Some(job) = &e.job {
            let _ = write!(html, "<a href=\"{}\">{}</a>: ", esc(&job_path(job)), esc(job));
        }
        html.push_str(&esc(&e.text));
        html.push_str("</li>");
    }
    html.push_str("</ol></body></html>");
    html
}

fn jobs(html: &mut String, jobs: &[JobRow]) {
    if jobs.is_empty() {
        html.push_str("<p>No job yet.</p>");
        return;
    }
    html.push_str(
        "<table id=\"jobs\"><tr><th>job</th><th>algorithm</th><th>consistency</th><th>owner</th>\
         <th>here</th><th>generation</th><th>tasks</th><th>drained</th><th>runs</th><th>published</th>\
         <th>errors</th></tr>",
    );
    let dash = || "–".to_owned();
    for j in jobs {
        let path = esc(&job_path(&j.name));
        let owner = match (&j.owner, &j.owner_pages) {
            (Some(owner), Some(base)) => format!("<a href=\"{}{path}\">{}</a>", esc(base), esc(owner)),
            (Some(owner), None) => esc(owner),
            (None, _) => "none alive".to_owned(),
        };
        let (class, here) = match j.here {
            Here::Leading => (" class=\"leading\"", "leading"),
            Here::Campaigning => (" class=\"campaigning\"", "campaigning"),
            Here::None => ("", "–"),
        };
        let drained = match &j.drained {
            (_, 0) => dash(),
            (listed, n) if *n <= DRAINED_LISTED => {
                listed.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
            }
            (_, n) => format!("{n} tasks"),
        };
        let [runs, published, errors] =
            j.counts.map_or([dash(), dash(), dash()], |c| c.map(|n| n.to_string()));
        let _ = write!(
            html,
            "<tr{class}><td class=\"name\"><a href=\"{path}\">{name}</a></td><td>{algorithm}</td>\
             <td>{consistency}</td><td>{owner}</td><td class=\"here\">{here}</td><td>{generation}</td>\
             <td>{tasks}</td><td>{drained}</td><td>{runs}</td><td>{published}</td><td>{errors}</td></tr>",
            name = esc(&j.name),
            algorithm = esc(&j.algorithm),
            consistency = esc(&j.consistency),
            generation = j.generation.map_or_else(dash, |g| g.to_string()),
            tasks = j.tasks.map_or_else(dash, |t| t.to_string()),
        );
    }
    html.push_str("</table>");
}
