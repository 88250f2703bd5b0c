//! [`error_chain`]: an error and its causes on one line.

use std::error::Error;

/// `error` and its sources joined by `": "`, each message once: wrappers often repeat
/// their source's text, and a one-line report (a log field, a binary's exit message, an
/// error's `reason`) should name the root cause (`UnknownIssuer`, `No such file`) without
/// saying it twice.
pub fn error_chain(error: &(dyn Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(error);
    while let Some(e) = next {
        let text = e.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        next = e.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use std::fmt;

    use super::*;

    #[derive(Debug)]
    struct Outer(&'static str, std::io::Error);

    impl fmt::Display for Outer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }

    impl Error for Outer {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(&self.1)
        }
    }

    #[test]
    fn the_chain_names_every_cause_once() {
        let error =
            Outer("transport error", std::io::Error::other("invalid peer certificate: UnknownIssuer"));
        assert_eq!(error_chain(&error), "transport error: invalid peer certificate: UnknownIssuer");
        // A wrapper that repeats its source's text says it once.
        let error =
            Outer("tls: invalid peer certificate: UnknownIssuer", std::io::Error::other("UnknownIssuer"));
        assert_eq!(error_chain(&error), "tls: invalid peer certificate: UnknownIssuer");
        assert_eq!(error_chain(&std::io::Error::other("alone")), "alone");
    }
}
