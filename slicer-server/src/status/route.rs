//! Which page a request path names, and the path of a job's page.
//!
//! A job's name may hold any character (`steady_core::valid_job_name`: 1 to 256 bytes),
//! so it travels percent-encoded: [`job_path`] encodes every byte but ASCII letters,
//! digits, `-`, `_` and `~` (so `.` too: a name `users.json` or `..` cannot be read as
//! the JSON suffix or a dot segment), and [`route`] decodes any percent-encoding. The
//! `.json` suffix is read on the path as sent, before decoding: `/jobs/a.json` is job
//! `a`'s JSON, `/jobs/a%2Ejson` is job `a.json`'s page.

/// What a request path asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Route {
    /// `/`: the instance's overview.
    Overview,
    /// `/metrics`: Prometheus text.
    Metrics,
    /// `/jobs/<job>`: a job's page.
    Job(String),
    /// `/jobs/<job>.json`: a job's tasks as JSON.
    JobJson(String),
    /// Anything else (an undecodable job name included).
    NotFound,
}

/// The route of `path` (the request target's path, as sent).
pub(crate) fn route(path: &str) -> Route {
    match path {
        "/" => return Route::Overview,
        "/metrics" => return Route::Metrics,
        _ => {}
    }
    let Some(rest) = path.strip_prefix("/jobs/") else { return Route::NotFound };
    let (encoded, json) = match rest.strip_suffix(".json") {
        Some(name) => (name, true),
        None => (rest, false),
    };
    match decode(encoded) {
        Some(job) if !job.is_empty() && json => Route::JobJson(job),
        Some(job) if !job.is_empty() => Route::Job(job),
        _ => Route::NotFound,
    }
}

/// The path of `job`'s page (`/jobs/<job, percent-encoded>`); its JSON is this path with
/// `.json` appended.
pub(crate) fn job_path(job: &str) -> String {
    let mut path = String::with_capacity(6 + job.len());
    path.push_str("/jobs/");
    for byte in job.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'~') {
            path.push(char::from(byte));
        } else {
            path.push('%');
            path.push(char::from(HEX[usize::from(byte >> 4)]));
            path.push(char::from(HEX[usize::from(byte & 15)]));
        }
    }
    path
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

/// `encoded` with its `%XX` sequences decoded; `None` for a bad sequence or a name that
/// is not UTF-8.
fn decode(encoded: &str) -> Option<String> {
    let bytes = encoded.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = |b: u8| char::from(b).to_digit(16);
            let high = hex(*bytes.get(i + 1)?)?;
            let low = hex(*bytes.get(i + 2)?)?;
            out.push((high * 16 + low) as u8);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_job_name_round_trips_through_its_path() {
        for job in ["users", "a/b", "users.json", "..", "é ü", "x%41", "a?b#c", "<&>\""] {
            let path = job_path(job);
            assert!(path[6..].bytes().all(|b| b.is_ascii_alphanumeric() || b"-_~%".contains(&b)), "{path}");
            assert_eq!(route(&path), Route::Job(job.to_owned()), "{path}");
            assert_eq!(route(&format!("{path}.json")), Route::JobJson(job.to_owned()), "{path}");
        }
        assert_eq!(job_path("users"), "/jobs/users");
        assert_eq!(job_path("a.json"), "/jobs/a%2Ejson");
    }

    #[test]
    fn paths_route_to_their_pages_and_the_json_suffix_is_read_before_decoding() {
        assert_eq!(route("/"), Route::Overview);
        assert_eq!(route("/metrics"), Route::Metrics);
        assert_eq!(route("/jobs/users"), Route::Job("users".into()));
        assert_eq!(route("/jobs/users.json"), Route::JobJson("users".into()));
        assert_eq!(route("/jobs/a.json.json"), Route::JobJson("a.json".into()));
        assert_eq!(route("/jobs/a%2Ejson"), Route::Job("a.json".into()));
        // Unencoded characters are taken as they are.
        assert_eq!(route("/jobs/a.b"), Route::Job("a.b".into()));
        for bad in
            ["/jobs/", "/jobs/.json", "/jobs/%", "/jobs/%4", "/jobs/%zz", "/jobs/%FF", "/job/users", "/x"]
        {
            assert_eq!(route(bad), Route::NotFound, "{bad}");
        }
    }
}
