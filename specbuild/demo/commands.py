"""The demos' command runner: `specbuild ...` run as a user types it (echoed, in a subprocess of this
virtualenv's `specbuild`), the console, and the stage ledger (wall time per stage, what failed)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from specbuild.core.errors import SpecbuildError
from specbuild.core.pdeathsig import die_with_parent

REPO_ROOT = Path(__file__).resolve().parents[2]


def console() -> Console:
    return Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 160)


def rule(title: str) -> None:
    console().rule(f"[bold]{title}")


@dataclass
class Ledger:
    """Wall time per stage and what failed; printed at the end."""

    timings: dict[str, float] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.time)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        rule(name)
        t = time.time()
        try:
            yield
        finally:
            self.timings[name] = self.timings.get(name, 0.0) + time.time() - t


def specbuild_exe() -> str:
    exe = Path(sys.executable).with_name("specbuild")
    if not exe.is_file():
        raise SpecbuildError(
            "the specbuild command is not installed next to this Python",
            expected=str(exe),
            found="no such file",
            fix="run `make setup` (or `pip install -e .`) in this virtualenv",
        )
    return str(exe)


def shown(argv: list[str]) -> str:
    """The command as a user would type it: `specbuild ...` with paths relative to the repository."""
    words = ["specbuild" if i == 0 else a for i, a in enumerate(argv)]
    return " ".join(relative(w) for w in words)


def relative(word: str) -> str:
    if word.startswith(str(REPO_ROOT) + os.sep):
        return os.path.relpath(word, Path.cwd())
    return word if " " not in word and "\n" not in word else json.dumps(word)


def run_cli(
    *args: str, capture: bool = False, check: bool = True, show: bool = True
) -> subprocess.CompletedProcess:
    """Run `specbuild ARGS` (echoed first); a non-zero exit raises unless check=False. capture: keep the
    output (printed too unless show=False: a JSON report the caller summarises)."""
    argv = [specbuild_exe(), *args]
    console().print(f"[bold cyan]$ {shown(argv)}[/]")
    t0 = time.time()
    done = subprocess.run(argv, capture_output=capture, text=True, env=env(), preexec_fn=die_with_parent())
    console().print(f"[dim]({time.time() - t0:.1f}s)[/]")
    if capture and show and done.stdout:
        print(done.stdout, end="")
    if check and done.returncode != 0:
        if capture and done.stderr:
            print(done.stderr, end="", file=sys.stderr)
        raise SpecbuildError(
            f"`{shown(argv)}` failed",
            expected="exit code 0",
            found=f"exit code {done.returncode}",
            fix="see the output above",
        )
    return done


def env() -> dict[str, str]:
    """The environment of each command; wide tables when the output goes to a file, not a terminal."""
    out = dict(os.environ)
    if not sys.stdout.isatty():
        out.setdefault("COLUMNS", "160")
    return out


def has_command(*words: str) -> bool:
    """Whether `specbuild WORDS --help` works (stages land independently while the project grows)."""
    done = subprocess.run([specbuild_exe(), *words, "--help"], capture_output=True, text=True)
    return done.returncode == 0


def add_common_options(parser: argparse.ArgumentParser, defaults) -> None:
    """--out, --cache, --concurrency and --max-tokens, the options both demos take (make demo, make
    demo-real); `defaults` is their options dataclass (fields out, cache, concurrency, max_tokens)."""
    d = defaults
    parser.add_argument("--out", type=Path, default=d.out, help=f"output folder (default {d.out})")
    parser.add_argument("--cache", type=Path, default=d.cache, help=f"model cache (default {d.cache})")
    parser.add_argument(
        "--concurrency", default=d.concurrency, help=f"bench concurrency list (default {d.concurrency})"
    )
    parser.add_argument(
        "--max-tokens", type=int, default=d.max_tokens, help=f"tokens per request (default {d.max_tokens})"
    )
