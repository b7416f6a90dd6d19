"""The documentation holds together: every relative link in README.md, CHANGELOG.md and docs/*.md
reaches a file (and, for a Markdown file, its heading), the README stays short with its two
quick-start commands, and the performance page shows plots that exist."""

from __future__ import annotations

import argparse
import importlib
import logging
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


# The pages a user reads for how things are now (the CHANGELOG is history, and names what was).
CURRENT = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
COMMAND = re.compile(r"(?:eden-serve|eden_serve\.commands\.cli) ([a-z][a-z-]+)([^`#]*)")
OPTION = re.compile(r"(?<![\w-])--(?:\[no-\])?([a-zA-Z][a-z0-9-]*)")


def options_by_command() -> dict[str, set[str]]:
    from eden_serve.commands.cli import _build_parser

    (commands,) = [action for action in _build_parser()._actions if isinstance(action, argparse._SubParsersAction)]
    return {name: {o for action in parser._actions for o in action.option_strings} for name, parser in commands.choices.items()}


def command_lines(page: Path):
    """(line number, subcommand, the rest of its command line) of every ``eden-serve SUBCOMMAND ...``
    on the page, a fenced command continued with a backslash joined to its next line, and the rest
    cut at a comment, the end of a code span, or a pipe into another program (``| ffmpeg``)."""
    for number, line in enumerate(page.read_text().replace("\\\n", " ").splitlines(), 1):
        for match in COMMAND.finditer(line):
            yield number, match.group(1), re.split(r"\s\|\s+[a-z]", match.group(2))[0]


def test_every_option_a_command_line_names_is_that_commands():
    known = options_by_command()
    wrong = []
    for page in CURRENT:
        for number, command, rest in command_lines(page):
            if command not in known:
                continue  # prose: "eden-serve refuses ..."
            for name in OPTION.findall(rest):
                if f"--{name}" not in known[command] and f"--{name.removeprefix('no-')}" not in known[command]:
                    wrong.append(f"{page.relative_to(REPO)}:~{number}: eden-serve {command} has no --{name}")
    assert not wrong, "\n".join(wrong)


def test_the_option_check_sees_command_lines(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("```bash\neden-serve interpolate a.png b.png -o m.png \\\n    --seed 3   # --not-this\n"
                    "ffmpeg -i x | eden-serve interpolate - -o - --fps 60 | ffmpeg -i - --other\n```\n"
                    "`eden-serve client CLIP | --cloud URL --[no-]ramp`, and eden-serve refuses.\n")
    lines = [(command, OPTION.findall(rest)) for _, command, rest in command_lines(page)]
    assert lines == [("interpolate", ["seed"]), ("interpolate", ["fps"]), ("client", ["cloud", "ramp"]), ("refuses", [])]
    assert "--resume" in options_by_command()["client"]


# Files of the repository named as paths (a placeholder such as NAME.py aside), and modules,
# classes and functions named by their dotted Python names.
PATH = re.compile(r"(?<![\w./-])((?:eden_serve|tests|benchmarks|harness|deploy|examples)/[\w./-]*\w)")
# Inside the package, named from its folders in code spans: `media/timing.py`, `serving/overlap._attempt`.
PACKAGE_PATH = re.compile(r"(?<![\w./:-])((?:%s)/[\w./-]*\w)" % "|".join(
    sorted(folder.name for folder in (REPO / "eden_serve").iterdir() if (folder / "__init__.py").is_file())))
DOTTED = re.compile(r"(?<![\w./-])((?:eden_serve|harness)(?:\.\w+)+)")


def resolves(path: str) -> bool:
    """A file or folder, one that setup makes (ignored by git), or ``module.attribute``
    (``harness/videos.make_clip``)."""
    made = (REPO / ".gitignore").read_text().split()
    if (REPO / path).exists() or path in made or f"{path}/" in made or re.search(r"(?<![A-Za-z])[A-Z]{2,}(?![a-z])", path):
        return True
    folder, _, dotted = path.rpartition("/")
    module, *attributes = dotted.split(".")
    source = REPO / folder / f"{module}.py"
    return bool(attributes) and source.is_file() and all(
        re.search(rf"^\s*(def|class) {name}\b|^{name} =", source.read_text(), re.MULTILINE) for name in attributes)


def imports(dotted: str) -> bool:
    """A module, an attribute of one, or a logger the package makes (``eden_serve.timeline``)."""
    import eden_serve.commands.cli  # noqa: F401  (makes the package's loggers)

    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:end]))
        except ImportError:
            continue
        for name in parts[end:]:
            if not hasattr(found, name):
                return dotted in logging.root.manager.loggerDict
            found = getattr(found, name)
        return True
    return False


def test_every_file_and_module_named_exists():
    missing = []
    for page in CURRENT:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            missing += [f"{page.relative_to(REPO)}:{number}: {path}" for path in PATH.findall(line) if not resolves(path)]
            missing += [f"{page.relative_to(REPO)}:{number}: {name}" for name in DOTTED.findall(line) if not imports(name)]
            missing += [f"{page.relative_to(REPO)}:{number}: {path}" for span in CODE.findall(line)
                        for path in PACKAGE_PATH.findall(span) if not resolves(f"eden_serve/{path}")]
    assert not missing, "\n".join(missing)


def test_the_name_check_sees_names():
    assert not resolves("eden_serve/serving/netns.py") and resolves("harness/netns.py")
    assert resolves("harness/videos.make_clip") and not resolves("harness/videos.no_such_function")
    assert resolves("eden_serve/media/containers.Labels.from_fields") and not resolves("eden_serve/media/video.Labels")
    assert PACKAGE_PATH.findall("`media/timing.py`, `cloud:clips/a.mp4`") == ["media/timing.py"]
    assert resolves("eden_serve/wire/NAME.py") and resolves("tests/test_wire_NAME.py")
    assert imports("eden_serve.wire.keyed") and imports("harness.certificates.Authority")
    assert not imports("eden_serve.serving.certificates.Authority") and imports("eden_serve.timeline")


# A section pointed at by its name, from the code, the configuration and the pages:
# (docs/serving.md, "GPUs and threads"), docs/gpu.md "Compiled in the background".
SECTION = re.compile(r"(?:docs/)?([\w-]+\.md)[,:]?\s*\(?\"([^\"\n]{3,80})\"")
POINTING = ("eden_serve", "harness", "benchmarks", "tests", "deploy", "docs")


def sections(page: Path) -> list[str]:
    """What a pointer may name: a heading's start, or a paragraph's bold lead (``**Reproducible.**``)."""
    text = FENCE.sub("", page.read_text())
    return [re.sub(r"[`*]", "", heading).strip().lower() for heading in re.findall(r"^#{1,6} (.+)$", text, re.MULTILINE)] + [
        lead.lower() for lead in re.findall(r"\*\*([^*\n]+)\*\*", text)]


def pointers(text: str) -> list[tuple[str, str]]:
    return SECTION.findall(text)


def test_every_section_pointed_at_by_name_exists():
    pages = {page.name: page for page in CURRENT}
    files = [file for folder in POINTING for file in (REPO / folder).rglob("*")
             if file.suffix in (".py", ".md", ".yaml", ".sh", ".js") and file.name != "test_docs.py"]
    wrong = []
    for file in [*files, REPO / "README.md", REPO / "Dockerfile", REPO / "config.properties", REPO / "archive.sh"]:
        for page, name in pointers(file.read_text(errors="replace")):
            if page in pages and not any(section.startswith(name.lower()) for section in sections(pages[page])):
                wrong.append(f"{file.relative_to(REPO)}: {page} has no section \"{name}\"")
    assert not wrong, "\n".join(sorted(set(wrong)))


def test_the_section_check_sees_pointers(tmp_path):
    assert pointers('x (docs/video.md, "Encoder speed") y docs/gpu.md "Compiled ahead"') == [
        ("video.md", "Encoder speed"), ("gpu.md", "Compiled ahead")]
    page = tmp_path / "page.md"
    page.write_text("# Video: frame rates\n\n## `--process-size HxW`\n\n- **Reproducible.** Pair i\n")
    assert sections(page) == ["video: frame rates", "--process-size hxw", "reproducible."]
