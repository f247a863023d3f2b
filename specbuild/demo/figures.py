"""`make figures`: the current figures of `make demo`, written to a docs page (docs/figures/demo.md).

The demo writes its summary into build/demo; `python -m specbuild.demo --figures PAGE` then writes PAGE
from that run: the machine, tune's reports and the summary tables. The page carries no date: it is the
figures of the last `make figures`; dated runs are kept in lab/notebook/.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

import torch

from specbuild.core.errors import SpecbuildError
from specbuild.demo.commands import REPO_ROOT


def machine() -> str:
    """The host the figures were measured on (CPU model, cores, Python, torch)."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{cores} CPU cores ({model}), Python {sys.version.split()[0]}, torch {torch.__version__}"


def figures_page(
    *, summary_md: str, tune_reports: dict[str, str], family_line: str | None, stage_times: dict[str, float]
) -> str:
    """The page's text (tune_reports: mode -> the `specbuild tune` command line and its output)."""
    lines = page_header(
        "`make demo`",
        "make figures",
        "python -m specbuild.demo --figures docs/figures/demo.md",
        "Acceptance and tokens per pass are deterministic for the demo models, prompts and the K or\n"
        "tree tune chose; times, and the K chosen from the measured cost ratio, are this machine's. How to\n"
        "read the tables: [../demo.md](../demo.md).",
    )
    if family_line:
        lines += [family_line, ""]
    if tune_reports:
        lines += ["## tune", ""]
        for report in tune_reports.values():
            lines += ["```text", report.rstrip("\n"), "```", ""]
    lines += ["## Summary", "", summary_md.rstrip("\n"), ""]
    lines = [line.replace(f"{REPO_ROOT}{os.sep}", "") for line in lines]  # build/... as the docs name it
    if stage_times:
        lines += ["Stage times: " + ", ".join(f"{k} {v:.0f} s" for k, v in stage_times.items()) + ".", ""]
    return "\n".join(lines)


def page_header(title: str, target: str, command: str, about: str) -> list[str]:
    """The first lines of a figures page: its title, the make target that writes it, and the machine."""
    return [
        f"# Current figures: {title}",
        "",
        f"<!-- Written by `{target}` ({command}) from the run it makes; do not edit.",
        "     Dated runs: lab/notebook/. -->",
        "",
        f"Measured on {machine()}. {about}",
        "",
    ]


def write_figures(page: Path, text: str) -> None:
    """Write the page (its folder must exist: a docs folder, not something to create by mistake)."""
    if not page.parent.is_dir():
        raise SpecbuildError(
            f"cannot write the figures page {page}",
            expected="an existing folder (docs/figures/)",
            found=f"no folder {page.parent}",
            fix="pass --figures docs/figures/demo.md from the repository root",
        )
    page.write_text(text, encoding="utf-8")
    print(f"figures: wrote {page}")
