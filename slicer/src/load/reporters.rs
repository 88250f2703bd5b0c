//! [`ReporterNames`]: which task a load report's sender may speak for, read from the
//! name its client certificate carries.

use std::fmt;
use std::sync::Arc;

/// `task_of(name, job)`: the task a certificate naming `name` may report for in `job`.
type TaskOf = dyn Fn(&str, &str) -> Option<u32> + Send + Sync;

/// Maps a name in a reporter's client certificate to the task it may report for.
///
/// A [`LoadCollector`](super::LoadCollector) with reporter names
/// ([`LoadCollector::authorize_reporters`](super::LoadCollector::authorize_reporters))
/// accepts a report for task `i` of job `J` only from a peer whose certificate holds a
/// DNS name (subject alternative name) that maps to `i` for `J`. The usual mapping is a
/// pattern ([`ReporterNames::pattern`]); any other is a function
/// ([`ReporterNames::from_fn`]).
#[derive(Clone)]
pub struct ReporterNames {
    task_of: Arc<TaskOf>,
    description: String,
}

impl fmt::Debug for ReporterNames {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ReporterNames").field(&self.description).finish()
    }
}

impl fmt::Display for ReporterNames {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.description)
    }
}

impl ReporterNames {
    /// Names of the form `pattern`, where `{task}` stands for the task's index (decimal,
    /// no leading zero) and `{job}` for the job's name, the rest literal. The whole name
    /// must match, ASCII case aside (DNS names are case-insensitive).
    ///
    /// `"{job}-{task}"` maps `users-3` to task 3 of job `users` (a StatefulSet pod's
    /// name); `"{task}.{job}.backends.example"` maps `3.users.backends.example`.
    ///
    /// # Errors
    ///
    /// A [`PatternError`] when `{task}` is not there exactly once, when it touches
    /// `{job}` or another `{task}` with no literal text between them (the split would be
    /// ambiguous), or when a brace is not part of `{task}` or `{job}`.
    pub fn pattern(pattern: &str) -> Result<Self, PatternError> {
        let parsed = Pattern::parse(pattern)?;
        Ok(Self {
            task_of: Arc::new(move |name, job| parsed.task_of(name, job)),
            description: format!("pattern {pattern:?}"),
        })
    }

    /// Any mapping: `task_of(name, job)` is the task a certificate naming `name` may
    /// report for in `job`, if any. `description` shows in logs and `Debug`.
    pub fn from_fn(
        description: impl Into<String>,
        task_of: impl Fn(&str, &str) -> Option<u32> + Send + Sync + 'static,
    ) -> Self {
        Self { task_of: Arc::new(task_of), description: description.into() }
    }

    /// The task `name` may report for in `job`.
    pub fn task_of(&self, name: &str, job: &str) -> Option<u32> {
        (self.task_of)(name, job)
    }

    /// Whether a peer whose certificate holds `names` may report for `task` of `job`.
    pub fn allows<'a>(&self, names: impl IntoIterator<Item = &'a str>, job: &str, task: u32) -> bool {
        names.into_iter().any(|name| self.task_of(name, job) == Some(task))
    }
}

/// Why a pattern for [`ReporterNames::pattern`] was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatternError {
    pattern: String,
    reason: &'static str,
}

impl fmt::Display for PatternError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "reporter name pattern {:?}: {}", self.pattern, self.reason)
    }
}

impl std::error::Error for PatternError {}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Literal(String),
    Job,
    Task,
}

/// A parsed pattern: pieces in order, `{task}` exactly once.
#[derive(Debug, Clone)]
struct Pattern {
    pieces: Vec<Piece>,
}

impl Pattern {
    fn parse(pattern: &str) -> Result<Self, PatternError> {
        let refuse = |reason| Err(PatternError { pattern: pattern.to_owned(), reason });
        let mut pieces = Vec::new();
        let mut rest = pattern;
        while !rest.is_empty() {
            let (piece, len) = if rest.starts_with("{task}") {
                (Piece::Task, "{task}".len())
            } else if rest.starts_with("{job}") {
                (Piece::Job, "{job}".len())
            } else {
                let end = rest.find(['{', '}']).unwrap_or(rest.len());
                if end == 0 {
                    return refuse("a brace that is not part of {task} or {job}");
                }
                (Piece::Literal(rest[..end].to_ascii_lowercase()), end)
            };
            pieces.push(piece);
            rest = &rest[len..];
        }
        if pieces.iter().filter(|p| **p == Piece::Task).count() != 1 {
            return refuse("it must hold {task} exactly once");
        }
        let placeholders_touch = pieces
            .windows(2)
            .any(|w| !matches!(w[0], Piece::Literal(_)) && !matches!(w[1], Piece::Literal(_)));
        if placeholders_touch {
            return refuse("{task} and {job} must be separated by literal text");
        }
        Ok(Self { pieces })
    }

    /// The task `name` holds for `job`: `{job}` is `job` itself, so only `{task}` is
    /// unknown, between a known prefix and a known suffix.
    fn task_of(&self, name: &str, job: &str) -> Option<u32> {
        let name = name.to_ascii_lowercase();
        let job = job.to_ascii_lowercase();
        let text = |piece: &Piece| match piece {
            Piece::Literal(s) => s.clone(),
            Piece::Job => job.clone(),
            Piece::Task => String::new(),
        };
        let at = self.pieces.iter().position(|p| *p == Piece::Task)?;
        let prefix: String = self.pieces[..at].iter().map(text).collect();
        let suffix: String = self.pieces[at + 1..].iter().map(text).collect();
        let digits = name.strip_prefix(&prefix)?.strip_suffix(&suffix)?;
        let canonical = !digits.is_empty()
            && digits.bytes().all(|b| b.is_ascii_digit())
            && (digits == "0" || !digits.starts_with('0'));
        if !canonical {
            return None;
        }
        digits.parse().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pattern_maps_a_statefulset_name_to_its_task_for_its_job_only() {
        let names = ReporterNames::pattern("{job}-{task}").unwrap();
        assert_eq!(names.task_of("users-3", "users"), Some(3));
        assert_eq!(names.task_of("USERS-12", "users"), Some(12), "DNS names are case-insensitive");
        assert_eq!(names.task_of("users-3", "orders"), None, "another job's name");
        assert_eq!(names.task_of("users-03", "users"), None, "one spelling per index");
        assert_eq!(names.task_of("users-", "users"), None);
        assert_eq!(names.task_of("users-3x", "users"), None);
        assert_eq!(names.task_of("users-99999999999", "users"), None, "past u32");
        assert!(names.allows(["web-1", "users-3"], "users", 3));
        assert!(!names.allows(["users-3"], "users", 4));
    }

    #[test]
    fn a_pattern_can_put_the_task_first_and_the_job_anywhere() {
        let names = ReporterNames::pattern("{task}.{job}.backends.example").unwrap();
        assert_eq!(names.task_of("0.users.backends.example", "users"), Some(0));
        assert_eq!(names.task_of("0.users.backends.example.evil", "users"), None, "the whole name matches");
        assert_eq!(names.task_of("x0.users.backends.example", "users"), None);
    }

    #[test]
    fn an_ambiguous_or_malformed_pattern_is_refused_with_its_reason() {
        for (pattern, reason) in [
            ("users", "it must hold {task} exactly once"),
            ("{task}-{task}", "it must hold {task} exactly once"),
            ("{job}{task}", "{task} and {job} must be separated by literal text"),
            ("{tasks}", "a brace that is not part of {task} or {job}"),
            ("x-{task}}", "a brace that is not part of {task} or {job}"),
        ] {
            let error = ReporterNames::pattern(pattern).unwrap_err();
            assert_eq!(error, PatternError { pattern: pattern.into(), reason }, "{pattern}");
        }
    }

    #[test]
    fn any_mapping_can_be_a_function() {
        let names =
            ReporterNames::from_fn("backend-a is task 0", |name, _| (name == "backend-a").then_some(0));
        assert!(names.allows(["backend-a"], "users", 0));
        assert!(!names.allows(["backend-b"], "users", 0));
        assert_eq!(format!("{names:?}"), "ReporterNames(\"backend-a is task 0\")");
    }
}
