"""The documentation holds together: every relative link in README.md, CHANGELOG.md and docs/*.md
reaches a file (and, for a Markdown file, its heading), the README stays short with its two
quick-start commands, and the performance page shows plots that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.servers import REPO

PAGES = [REPO / "README.md", REPO / "CHANGELOG.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
CODE = re.compile(r"`[^`\n]*`")
EXTERNAL = ("http://", "https://", "mailto:")


def prose(text: str) -> str:
    """The text outside code blocks and code spans, where Markdown makes links."""
    return CODE.sub("", FENCE.sub("", text))


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the page's headings: lower case, punctuation dropped, spaces as
    hyphens, a repeated heading numbered."""
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6} (.+)$", FENCE.sub("", page.read_text()), re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def links(page: Path) -> list[str]:
    return [target for target in LINK.findall(prose(page.read_text())) if not target.startswith(EXTERNAL)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no {file.relative_to(REPO) if file.is_relative_to(REPO) else file}")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.relative_to(REPO)}")
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)


def test_the_link_check_sees_links_and_headings(tmp_path):
    """The check above would pass vacuously if it found nothing."""
    assert len(links(REPO / "README.md")) >= 7
    page = tmp_path / "page.md"
    page.write_text("# A title, with `code`\n\n## Two\n\n## Two\n\n[x](other.md) `[y](in-code.md)` [z](#two-1)\n"
                    "```\n[w](in-a-block.md)\n```\n")
    assert anchors(page) == {"a-title-with-code", "two", "two-1"}
    assert links(page) == ["other.md", "#two-1"]


def test_the_readme_is_short_with_its_two_quick_start_commands():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    assert "bash quickstart.sh " in text and ".venv/bin/python -m pytest " in text
    assert re.search(r"^eden-serve interpolate \S+\.mp4 ", text, re.MULTILINE), "the in-process quick start"


def test_the_performance_page_shows_plots_of_the_benchmarks():
    page = REPO / "docs" / "performance.md"
    images = [target for target in links(page) if target.endswith(".png")]
    assert len(images) >= 3
    for image in images:
        assert (page.parent / image).is_file(), image
    assert "benchmarks/plots.py" in page.read_text()
