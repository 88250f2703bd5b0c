//! Every relative link in the docs resolves, and every guide a Rust source names exists.
//!
//! The Markdown checked is the repository's `README.md`, the guides in `docs/` and each
//! top-level directory's `README.md`. Each link or image in it, `[text](target)` or
//! `![alt](target)` (with or without a title, the target bare or in angle brackets), and each
//! reference definition `[label]: target`, must name a file or directory that exists relative
//! to the linking file (or, with a leading `/`, to the repository's root), unless the target is
//! a URL (`https:`, `mailto:`...). A `#anchor` on a Markdown target must be one of that file's
//! headings as GitHub spells it (lower case, punctuation dropped, spaces to hyphens, `-1`, `-2`...
//! for repeats); a bare `#anchor` names a heading of the linking file. Fenced code blocks and
//! code spans hold no links and no headings.
//!
//! Rust sources name guides in plain text, in comments and messages: each path
//! `docs/NAME.md`, or `docs/NAME.md#anchor`, in a `.rs` file must name an existing guide and
//! heading.
//!
//! The parsing is by hand, line by line, and covers what the docs use. Not modelled: setext
//! headings (a title underlined with `===`), indented code blocks, HTML comments and tags'
//! `href`/`src`, HTML entities and emphasis in headings (`_x_` keeps its underscores).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Directories never walked: build output, git's own data, JavaScript dependencies.
const SKIPPED: [&str; 3] = ["target", ".git", "node_modules"];

/// This file. Its fixtures name missing guides on purpose, so the scan of Rust sources
/// passes over it.
const THIS_FILE: &str = "tests/tests/doc_links.rs";

// The repository.

#[test]
fn every_relative_link_and_anchor_in_the_repository_resolves() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let report = Repo::load(root).check();
    assert!(
        report.broken.is_empty(),
        "{} of {} links broken:\n{}",
        report.broken.len(),
        report.markdown_links + report.rust_paths,
        report.broken.join("\n")
    );
    // A walk that found nothing would pass too.
    assert!(report.markdown_links > 0, "no link found in the Markdown");
    assert!(report.rust_paths > 0, "no guide path found in the Rust sources");
}

// Headings and their anchors.

#[test]
fn a_slug_is_the_heading_in_lower_case_without_punctuation_with_hyphens_for_spaces() {
    assert_eq!(slug("The protocol (`steady-proto`)"), "the-protocol-steady-proto");
    assert_eq!(
        slug("Without a control plane: Rudolph's mode (`steady-local`)"),
        "without-a-control-plane-rudolphs-mode-steady-local"
    );
    assert_eq!(
        slug("Rolling restart (one ranking, open loop), 15 s"),
        "rolling-restart-one-ranking-open-loop-15-s"
    );
    assert_eq!(slug("`report` and `figures`: the generated docs"), "report-and-figures-the-generated-docs");
    assert_eq!(slug("Two  spaces, two hyphens"), "two--spaces-two-hyphens");
    assert_eq!(slug("snake_case and kebab-case stay"), "snake_case-and-kebab-case-stay");
    assert_eq!(slug("Ünïcode letters stay"), "ünïcode-letters-stay");
}

#[test]
fn a_slug_keeps_the_text_of_links_and_drops_images_html_and_escapes() {
    assert_eq!(slug("See [the guide](guide.md#usage) first"), "see-the-guide-first");
    assert_eq!(slug("<a name=\"old\"></a>Inline HTML ![logo](logo.svg)"), "inline-html");
    assert_eq!(slug(r"A \[bracket\] and a \`tick"), "a-bracket-and-a-tick");
}

#[test]
fn repeated_headings_get_numbered_suffixes() {
    let markdown = "# Setup\n## Setup\ntext\n### Setup\n## Other\n";
    assert_eq!(anchors(markdown), set(&["setup", "setup-1", "setup-2", "other"]));
}

#[test]
fn headings_are_one_to_six_hashes_then_a_space_with_closing_hashes_dropped() {
    let markdown = "## Closed ##\n   # Indented three\n    # Indented four\n#hashtag\n####### Seven\n# C#\n";
    assert_eq!(anchors(markdown), set(&["closed", "indented-three", "c"]));
}

#[test]
fn lines_in_fenced_code_blocks_are_neither_headings_nor_links() {
    let markdown = "\
# Real
```sh
# Following the backend job: a shell comment
see [x](missing.md)
```
~~~~
```
# still code: a fence of the other kind closed nothing
~~~~
   ```rust
   [y](missing.md)
   ```
[z](present.md)
";
    assert_eq!(anchors(markdown), set(&["real"]));
    assert_eq!(targets(markdown), ["13: present.md"]);
}

// Links.

#[test]
fn links_images_titles_and_angle_brackets_are_read() {
    let line = "See [a](a.md), ![fig](img/f.svg \"Figure 1\"), [b](<b c.md#x> 'title'), \
                [c](c.md (title)) and [d](d_(1).md).";
    assert_eq!(inline_targets(line), ["a.md", "img/f.svg", "b c.md#x", "c.md", "d_(1).md"]);
}

#[test]
fn an_image_inside_a_link_is_read_too() {
    assert_eq!(inline_targets("[![badge](badge.svg)](ci.md)"), ["ci.md", "badge.svg"]);
    assert_eq!(inline_targets("[nested [brackets]](n.md)"), ["n.md"]);
}

#[test]
fn code_spans_escapes_and_lookalikes_are_not_links() {
    assert_eq!(inline_targets("`[x](code.md)` and ``[y](`code`.md)``"), Vec::<String>::new());
    assert_eq!(inline_targets(r"\[x](escaped.md)"), Vec::<String>::new());
    assert_eq!(inline_targets("[a] (spaced.md) [b](two words.md) [c](unclosed.md"), Vec::<String>::new());
    assert_eq!(inline_targets("[note] then [real](real.md)"), ["real.md"]);
    assert_eq!(inline_targets("[`]`](tick.md)"), ["tick.md"]);
}

#[test]
fn reference_definitions_are_links_and_footnotes_are_not() {
    let markdown = "[guide]: guide.md#usage \"The guide\"\n  [other]: <other doc.md>\n[^1]: A footnote.\n";
    assert_eq!(targets(markdown), ["1: guide.md#usage", "2: other doc.md"]);
}

#[test]
fn rust_sources_name_guides_by_plain_path() {
    assert_eq!(
        guide_paths("//! See docs/a.md, docs/b-c.md#the-tie-band (docs/d.md#x.y) and ../docs/e.md."),
        ["docs/a.md", "docs/b-c.md#the-tie-band", "docs/d.md#x", "docs/e.md"]
    );
    assert_eq!(guide_paths("mydocs/a.md docs/.md docs/notes.txt docs/a.md.bak"), ["docs/a.md"]);
}

// Checking a repository.

#[test]
fn a_broken_link_and_a_broken_anchor_are_found() {
    let repo = Repo::from_files(&[
        (
            "README.md",
            "# Intro\n\
             [guide](docs/guide.md#usage) and [gone](docs/gone.md)\n\
             [bad anchor](docs/guide.md#nowhere), [here](#intro), [there](#outro)\n\
             [web](https://example.com/x.md), [mail](mailto:a@example.com), [fig](docs/fig.svg)\n",
        ),
        (
            "docs/guide.md",
            "# Guide\n## Usage\n[back](../README.md#intro), [up](..), [crate](/lib/src/lib.rs)\n",
        ),
        ("docs/fig.svg", "<svg/>"),
        ("lib/src/lib.rs", "//! The rules: docs/guide.md#usage; the old ones: docs/guide.md#rules.\n"),
    ]);
    let report = repo.check();
    assert_eq!(
        report.broken,
        [
            "README.md:2: docs/gone.md: no such file",
            "README.md:3: docs/guide.md#nowhere: no heading #nowhere in docs/guide.md",
            "README.md:3: #outro: no heading #outro in README.md",
            "lib/src/lib.rs:1: docs/guide.md#rules: no heading #rules in docs/guide.md",
        ]
    );
    assert_eq!((report.markdown_links, report.rust_paths), (9, 2), "URLs and mail addresses are not counted");
}

#[test]
fn targets_are_percent_decoded_and_may_not_leave_the_repository() {
    let repo = Repo::from_files(&[
        (
            "README.md",
            "[a](docs/two%20words.md#two-words) [b](../outside.md) [c](docs/two%20words.md?plain=1)\n",
        ),
        ("docs/two words.md", "# Two words\n"),
    ]);
    assert_eq!(repo.check().broken, ["README.md:1: ../outside.md: no such file"]);
}

// Test helpers.

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// The links of a Markdown text as `line: target`.
fn targets(markdown: &str) -> Vec<String> {
    links(markdown).into_iter().map(|link| format!("{}: {}", link.line, link.target)).collect()
}

// The checker.

/// What the check knows of a repository.
struct Repo {
    /// Every file and directory, relative to the root and `/`-separated.
    paths: BTreeSet<String>,
    /// The text of every Markdown and Rust file, by path.
    texts: BTreeMap<String, String>,
}

/// What a check found.
struct Report {
    /// Relative links and definitions read in the Markdown (URLs not counted).
    markdown_links: usize,
    /// `docs/NAME.md` paths read in the Rust sources.
    rust_paths: usize,
    /// One line per broken link: `file:line: target: why`.
    broken: Vec<String>,
}

impl Repo {
    /// Walks the repository at `root`, in sorted order, skipping [`SKIPPED`] directories.
    ///
    /// # Panics
    ///
    /// If a directory cannot be listed or a Markdown or Rust file read as UTF-8.
    fn load(root: &Path) -> Repo {
        let mut repo = Repo { paths: BTreeSet::new(), texts: BTreeMap::new() };
        repo.walk(root, "");
        repo
    }

    fn walk(&mut self, dir: &Path, relative: &str) {
        let listing = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let mut entries: Vec<_> = listing.map(Result::unwrap).collect();
        entries.sort_by_key(|entry| entry.file_name());
        for entry in entries {
            let name = entry.file_name().to_string_lossy().into_owned();
            if SKIPPED.contains(&name.as_str()) {
                continue;
            }
            let path = join(relative, &name);
            if entry.file_type().unwrap().is_dir() {
                self.walk(&entry.path(), &path);
            } else if name.ends_with(".md") || name.ends_with(".rs") {
                let text = std::fs::read_to_string(entry.path()).unwrap_or_else(|e| panic!("{path}: {e}"));
                self.texts.insert(path.clone(), text);
            }
            self.paths.insert(path);
        }
    }

    /// A repository of the given files (and the directories holding them).
    fn from_files(files: &[(&str, &str)]) -> Repo {
        let mut repo = Repo { paths: BTreeSet::new(), texts: BTreeMap::new() };
        for (path, text) in files {
            let mut dir = parent(path);
            while !dir.is_empty() {
                repo.paths.insert(dir.to_owned());
                dir = parent(dir);
            }
            repo.paths.insert(path.to_string());
            if path.ends_with(".md") || path.ends_with(".rs") {
                repo.texts.insert(path.to_string(), text.to_string());
            }
        }
        repo
    }

    /// The Markdown checked: `README.md`, `docs/*.md`, then each top-level directory's
    /// `README.md`.
    fn guides(&self) -> Vec<&str> {
        let markdown = || self.texts.keys().map(String::as_str).filter(|p| p.ends_with(".md"));
        let docs = markdown().filter(|p| p.strip_prefix("docs/").is_some_and(|name| !name.contains('/')));
        let readmes = markdown()
            .filter(|p| p.strip_suffix("/README.md").is_some_and(|dir| !dir.contains('/') && dir != "docs"));
        markdown().filter(|p| *p == "README.md").chain(docs).chain(readmes).collect()
    }

    fn check(&self) -> Report {
        let anchors: BTreeMap<&str, BTreeSet<String>> = self
            .texts
            .iter()
            .filter(|(path, _)| path.ends_with(".md"))
            .map(|(path, text)| (path.as_str(), anchors(text)))
            .collect();
        let mut report = Report { markdown_links: 0, rust_paths: 0, broken: Vec::new() };
        for guide in self.guides() {
            for link in links(&self.texts[guide]) {
                if is_url(&link.target) {
                    continue;
                }
                report.markdown_links += 1;
                if let Err(why) = self.resolve(guide, parent(guide), &link.target, &anchors) {
                    report.broken.push(format!("{guide}:{}: {}: {why}", link.line, link.target));
                }
            }
        }
        for (path, text) in &self.texts {
            if !path.ends_with(".rs") || path == THIS_FILE {
                continue;
            }
            for (number, line) in text.lines().enumerate() {
                for target in guide_paths(line) {
                    report.rust_paths += 1;
                    if let Err(why) = self.resolve(path, "", &target, &anchors) {
                        report.broken.push(format!("{path}:{}: {target}: {why}", number + 1));
                    }
                }
            }
        }
        report
    }

    /// Whether `target`, written in `source` and relative to `dir`, names an existing path
    /// and, on a Markdown file, an existing heading; if not, why.
    fn resolve(
        &self,
        source: &str,
        dir: &str,
        target: &str,
        anchors: &BTreeMap<&str, BTreeSet<String>>,
    ) -> Result<(), String> {
        let (path, anchor) = target.split_once('#').unwrap_or((target, ""));
        let path = percent_decode(path.split_once('?').map_or(path, |(path, _query)| path));
        let anchor = percent_decode(anchor);
        let resolved = if path.is_empty() {
            Some(source.to_owned())
        } else if let Some(from_root) = path.strip_prefix('/') {
            normalize("", from_root)
        } else {
            normalize(dir, &path)
        };
        let Some(resolved) = resolved.filter(|p| p.is_empty() || self.paths.contains(p)) else {
            return Err("no such file".to_owned());
        };
        let heading_found = || anchors.get(resolved.as_str()).is_some_and(|found| found.contains(&anchor));
        if !anchor.is_empty() && resolved.ends_with(".md") && !heading_found() {
            return Err(format!("no heading #{anchor} in {resolved}"));
        }
        Ok(())
    }
}

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_owned()
    } else {
        format!("{dir}/{name}")
    }
}

/// The directory holding `path` (`""` for the root).
fn parent(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(dir, _)| dir)
}

/// `path` taken from `dir`, with `.` and `..` resolved; `None` if it leaves the root.
fn normalize(dir: &str, path: &str) -> Option<String> {
    let mut parts: Vec<&str> = dir.split('/').filter(|p| !p.is_empty()).collect();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            part => parts.push(part),
        }
    }
    Some(parts.join("/"))
}

/// `%XX` escapes replaced by their bytes.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
            .map(|h| h.iter().fold(0, |byte, &d| byte * 16 + (d as char).to_digit(16).unwrap() as u8));
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether a target is a URL (`https:`, `mailto:`, any scheme, or `//host`), not a path.
fn is_url(target: &str) -> bool {
    let scheme = target.split_once(':').map_or("", |(scheme, _)| scheme);
    let mut chars = scheme.chars();
    let is_scheme = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c));
    is_scheme || target.starts_with("//")
}

// Markdown.

/// A link target read in Markdown, on its line (from 1), unescaped.
struct Link {
    line: usize,
    target: String,
}

/// The lines outside fenced code blocks, numbered from 1; the fences themselves left out.
///
/// A fence is three or more backticks or tildes (a backtick fence's info string holds no
/// backtick); it closes on a line of at least as many of the same character and nothing
/// else. An unclosed fence runs to the end of the text.
fn prose_lines(markdown: &str) -> Vec<(usize, &str)> {
    let mut open: Option<(u8, usize)> = None;
    let mut prose = Vec::new();
    for (number, line) in markdown.lines().enumerate() {
        let trimmed = line.trim_start();
        let run = |c: u8| trimmed.bytes().take_while(|&b| b == c).count();
        match open {
            Some((c, length)) => {
                let n = run(c);
                if n >= length && trimmed[n..].trim().is_empty() {
                    open = None;
                }
            }
            None => {
                open = [b'`', b'~']
                    .into_iter()
                    .map(|c| (c, run(c)))
                    .find(|&(c, n)| n >= 3 && !(c == b'`' && trimmed[n..].contains('`')));
                if open.is_none() {
                    prose.push((number + 1, line));
                }
            }
        }
    }
    prose
}

/// The links of a Markdown text: inline links and images, and reference definitions.
fn links(markdown: &str) -> Vec<Link> {
    let mut links = Vec::new();
    for (line, text) in prose_lines(markdown) {
        let targets = match reference_definition(text) {
            Some(target) => vec![target],
            None => inline_targets(text),
        };
        links.extend(targets.into_iter().map(|target| Link { line, target }));
    }
    links
}

/// The anchors of a Markdown text's headings, as GitHub spells them: the slug, then `-1`,
/// `-2`... for the second and later headings with the same slug.
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut anchors = BTreeSet::new();
    for (_, line) in prose_lines(markdown) {
        if let Some(text) = heading(line) {
            let base = slug(text);
            let count = seen.entry(base.clone()).or_insert(0);
            anchors.insert(if *count == 0 { base } else { format!("{base}-{count}") });
            *count += 1;
        }
    }
    anchors
}

/// The text of an ATX heading (up to three spaces, one to six `#`, then a space or the end),
/// without its closing `#`s; `None` if the line is not one.
fn heading(line: &str) -> Option<&str> {
    let rest = line.trim_start_matches(' ');
    if line.len() - rest.len() > 3 {
        return None;
    }
    let level = rest.bytes().take_while(|&b| b == b'#').count();
    let rest = &rest[level..];
    if !(1..=6).contains(&level) || !(rest.is_empty() || rest.starts_with([' ', '\t'])) {
        return None;
    }
    let text = rest.trim();
    let unclosed = text.trim_end_matches('#');
    Some(if unclosed.is_empty() || unclosed.ends_with([' ', '\t']) { unclosed.trim_end() } else { text })
}

/// GitHub's anchor for a heading: its text as rendered, in lower case, with everything but
/// letters, digits, `_`, `-` and spaces dropped, and spaces turned to hyphens.
fn slug(heading: &str) -> String {
    plain_text(heading)
        .trim()
        .to_lowercase()
        .chars()
        .filter(|&c| c.is_alphanumeric() || c == '_' || c == '-' || c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Inline Markdown as rendered text: code spans keep their content, links their text;
/// images and HTML tags leave nothing; backslash escapes leave the character.
fn plain_text(inline: &str) -> String {
    let bytes = inline.as_bytes();
    let mut out = String::new();
    let mut i = 0;
    while i < bytes.len() {
        if let Some(c) = escaped(bytes, i) {
            out.push(c);
            i += 2;
        } else if bytes[i] == b'`' {
            let (content, end) = code_span(inline, i);
            out.push_str(content.unwrap_or(&inline[i..end]));
            i = end;
        } else if let Some(end) = html_tag(inline, i) {
            i = end;
        } else if let Some(link) = image(inline, i) {
            i = link.end;
        } else if let Some(link) = inline_link(inline, i) {
            out.push_str(&plain_text(link.text));
            i = link.end;
        } else {
            let c = inline[i..].chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// The targets of the inline links and images on one line, each link's before those in
/// its text (an image inside a link). Code spans and escaped brackets hold none.
fn inline_targets(line: &str) -> Vec<String> {
    let bytes = line.as_bytes();
    let mut targets = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if escaped(bytes, i).is_some() {
            i += 2;
        } else if bytes[i] == b'`' {
            i = code_span(line, i).1;
        } else if let Some(link) = inline_link(line, i) {
            targets.push(link.target);
            targets.extend(inline_targets(link.text));
            i = link.end;
        } else {
            i += 1;
        }
    }
    targets
}

/// An inline link read from text: its text, target, and the index just past it.
struct InlineLink<'a> {
    text: &'a str,
    target: String,
    end: usize,
}

/// The link `[text](target "title")` opening at `open`, if there is one.
fn inline_link(text: &str, open: usize) -> Option<InlineLink<'_>> {
    let close = closing_bracket(text, open)?;
    if text.as_bytes().get(close + 1) != Some(&b'(') {
        return None;
    }
    let (target, after) = destination(text, close + 2)?;
    let end = skip_spaces(text, title(text, after)?);
    (text.as_bytes().get(end) == Some(&b')')).then(|| InlineLink {
        text: &text[open + 1..close],
        target,
        end: end + 1,
    })
}

/// The image `![alt](target)` opening at `bang`, if there is one.
fn image(text: &str, bang: usize) -> Option<InlineLink<'_>> {
    if text.as_bytes()[bang] == b'!' {
        inline_link(text, bang + 1)
    } else {
        None
    }
}

/// The target of a reference definition, `[label]: target "title"` alone on its line (up
/// to three spaces in); footnotes (`[^1]: ...`) are not definitions.
fn reference_definition(line: &str) -> Option<String> {
    let rest = line.trim_start_matches(' ');
    if line.len() - rest.len() > 3 || !rest.starts_with('[') || rest.starts_with("[^") {
        return None;
    }
    let close = closing_bracket(rest, 0)?;
    if close == 1 || rest.as_bytes().get(close + 1) != Some(&b':') {
        return None;
    }
    let (target, after) = destination(rest, close + 2)?;
    let angled = rest[close + 2..].trim_start().starts_with('<');
    let end = title(rest, after)?;
    ((!target.is_empty() || angled) && rest[end..].trim().is_empty()).then_some(target)
}

/// The index of the `]` closing the `[` at `open`, brackets nested; escaped brackets and
/// code spans do not count.
fn closing_bracket(text: &str, open: usize) -> Option<usize> {
    let bytes = text.as_bytes();
    if bytes.get(open) != Some(&b'[') {
        return None;
    }
    let mut depth = 0;
    let mut i = open;
    while i < bytes.len() {
        match bytes[i] {
            _ if escaped(bytes, i).is_some() => i += 1,
            b'`' => i = code_span(text, i).1 - 1,
            b'[' => depth += 1,
            b']' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// A link destination starting at `start` (after spaces): `<anything but angle brackets>`,
/// or a run without spaces or control characters whose parentheses balance. Returns it
/// unescaped and the index just past it.
fn destination(text: &str, start: usize) -> Option<(String, usize)> {
    let bytes = text.as_bytes();
    let mut i = skip_spaces(text, start);
    let mut target = String::new();
    if bytes.get(i) == Some(&b'<') {
        i += 1;
        loop {
            match *bytes.get(i)? {
                b'>' => return Some((target, i + 1)),
                b'<' => return None,
                _ => i = push_char(text, i, &mut target),
            }
        }
    }
    let mut depth = 0usize;
    while let Some(&b) = bytes.get(i) {
        match b {
            b' ' => break,
            b if b.is_ascii_control() => break,
            b'(' => depth += 1,
            b')' if depth == 0 => break,
            b')' => depth -= 1,
            _ => {}
        }
        i = push_char(text, i, &mut target);
    }
    (depth == 0).then_some((target, i))
}

/// Past an optional title (`"..."`, `'...'` or `(...)`, after at least one space) from
/// `start`, just past the destination; `None` if a title opens and never closes.
fn title(text: &str, start: usize) -> Option<usize> {
    let bytes = text.as_bytes();
    let i = skip_spaces(text, start);
    let close = match bytes.get(i) {
        Some(b'"') if i > start => b'"',
        Some(b'\'') if i > start => b'\'',
        Some(b'(') if i > start => b')',
        _ => return Some(start),
    };
    let mut j = i + 1;
    loop {
        match *bytes.get(j)? {
            _ if escaped(bytes, j).is_some() => j += 2,
            b if b == close => return Some(j + 1),
            b'(' if close == b')' => return None,
            _ => j += 1,
        }
    }
}

/// Appends the character at `i` (unescaped, if a backslash escapes it) and returns the
/// index past it.
fn push_char(text: &str, i: usize, out: &mut String) -> usize {
    if let Some(c) = escaped(text.as_bytes(), i) {
        out.push(c);
        return i + 2;
    }
    let c = text[i..].chars().next().unwrap();
    out.push(c);
    i + c.len_utf8()
}

/// The punctuation character a backslash at `i` escapes, if it does.
fn escaped(bytes: &[u8], i: usize) -> Option<char> {
    let next = *bytes.get(i + 1)?;
    (bytes[i] == b'\\' && next.is_ascii_punctuation()).then_some(next as char)
}

/// The code span opening with the backticks at `open`: its content (`None` if no run of as
/// many backticks closes it) and the index past it (past the opening run if unclosed).
fn code_span(text: &str, open: usize) -> (Option<&str>, usize) {
    let bytes = text.as_bytes();
    let run = |at: usize| bytes[at..].iter().take_while(|&&b| b == b'`').count();
    let length = run(open);
    let mut i = open + length;
    while i < bytes.len() {
        if bytes[i] == b'`' {
            let n = run(i);
            if n == length {
                let content = &text[open + length..i];
                let stripped = content.strip_prefix(' ').and_then(|c| c.strip_suffix(' '));
                let content = stripped.filter(|c| !c.trim().is_empty()).unwrap_or(content);
                return (Some(content), i + n);
            }
            i += n;
        } else {
            i += 1;
        }
    }
    (None, open + length)
}

/// The index past an HTML tag (`<name ...>`, `</name>`, `<!...>`) opening at `open`.
fn html_tag(text: &str, open: usize) -> Option<usize> {
    let bytes = text.as_bytes();
    let starts_tag = bytes[open] == b'<'
        && bytes.get(open + 1).is_some_and(|&b| b.is_ascii_alphabetic() || b == b'/' || b == b'!');
    if !starts_tag {
        return None;
    }
    text[open..].find('>').map(|at| open + at + 1)
}

fn skip_spaces(text: &str, start: usize) -> usize {
    start + text[start..].bytes().take_while(|&b| b == b' ' || b == b'\t').count()
}

// Rust sources.

/// The guide paths named on a line of Rust: `docs/NAME.md`, with `#anchor` if one follows
/// (letters, digits, `_` and `-`), where `docs/` does not continue a word.
fn guide_paths(line: &str) -> Vec<String> {
    let is_word = |c: char| c.is_alphanumeric() || c == '_';
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(at) = line[from..].find("docs/").map(|i| from + i) {
        from = at + "docs/".len();
        if line[..at].chars().next_back().is_some_and(is_word) {
            continue;
        }
        let rest = &line[from..];
        let run = rest.bytes().take_while(|&b| b.is_ascii_alphanumeric() || b"_.-".contains(&b)).count();
        let Some(name_end) = (4..=run).rev().find(|&n| rest[..n].ends_with(".md")) else {
            continue;
        };
        let anchor = rest[name_end..].strip_prefix('#').map_or("", |a| {
            &a[..a.bytes().take_while(|&b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-').count()]
        });
        let name = &rest[..name_end];
        found.push(if anchor.is_empty() { format!("docs/{name}") } else { format!("docs/{name}#{anchor}") });
        from += name_end;
    }
    found
}
