# sluice - tests/integration/test_docs_links.py: the manual's links resolve.
#
# README.md is a front page of at most 350 lines; the reference lives in
# docs/*.md. Every relative link and #anchor in those files must name a file
# that exists and, for a Markdown file, a heading it has, slugged as GitHub
# does. Reads files only: no servers.

import os
import re
from glob import glob

import pytest

from conftest import ROOT

FRONT_PAGE_MAX_LINES = 350
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})[ \t]+(.*?)[ \t]*#*[ \t]*$")
# [text](target) and ![alt](target); the target ends at ) or a space (title).
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_ID = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")


def manual_files():
    return [os.path.join(ROOT, "README.md")] + sorted(glob(os.path.join(ROOT, "docs", "*.md")))


def prose_lines(path):
    """(line number, line) outside fenced code blocks."""
    fenced = False
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if FENCE.match(line):
                fenced = not fenced
                continue
            if not fenced:
                yield n, line.rstrip("\n")


def slug(heading):
    """GitHub's anchor for a heading: the rendered text lower-cased, every
    character but letters, digits, spaces, '-' and '_' dropped, each space a '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(path):
    """Every anchor of a Markdown file; repeated headings get -1, -2, ..."""
    seen = {}
    out = set()
    for _, line in prose_lines(path):
        out.update(HTML_ID.findall(line))
        m = HEADING.match(line)
        if not m:
            continue
        s = slug(m.group(2))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else "%s-%d" % (s, n))
    return out


def links(path):
    for n, line in prose_lines(path):
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            yield n, target


def broken_links(path):
    """'FILE:LINE: target: why' for each link that does not resolve."""
    out = []
    for n, target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
            continue  # https:, mailto:: not checked here
        file_part, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
        where = "%s:%d: %s" % (os.path.relpath(path, ROOT), n, target)
        if not os.path.exists(dest):
            out.append(where + ": no such file")
        elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
            out.append(where + ": no such heading")
    return out


def test_slug_follows_github():
    assert slug("Console (dashboard, /api/top, /api/stats)") == "console-dashboard-apitop-apistats"
    assert slug("Admin API: overrides and resets") == "admin-api-overrides-and-resets"
    assert slug("Reload (SIGHUP)") == "reload-sighup"
    assert slug("path_regex") == "path_regex"
    assert slug("Delay instead of 429") == "delay-instead-of-429"
    assert slug("The `key` field") == "the-key-field"


def test_checker_sees_broken_links(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## Two words\n\n## Two words\n\n"
                    "[ok](#two-words) [ok](#two-words-1) [bad](#three-words)\n"
                    "[bad](missing.md) [ok](page.md#title) [bad](page.md#nope)\n"
                    "```\n[skipped](#inside-a-fence)\n```\n")
    assert [b.split(": ", 1)[1] for b in broken_links(str(page))] == [
        "#three-words: no such heading",
        "missing.md: no such file",
        "page.md#nope: no such heading",
    ]


@pytest.mark.parametrize("path", manual_files(), ids=lambda p: os.path.relpath(p, ROOT))
def test_links_resolve(path):
    assert broken_links(path) == []


def test_front_page_is_short():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert len(lines) <= FRONT_PAGE_MAX_LINES
    text = "\n".join(lines)
    assert "make run" in text and "make test" in text


def test_every_page_is_indexed():
    with open(os.path.join(ROOT, "docs", "README.md"), encoding="utf-8") as f:
        index = {os.path.normpath(t.partition("#")[0]) for _, t in links(f.name)}
    pages = {os.path.basename(p) for p in glob(os.path.join(ROOT, "docs", "*.md"))}
    assert pages - {"README.md"} <= index
