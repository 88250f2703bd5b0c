//! A job's page (`/jobs/<job>`): one self-contained HTML document with inline SVG (no
//! external assets, no script), drawn from a [`Snapshot`] of the job.
//!
//! It stays readable at 100 tasks and 15,000 slices: the key space is drawn as
//! [`KEY_SPACE_COLUMNS`] columns, each coloured by the task that holds most of its keys
//! (never one box per slice), and the tasks are a table with one row each.
//!
//! The placement (the job spec's constraints, `steady_assigner::Placement`) is one word in
//! the summary while the last run meets it (`met`), and a section of its own, marked,
//! while it does not: a row per missed constraint (its name, the slices that miss it and
//! their share of the key space) and, when the task set cannot meet it at all, why
//! (`steady_assigner::Infeasible`'s text).

use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

use steady_assigner::{Assignment, TaskState};
use steady_slicer::assigner_service::{PlacementState, RunRecord};
use steady_slicer::autosharding::AckRejection;

use super::html::{clock, esc, STYLE};
use super::view::{rows, Here, Row};

/// How many columns the key-space strip has, whatever the number of slices.
const KEY_SPACE_COLUMNS: usize = 600;

/// What the page shows, read from the components at request time.
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    pub(crate) job: String,
    /// This instance's name.
    pub(crate) instance: String,
    pub(crate) store: String,
    /// The job's algorithm and consistency mode, from its spec.
    pub(crate) algorithm: String,
    pub(crate) consistency: String,
    pub(crate) here: Here,
    /// The instance the spread names to run the job's Assigner.
    pub(crate) owner: Option<String>,
    /// The owner's page of the job, when the owner is another instance with pages.
    pub(crate) owner_page: Option<String>,
    pub(crate) assignment: Option<Assignment>,
    /// Task states ([`super::view::task_states`]).
    pub(crate) tasks: Vec<(u32, TaskState)>,
    /// Each reporting task's load (requests per second) from its latest fresh report.
    pub(crate) loads: Vec<(u32, f64)>,
    /// The runs of the Assigner here (none when it runs elsewhere).
    pub(crate) history: Vec<RunRecord>,
    /// The placement as the last run here left it; `None` before the first run, and
    /// when the Assigner runs elsewhere.
    pub(crate) placement: Option<PlacementState>,
    pub(crate) watchers: usize,
    pub(crate) reports_accepted: u64,
    pub(crate) reports_refused: u64,
    /// The job's events, oldest first.
    pub(crate) events: Vec<(SystemTime, String)>,
    /// The last assignments A119 clients connected here refused, oldest first.
    pub(crate) refusals: Vec<AckRejection>,
    pub(crate) refresh: Duration,
}

pub(crate) fn render(s: &Snapshot) -> String {
    let rows = rows(&s.tasks, s.assignment.as_ref(), &s.loads);
    let generation = s.assignment.as_ref().map_or(0, Assignment::generation);
    // Over every reporting task (an idle one counts in the mean); none while no report
    // carries load (before the first, or just after a new generation restarts the counts).
    let total: f64 = s.loads.iter().map(|(_, l)| *l).sum();
    let imbalance = (total > 0.0).then(|| {
        let mean = total / s.loads.len() as f64;
        s.loads.iter().map(|(_, l)| *l).fold(0.0, f64::max) / mean
    });
    let mut html = String::with_capacity(64 * 1024);
    let _ = write!(
        html,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"refresh\" content=\"{refresh}\">\
         <title>steady-slicer: {job}</title><style>{STYLE}</style></head><body>\
         <p><a href=\"/\">all jobs</a></p>\
         <h1>steady-slicer <span id=\"job\">{job}</span></h1>\
         <p class=\"summary\">{algorithm}, {consistency} · generation <b id=\"generation\">{generation}</b> · imbalance \
         <b id=\"imbalance\">{imbalance}</b> (busiest task's reported load / mean) · \
         <span id=\"leader\">{leader}</span> · store <span id=\"store\">{store}</span> · \
         placement <b class=\"{placement_class}\" id=\"placement\">{placement}</b> · \
         {watchers} watchers · reports accepted {accepted}, refused {refused}</p>",
        refresh = s.refresh.as_secs().max(1),
        job = esc(&s.job),
        algorithm = esc(&s.algorithm),
        consistency = esc(&s.consistency),
        imbalance = imbalance.map_or("n/a".to_owned(), |i| format!("{i:.2}")),
        leader = leader(s),
        store = esc(&s.store),
        placement = match &s.placement {
            None if s.here == Here::None => "on the Assigner's pages",
            None => "no run yet",
            Some(p) if is_met(p) => "met",
            Some(_) => "VIOLATED (below)",
        },
        placement_class = if s.placement.as_ref().is_some_and(|p| !is_met(p)) { "violated" } else { "met" },
        watchers = s.watchers,
        accepted = s.reports_accepted,
        refused = s.reports_refused,
    );
    if let Some(p) = s.placement.as_ref().filter(|p| !is_met(p)) {
        placement(&mut html, p);
    }
    html.push_str("<h2>The key space</h2>");
    match &s.assignment {
        Some(a) => key_space(&mut html, a),
        None => html.push_str("<p>No assignment yet.</p>"),
    }
    html.push_str("<h2>Tasks</h2>");
    tasks(&mut html, &rows);
    if !s.refusals.is_empty() {
        refusals(&mut html, &s.refusals);
    }
    html.push_str("<h2>The last generations</h2>");
    match s.here {
        Here::None => {
            let _ = write!(
                html,
                "<p id=\"elsewhere\">The Assigner runs on {}: its runs are on its pages.</p>",
                owner(s)
            );
        }
        Here::Leading | Here::Campaigning => history(&mut html, &s.history),
    }
    html.push_str("<h2>Recent events</h2><ol id=\"events\">");
    for (at, event) in s.events.iter().rev() {
        let _ = write!(html, "<li><time>{}</time> {}</li>", clock(*at), esc(event));
    }
    html.push_str("</ol></body></html>");
    html
}

/// The assignments A119 clients refused, newest first: when, which client, which
/// generation, and why as the client said it.
fn refusals(html: &mut String, refusals: &[AckRejection]) {
    html.push_str(
        "<h2>Assignments A119 clients refused</h2><table id=\"refusals\"><tr><th>at</th><th>client</th>\
         <th>generation</th><th>why</th></tr>",
    );
    for r in refusals.iter().rev() {
        let _ = write!(
            html,
            "<tr><td><time>{}</time></td><td>{}</td><td>{}</td><td>{}</td></tr>",
            clock(r.at),
            esc(&r.client),
            r.generation,
            esc(&r.message),
        );
    }
    html.push_str("</table>");
}

/// Who runs the job's Assigner, as the summary says it.
fn leader(s: &Snapshot) -> String {
    match s.here {
        Here::Leading => format!("{} leads", esc(&s.instance)),
        Here::Campaigning => format!("{} campaigns (the spread names {})", esc(&s.instance), owner(s)),
        Here::None => format!("the Assigner runs on {}", owner(s)),
    }
}

/// The owner's name, a link to its page of the job when it has one.
fn owner(s: &Snapshot) -> String {
    match (&s.owner, &s.owner_page) {
        (Some(owner), Some(page)) => format!("<a href=\"{}\">{}</a>", esc(page), esc(owner)),
        (Some(owner), None) => esc(owner),
        (None, _) => "no instance (none known alive)".to_owned(),
    }
}

/// Whether the last run met every constraint it was given (no constraint: met).
fn is_met(p: &PlacementState) -> bool {
    p.violations.is_empty() && p.infeasible.is_none()
}

/// The constraints the last run's assignment misses, and why the task set cannot meet
/// them, if it cannot: a section marked in red, above everything else.
fn placement(html: &mut String, p: &PlacementState) {
    html.push_str(
        "<section id=\"violations\" class=\"violated\" role=\"alert\">\
         <h2>Placement: constraints missed</h2>",
    );
    match &p.infeasible {
        Some(why) => {
            let _ = write!(
                html,
                "<p class=\"infeasible\" id=\"infeasible\">Infeasible: {}.</p>\
                 <p>The Assigner publishes the best assignment the serving tasks allow, and repairs \
                 it when the tasks that would meet the constraint return.</p>",
                esc(&why.to_string())
            );
        }
        None => html.push_str(
            "<p>The serving tasks could meet every constraint: the next runs repair these slices \
             (repairs are not charged to the churn budget).</p>",
        ),
    }
    if p.violations.is_empty() {
        html.push_str("<p>No slice misses a constraint yet.</p></section>");
        return;
    }
    html.push_str(
        "<table id=\"missed\"><tr><th>constraint</th><th>slices</th><th>key space</th>\
         <th>first slice</th></tr>",
    );
    for v in &p.violations {
        let _ = write!(
            html,
            "<tr><td class=\"constraint\">{}</td><td>{}</td><td>{:.1}%</td><td>{}</td></tr>",
            v.constraint.name(),
            v.slices,
            v.key_share * 100.0,
            v.first,
        );
    }
    html.push_str("</table></section>");
}

/// A colour per task, stable across refreshes.
fn colour(task: u32) -> String {
    let hue = (u64::from(task).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) % 360;
    format!("hsl({hue},60%,55%)")
}

/// The key space as [`KEY_SPACE_COLUMNS`] columns, each the colour of the task holding
/// most of its keys; a second row marks columns whose majority slice has replicas.
fn key_space(html: &mut String, a: &Assignment) {
    let width = KEY_SPACE_COLUMNS;
    let _ = write!(
        html,
        "<svg id=\"keyspace\" width=\"{width}\" height=\"46\" viewBox=\"0 0 {width} 46\" role=\"img\">\
         <title>{} slices over the key space</title>",
        a.slices().len()
    );
    let slices = a.slices();
    let mut slice = 0;
    for column in 0..width {
        let start = (column as u128 * (1u128 << 64) / width as u128) as u64;
        let end = ((column as u128 + 1) * (1u128 << 64) / width as u128).min(u128::from(u64::MAX)) as u64;
        // The slice covering the column's middle: the majority holder at this width.
        let middle = start / 2 + end / 2;
        while slice + 1 < slices.len() && slices[slice + 1].start.0 <= middle {
            slice += 1;
        }
        let replicas = slices[slice].replicas();
        let _ = write!(
            html,
            "<rect x=\"{column}\" y=\"0\" width=\"1\" height=\"30\" fill=\"{}\"/>",
            colour(replicas[0])
        );
        if replicas.len() > 1 {
            let _ = write!(html, "<rect x=\"{column}\" y=\"33\" width=\"1\" height=\"6\" fill=\"#333\"/>");
        }
    }
    html.push_str("</svg><p class=\"note\">Each column is 1/");
    let _ = write!(html, "{width} of the key space, in the colour of its first replica's task (see the table); a dark mark below: replicated.</p>");
}

fn tasks(html: &mut String, rows: &std::collections::BTreeMap<u32, Row>) {
    let max_load = rows.values().filter_map(|r| r.load).fold(0.0, f64::max);
    html.push_str(
        "<table id=\"tasks\"><tr><th>task</th><th>state</th><th>slices</th><th>replicated</th>\
         <th>key space</th><th>load (req/s)</th><th></th></tr>",
    );
    for (task, row) in rows {
        let (state, class) = match row.state {
            Some(TaskState::Serving) => ("serving", ""),
            Some(TaskState::Draining) => ("draining", " class=\"draining\""),
            Some(TaskState::Gone) | None => ("gone", " class=\"gone\""),
        };
        let load = row.load.map_or("–".to_owned(), |l| format!("{l:.1}"));
        let bar = row.load.map_or(0.0, |l| if max_load > 0.0 { 120.0 * l / max_load } else { 0.0 });
        let _ = write!(
            html,
            "<tr{class}><td class=\"task\"><svg width=\"10\" height=\"10\" style=\"display:inline\">\
             <rect width=\"10\" height=\"10\" fill=\"{colour}\"/></svg> task {task}</td><td>{state}</td>\
             <td>{slices}</td><td>{shared}</td><td>{share:.1}%</td><td>{load}</td>\
             <td><svg width=\"120\" height=\"10\"><rect class=\"bar\" width=\"{bar:.1}\" height=\"10\"/></svg></td></tr>",
            colour = colour(*task),
            slices = row.slices,
            shared = row.replicas_shared,
            share = row.share * 100.0,
        );
    }
    html.push_str("</table>");
}

/// Imbalance (after each run, and before it) and key churn over the last published runs.
fn history(html: &mut String, runs: &[RunRecord]) {
    if runs.is_empty() {
        html.push_str("<p>No run has published yet.</p>");
        return;
    }
    let (w, h) = (600.0, 100.0);
    let max = runs
        .iter()
        .flat_map(|r| [r.imbalance_after, r.imbalance_before.unwrap_or(0.0)])
        .fold(2.0_f64, f64::max);
    let x = |i: usize| if runs.len() == 1 { w / 2.0 } else { i as f64 * w / (runs.len() - 1) as f64 };
    let line = |values: &dyn Fn(&RunRecord) -> Option<f64>, scale: f64| {
        runs.iter()
            .enumerate()
            .filter_map(|(i, r)| values(r).map(|v| format!("{:.1},{:.1}", x(i), h - h * v / scale)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let _ = write!(
        html,
        "<svg id=\"history\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" role=\"img\">\
         <title>imbalance before and after each run (0 to {max:.1}), and key churn (0 to 100%)</title>\
         <polyline fill=\"none\" stroke=\"#c44\" stroke-width=\"1.5\" points=\"{before}\"/>\
         <polyline fill=\"none\" stroke=\"#272\" stroke-width=\"2\" points=\"{after}\"/>\
         <polyline fill=\"none\" stroke=\"#46c\" stroke-dasharray=\"4 3\" points=\"{churn}\"/></svg>\
         <p class=\"note\">red: imbalance before each run, green: after (0 to {max:.1}); blue dashed: key churn (0 to 100%).</p>",
        before = line(&|r| r.imbalance_before, max),
        after = line(&|r| Some(r.imbalance_after), max),
        churn = line(&|r| Some(r.key_churn), 1.0),
    );
    html.push_str(
        "<table id=\"runs\"><tr><th>generation</th><th>imbalance before</th><th>after</th>\
         <th>key churn</th><th>moves</th><th>run time</th></tr>",
    );
    for r in runs.iter().rev().take(10) {
        let m = &r.moves;
        let _ = write!(
            html,
            "<tr><td>{}</td><td>{}</td><td>{:.2}</td><td>{:.2}%</td><td>{}</td><td>{:.2} ms</td></tr>",
            r.generation,
            r.imbalance_before.map_or("–".to_owned(), |b| format!("{b:.2}")),
            r.imbalance_after,
            r.key_churn * 100.0,
            m.forced + m.moved + m.split + m.merged + m.replicas_added + m.replicas_removed,
            r.elapsed.as_secs_f64() * 1e3,
        );
    }
    html.push_str("</table>");
}

#[cfg(test)]
mod tests {
    use super::*;
    use steady_slice::{Slice, SliceKey};

    fn snapshot(tasks: u32, slices: usize) -> Snapshot {
        let step = u64::MAX / slices as u64;
        let assignment = Assignment::new(
            7,
            (0..slices).map(|i| Slice::new(SliceKey(i as u64 * step), vec![(i as u32) % tasks])).collect(),
        )
        .unwrap();
        Snapshot {
            job: "users <&>".into(),
            instance: "a".into(),
            store: "memory".into(),
            algorithm: "weighted-move".into(),
            consistency: "eventual".into(),
            here: Here::Leading,
            owner: Some("a".into()),
            owner_page: None,
            assignment: Some(assignment),
            tasks: (0..tasks)
                .map(|t| (t, if t == 1 { TaskState::Draining } else { TaskState::Serving }))
                .collect(),
            loads: (0..tasks).map(|t| (t, 10.0 + f64::from(t))).collect(),
            history: Vec::new(),
            placement: Some(PlacementState::default()),
            watchers: 3,
            reports_accepted: 10,
            reports_refused: 1,
            events: vec![(SystemTime::UNIX_EPOCH, "task 1 drains".into())],
            refusals: Vec::new(),
            refresh: Duration::from_secs(2),
        }
    }

    #[test]
    fn the_page_names_every_task_the_generation_and_the_imbalance_and_escapes_names() {
        let page = render(&snapshot(4, 16));
        for t in 0..4 {
            assert!(page.contains(&format!(" task {t}</td>")), "task {t}");
        }
        assert!(page.contains("<b id=\"generation\">7</b>"));
        // Loads 10..13: the busiest 13 over the mean 11.5.
        assert!(page.contains("<b id=\"imbalance\">1.13</b>"), "{page}");
        assert!(page.contains("users &lt;&amp;&gt;") && !page.contains("users <&>"));
        assert!(page.contains("class=\"draining\""));
        assert!(!page.contains("http://") && !page.contains("https://"), "no external assets");
    }

    #[test]
    fn refused_assignments_are_a_section_newest_first_with_the_clients_words_escaped() {
        let mut s = snapshot(4, 16);
        assert!(!render(&s).contains("id=\"refusals\""), "no section while no client refused");
        let refusal = |client: &str, generation, message: &str| AckRejection {
            client: client.into(),
            generation,
            message: message.into(),
            at: SystemTime::UNIX_EPOCH,
        };
        s.refusals =
            vec![refusal("go-1", 6, "unknown endpoint 10.0.0.9:80"), refusal("<py>", 7, "<b>gap</b>")];
        let page = render(&s);
        let section =
            page.split("id=\"refusals\"").nth(1).expect("the section").split("</table>").next().unwrap();
        let (newest, oldest) = (section.find("&lt;py&gt;").unwrap(), section.find("go-1").unwrap());
        assert!(newest < oldest, "newest first: {section}");
        assert!(section.contains("<td>7</td>") && section.contains("&lt;b&gt;gap&lt;/b&gt;"), "{section}");
        assert!(!page.contains("<b>gap</b>") && !page.contains("<py>"), "escaped");
    }

    #[test]
    fn a_missed_placement_is_a_marked_section_with_each_constraint_and_the_reason() {
        use steady_assigner::{Constraint, Infeasible, Violation};
        let mut s = snapshot(4, 16);
        s.placement = Some(PlacementState {
            violations: vec![
                Violation {
                    constraint: Constraint::SpreadZones,
                    slices: 12,
                    key_share: 0.75,
                    first: SliceKey(0),
                },
                Violation {
                    constraint: Constraint::ReplicaPerZone,
                    slices: 16,
                    key_share: 1.0,
                    first: SliceKey(0),
                },
            ],
            infeasible: Some(Infeasible::ZoneWithoutTasks { zone: "c".into() }),
        });
        let page = render(&s);
        assert!(page.contains("<b class=\"violated\" id=\"placement\">VIOLATED (below)</b>"), "{page}");
        assert!(page.contains("<section id=\"violations\" class=\"violated\""));
        assert!(
            page.contains("<td class=\"constraint\">spread-zones</td><td>12</td><td>75.0%</td>"),
            "{page}"
        );
        assert!(page.contains("<td class=\"constraint\">replica-per-zone</td><td>16</td><td>100.0%</td>"));
        assert!(
            page.contains(
                "Infeasible: constraint replica-per-zone cannot be met: zone c has no serving task."
            ),
            "{page}"
        );
        // The section comes before the key space: the first thing below the summary.
        assert!(page.find("id=\"violations\"") < page.find("id=\"keyspace\""));

        // Violations the tasks could repair: the section, without a reason.
        s.placement.as_mut().unwrap().infeasible = None;
        let page = render(&s);
        assert!(page.contains("id=\"violations\"") && !page.contains("Infeasible"), "{page}");
    }

    #[test]
    fn a_met_placement_is_one_word_and_before_any_run_it_says_so() {
        let mut s = snapshot(4, 16);
        let page = render(&s);
        assert!(page.contains("<b class=\"met\" id=\"placement\">met</b>"), "{page}");
        assert!(!page.contains("id=\"violations\"") && !page.contains("VIOLATED"));
        s.placement = None;
        assert!(render(&s).contains("<b class=\"met\" id=\"placement\">no run yet</b>"));
    }

    #[test]
    fn a_job_led_elsewhere_names_its_owner_with_a_link_and_shows_no_runs() {
        let mut s = snapshot(4, 16);
        s.here = Here::None;
        s.owner = Some("b <i>".into());
        s.owner_page = Some("http://10.0.0.2:9464/jobs/users".into());
        s.placement = None;
        let page = render(&s);
        assert!(
            page.contains(
                "<span id=\"leader\">the Assigner runs on <a href=\"http://10.0.0.2:9464/jobs/users\">b &lt;i&gt;</a></span>"
            ),
            "{page}"
        );
        assert!(page.contains("id=\"elsewhere\"") && !page.contains("id=\"history\""), "{page}");
        assert!(page.contains("id=\"placement\">on the Assigner's pages</b>"), "{page}");
        // The key space and the tasks are the assignment's, whoever wrote it.
        assert!(page.contains("id=\"keyspace\"") && page.contains(" task 3</td>"));

        s.here = Here::Campaigning;
        s.owner_page = None;
        assert!(render(&s).contains("a campaigns (the spread names b &lt;i&gt;)"));
    }

    #[test]
    fn fifteen_thousand_slices_draw_a_bounded_page() {
        let page = render(&snapshot(100, 15_000));
        let rects = page.matches("<rect").count();
        // The key-space strip (at most two marks per column) and one swatch and bar per task.
        assert!(rects <= 2 * KEY_SPACE_COLUMNS + 2 * 100, "{rects} rectangles");
        assert!(page.len() < 200_000, "{} bytes", page.len());
    }
}
