//! What steady's command-line tools share: clap's refusals rendered in one line.

use clap::error::{ContextKind, ContextValue};

/// clap's refusal in one line: what is wrong and with which argument, the accepted values
/// or clap's suggestion when it has them, and where to read more (`COMMAND --help`): the
/// form `steady-slicer` and `steady-lab` promise for bad input.
pub fn one_line(error: &clap::Error, command: &str) -> String {
    let strings = |kind| match error.get(kind) {
        Some(ContextValue::String(s)) => vec![s.clone()],
        Some(ContextValue::Strings(v)) => v.clone(),
        _ => Vec::new(),
    };
    let rendered = error.render().to_string();
    let first = rendered.lines().next().unwrap_or_default().trim_start_matches("error: ");
    let mut line = first.to_owned();
    // "the following required arguments were not provided:" lists them on the lines below.
    if first.ends_with(':') {
        line.push_str(&format!(" {}", strings(ContextKind::InvalidArg).join(", ")));
    }
    let valid = strings(ContextKind::ValidValue);
    if !valid.is_empty() {
        line.push_str(&format!("; possible values: {}", valid.join(", ")));
    }
    for (kind, what) in
        [(ContextKind::SuggestedArg, "argument"), (ContextKind::SuggestedSubcommand, "command")]
    {
        if let Some(suggested) = strings(kind).first() {
            line.push_str(&format!("; a similar {what} exists: '{suggested}'"));
        }
    }
    format!("{line} (see '{command} --help')")
}
