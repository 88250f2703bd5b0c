//! What the HTML pages share: escaping, the clock, the style sheet, links to other
//! instances' pages.

use std::time::SystemTime;

/// The pages' style sheet (inline: the pages load nothing else).
pub(crate) const STYLE: &str = "body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}\
    h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.5em}table{border-collapse:collapse}\
    td,th{padding:2px 8px;text-align:right;border-bottom:1px solid #ddd}th{background:#f4f4f4}\
    td.task,td.constraint,td.name{text-align:left}.bar{fill:#4a7}.draining{color:#b60}.gone{color:#999}\
    svg{display:block;margin:.5em 0}time{color:#666;margin-right:.5em}\
    b.violated{color:#b00}section.violated{border:2px solid #b00;background:#fff3f3;padding:.2em 1em 1em}\
    section.violated h2{color:#b00;margin-top:.5em}p.infeasible{font-weight:bold}\
    tr.leading td.here{color:#272;font-weight:bold}tr.campaigning td.here{color:#b60}";

/// `text` safe inside HTML, in text and in attribute values alike.
pub(crate) fn esc(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

/// `HH:MM:SS` (UTC) of `at`.
pub(crate) fn clock(at: SystemTime) -> String {
    let secs = at.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    format!("{:02}:{:02}:{:02}", secs / 3600 % 24, secs / 60 % 60, secs % 60)
}

/// The base URL of an instance's pages from its fleet record (`host:port`, or a URL),
/// without a trailing `/`; `None` for anything but plain `http`/`https` (a record is
/// written by whoever may write the fleet's keys, and a link must never carry a script:
/// no `javascript:` or `data:` URL, no quote that would end the attribute).
pub(crate) fn pages_base(record: &str) -> Option<String> {
    let base = if record.starts_with("http://") || record.starts_with("https://") {
        record.to_owned()
    } else if record.contains("://") {
        return None;
    } else {
        match record.rsplit_once(':') {
            None => format!("http://{record}"),
            Some((_, port)) if port.parse::<u16>().is_ok() => format!("http://{record}"),
            Some(_) => return None,
        }
    };
    let clean =
        base.bytes().all(|b| b.is_ascii_graphic() && !matches!(b, b'"' | b'\'' | b'<' | b'>' | b'\\' | b'`'));
    clean.then(|| base.trim_end_matches('/').to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_to_other_pages_are_plain_http_urls_or_none() {
        assert_eq!(pages_base("127.0.0.1:9464").as_deref(), Some("http://127.0.0.1:9464"));
        assert_eq!(pages_base("http://a:9464/").as_deref(), Some("http://a:9464"));
        assert_eq!(pages_base("https://pages.example").as_deref(), Some("https://pages.example"));
        assert_eq!(pages_base("[::1]:9464").as_deref(), Some("http://[::1]:9464"));
        for bad in ["javascript:alert(1)", "data:text/html,x", "http://a\"onmouseover=x", "ftp://a", "a b:1"]
        {
            assert_eq!(pages_base(bad), None, "{bad}");
        }
        assert_eq!(esc("<a href=\"x\">'&"), "&lt;a href=&quot;x&quot;&gt;&#39;&amp;");
    }
}
