#!/usr/bin/env python3
"""Checks that every relative link in the docs resolves.

Markdown files checked: README.md, docs/*.md and each crate's README.md. Every inline link or
image `[text](target)` whose target is not a URL must name a file that exists (relative to the
linking file), and its `#anchor`, if any, must be a heading of that file (GitHub's slugs: lower
case, punctuation dropped, spaces to hyphens, `-1`, `-2`... for repeats). A bare `#anchor`
names a heading of the linking file.

Rust sources are checked too: a plain path `docs/NAME.md` or `docs/NAME.md#anchor` in any
`.rs` file outside target/ must name an existing guide and heading.

Usage: scripts/check-doc-links.py [ROOT]   (default: the repository holding this script).
Prints one line per broken link and exits 1 if there is any.
"""

import os
import re
import sys

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
SKIP_DIRS = {"target", ".git", "node_modules"}

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
RS_DOC_PATH = re.compile(r"\bdocs/([A-Za-z0-9_.-]+\.md)(#[A-Za-z0-9_-]+)?")


def slug(text):
    text = re.sub(r"<[^>]+>", "", text)                      # inline HTML
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)     # links keep their text
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)                     # punctuation, backticks
    return text.replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        seen, found, fenced = {}, set(), False
        with open(path, encoding="utf-8") as f:
            for line in f:
                if FENCE.match(line):
                    fenced = not fenced
                    continue
                m = None if fenced else HEADING.match(line)
                if m:
                    base = slug(m.group(2))
                    n = seen.get(base, 0)
                    seen[base] = n + 1
                    found.add(base if n == 0 else f"{base}-{n}")
        cache[path] = found
    return cache[path]


def markdown_files():
    yield os.path.join(ROOT, "README.md")
    docs = os.path.join(ROOT, "docs")
    for name in sorted(os.listdir(docs)):
        if name.endswith(".md"):
            yield os.path.join(docs, name)
    for name in sorted(os.listdir(ROOT)):
        readme = os.path.join(ROOT, name, "README.md")
        if name not in SKIP_DIRS and os.path.isfile(readme):
            yield readme


def check_target(source, lineno, target, base_dir, errors):
    path, _, anchor = target.partition("#")
    resolved = os.path.normpath(os.path.join(base_dir, path)) if path else source
    rel = os.path.relpath(source, ROOT)
    if not os.path.exists(resolved):
        errors.append(f"{rel}:{lineno}: {target}: no such file")
        return
    if anchor and resolved.endswith(".md") and anchor not in anchors(resolved):
        errors.append(f"{rel}:{lineno}: {target}: no heading #{anchor} in {os.path.relpath(resolved, ROOT)}")


def main():
    errors, links = [], 0
    for md in markdown_files():
        fenced = False
        with open(md, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if FENCE.match(line):
                    fenced = not fenced
                    continue
                if fenced:
                    continue
                for target in LINK.findall(line):
                    if re.match(r"^[a-z][a-z0-9+.-]*:", target):     # http:, https:, mailto:
                        continue
                    links += 1
                    check_target(md, lineno, target, os.path.dirname(md), errors)
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
        for name in filenames:
            if not name.endswith(".rs"):
                continue
            path = os.path.join(dirpath, name)
            with open(path, encoding="utf-8") as f:
                for lineno, line in enumerate(f, 1):
                    for doc, anchor in RS_DOC_PATH.findall(line):
                        links += 1
                        check_target(path, lineno, f"docs/{doc}{anchor}", ROOT, errors)
    for error in errors:
        print(error)
    print(f"{links} links checked, {len(errors)} broken", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
