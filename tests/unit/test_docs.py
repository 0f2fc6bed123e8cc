"""The README and docs/: an entry point that stays short, links that lead somewhere, no lab notebook.

How right is told from wrong: every relative link of README.md and docs/*.md (outside code) must
name a file or folder of the checkout, and a link's #anchor a heading of its target, slugged as
GitHub does; the README stays under 300 lines; and the hand-written pages carry no dates, commit
hashes or issue numbers (docs/measured.md cites its runs' dates and commits: it is made from their
JSON). The checks are run on made-up pages too, to show they can fail.
"""

from __future__ import annotations

import glob
import os
import re

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(REPO, "README.md")
PAGES = [README, *sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))]
HAND_WRITTEN = [p for p in PAGES if not p.endswith("measured.md")]
README_MAX_LINES = 300

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
NOTEBOOK = {
    "a date": re.compile(r"\b20\d\d-\d\d-\d\d\b"),
    "a commit hash": re.compile(r"\b(?:commit [0-9a-f]{7,40}|(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40})\b"),
    "an issue number": re.compile(r"\b[Ii]ssues? \d+|#\d+\b"),
}


def prose(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks, inline code removed."""
    out, fenced = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            out.append((n, re.sub(r"`[^`]*`", "", line)))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: str) -> set[str]:
    """The anchors of a page's headings (outside code); a repeated heading gets -1, -2, ..."""
    with open(path) as f:
        text = f.read()
    seen: dict[str, int] = {}
    out, fenced = set(), False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6} (.+)", line)):
            base = slug(m.group(1))
            out.add(f"{base}-{seen[base]}" if base in seen else base)
            seen[base] = seen.get(base, 0) + 1
    return out


def broken_links(path: str, text: str) -> list[str]:
    """The links of a page that name no file, or no heading of their target."""
    found = []
    for n, line in prose(text):
        for target in LINK.findall(line):
            if re.match(r"[a-z]+:", target):
                continue   # http:, https:, mailto:, file:
            name, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), name)) if name else path
            if not os.path.exists(dest):
                found.append(f"{os.path.relpath(path, REPO)}:{n}: {target}: no such file")
            elif anchor and (not dest.endswith(".md") or anchor not in anchors(dest)):
                found.append(f"{os.path.relpath(path, REPO)}:{n}: {target}: no heading #{anchor} in "
                             f"{os.path.relpath(dest, REPO)}")
    return found


@pytest.mark.parametrize("path", PAGES, ids=lambda p: os.path.relpath(p, REPO))
def test_every_link_leads_somewhere(path):
    with open(path) as f:
        bad = broken_links(path, f.read())
    assert not bad, "broken links:\n" + "\n".join(bad)


def test_the_link_check_can_fail(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Top\n\n## Two words\n")
    text = ("[ok](page.md#two-words) [ok](#top) [gone](nowhere.md) [no anchor](page.md#three)\n"
            "```\n[in code](nowhere.md)\n```\n`[in code](nowhere.md)` [web](https://example.com/x)\n")
    bad = broken_links(str(page), text)
    assert len(bad) == 2 and "nowhere.md: no such file" in bad[0] and "no heading #three" in bad[1], bad


def test_slugs_as_github_makes_them():
    assert slug("What the PEP is for: goodput over lossy, high-RTT links") == \
        "what-the-pep-is-for-goodput-over-lossy-high-rtt-links"
    assert slug("Several proxy hosts behind routers: `[routing]`") == "several-proxy-hosts-behind-routers-routing"
    assert slug("The PEP's gain on live traffic") == "the-peps-gain-on-live-traffic"


def test_the_readme_is_an_entry_point():
    with open(README) as f:
        lines = f.read().splitlines()
    assert len(lines) <= README_MAX_LINES, (f"README.md has {len(lines)} lines, more than {README_MAX_LINES}: "
                                            "move the detail to docs/")


@pytest.mark.parametrize("path", HAND_WRITTEN, ids=lambda p: os.path.relpath(p, REPO))
def test_no_lab_notebook(path):
    with open(path) as f:
        text = f.read()
    found = [f"{os.path.relpath(path, REPO)}:{n}: {what}: {m.group(0)!r}"
             for n, line in prose(text) for what, rx in NOTEBOOK.items() if (m := rx.search(line))]
    assert not found, "the docs say what is, not when it was done:\n" + "\n".join(found)


def test_the_notebook_check_can_fail():
    text = ("measured on 2026-11-24 at commit 9287926, see issue 17\nas ecf0708 did\n"
            "`2026-11-24 ecf0708 in code is fine`\n")
    hits = [what for _, line in prose(text) for what, rx in NOTEBOOK.items() if rx.search(line)]
    assert hits == ["a date", "a commit hash", "an issue number", "a commit hash"], hits
