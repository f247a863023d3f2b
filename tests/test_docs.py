"""The docs a user reads: sizes, no dated runs, and the generated pages are current.

Dated measurements live only in lab/notebook/YYYY-MM-DD-topic.md; README, docs/ and the package state
current behaviour. The rule for "dated" is written out below and tested on examples of both kinds.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_MAX = 10 * 1024  # bytes (issue 36: "README <= 10 KB")
DOC_MAX = 40 * 1024  # bytes per docs page (issue 36: "no docs page over 40 KB")

# A run's date or clock time: a calendar date 20YY-MM-DD, or a time of day followed by UTC or by a range
# ("12:31–12:43", "19:38-19:55").
_DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
_CLOCK = re.compile(r"\b[0-2]?\d:[0-5]\d(?:\s*UTC\b|\s*[–-]\s*[0-2]?\d:[0-5]\d\b)")
# A citation of a notebook entry is how docs and comments point at a dated run: not itself a run.
_NOTEBOOK_CITE = re.compile(r"lab/notebook/20\d\d-[01]\d-[0-3]\d-[\w.-]+")
# Upstream provenance: when an upstream change landed or when a source was read ("PRs 17366
# (2026-08-06)", "merged 2026-09-15", "main after 2026-09-04", "read 2026-12-01"). These date a fact
# about upstream, not a measurement of ours, and the facts rules ask for them.
_PROVENANCE_BEFORE = re.compile(r"(?:\bPRs?\b[^.;]*\(|\bmerged |\bread |\bafter |\bbefore |\breleased? )$")


def dated_spans(line: str) -> list[str]:
    """The dates and clock times of `line` that mark a run (empty: the line is fine)."""
    text = _NOTEBOOK_CITE.sub("", line)
    found = []
    for m in _DATE.finditer(text):
        if not _PROVENANCE_BEFORE.search(text[: m.start()]):
            found.append(m.group())
    found += [m.group() for m in _CLOCK.finditer(text)]
    return found


@pytest.mark.parametrize(
    "line",
    [
        "Timings now (2026-12-03 15:15 UTC, models cached)",
        "### Measured 2026-12-01 22:24–22:27 UTC, main b576eb4",
        "(make demo, 08:20-08:27, main a8c4d8d) the one-call K=4 runs",
        "# `make demo` (2026-12-03, docs/schedule.md).",
        "the Medusa bench, 20:22 UTC: its BLS stub",
    ],
)
def test_a_dated_run_is_found(line):
    assert dated_spans(line)


@pytest.mark.parametrize(
    "line",
    [
        "figures: `lab/notebook/2026-12-04-convert-speed.md`",
        '"(PRs 16888, 19204 merged 2026-09-15)",',
        '"PRs 17366 (2026-08-06), 18721 (2026-09-04)",',
        "and the 1.3.0rc line before 2026-09-04; specbuild never writes",
        '(mercatus-ai.com "Cloud GPU pricing", read 2026-12-01)',
        "speculation.schedule: {1: 4, 3: 0}, schedule 1:4,3:0",
    ],
)
def test_provenance_and_citations_are_not_runs(line):
    assert dated_spans(line) == []


def _user_text_files() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    files += sorted(p for p in (ROOT / "specbuild").rglob("*") if p.suffix in (".py", ".md"))
    return files


def test_no_dated_measurement_in_readme_docs_or_package():
    bad = [
        f"{path.relative_to(ROOT)}:{n}: {', '.join(spans)}"
        for path in _user_text_files()
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if (spans := dated_spans(line))
    ]
    assert not bad, "dated runs belong in lab/notebook/YYYY-MM-DD-topic.md:\n" + "\n".join(bad)


def test_readme_and_docs_sizes():
    assert (ROOT / "README.md").stat().st_size <= README_MAX
    big = {
        str(p.relative_to(ROOT)): p.stat().st_size
        for p in (ROOT / "docs").rglob("*.md")
        if p.stat().st_size > DOC_MAX
    }
    assert not big, f"docs pages over {DOC_MAX} bytes (split by topic): {big}"


def test_readme_opens_with_the_two_commands():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block and text.index(block.group()) < 200, "the first thing README shows is the commands"
    commands = [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.strip()]
    assert commands == ["make demo", "make test"]


def test_notebook_names():
    for path in (ROOT / "lab" / "notebook").glob("*.md"):
        assert re.fullmatch(r"20\d\d-[01]\d-[0-3]\d-[a-z0-9][a-z0-9-]*\.md", path.name), path.name


def test_relative_links_in_readme_and_docs_resolve():
    link = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
    broken = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in link.findall(path.read_text(encoding="utf-8")):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (path.parent / target).exists():
                broken.append(f"{path.relative_to(ROOT)} -> {target}")
    assert not broken, broken
