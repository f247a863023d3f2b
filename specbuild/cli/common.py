"""Shared CLI plumbing: error mapping, the console, option parsing helpers.

Only typer/rich are imported here so that `specbuild --help` stays instant.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any, TypeVar

import typer

from specbuild.core.errors import SpecbuildError

F = TypeVar("F", bound=Callable[..., Any])

EXIT_ERROR = 2  # a SpecbuildError (bad input, missing file, server down, ...)
EXIT_CHECK_FAILED = 1  # `check` / `verify` / `repo check` found failures


def debug_enabled() -> bool:
    return os.environ.get("SPECBUILD_DEBUG", "") not in ("", "0")


def console():
    from rich.console import Console

    return Console(stderr=False, highlight=False, soft_wrap=True)


def err_console():
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=True)


def handle_errors(fn: F) -> F:
    """Map SpecbuildError (and Ctrl-C) to a clear message and a non-zero exit; traceback only with --debug."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except SpecbuildError as exc:
            if debug_enabled():
                raise
            err_console().print(f"[bold red]error:[/] {exc.message()}", markup=True)
            raise typer.Exit(EXIT_ERROR) from None
        except KeyboardInterrupt:
            err_console().print("interrupted")
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


def parse_csv_numbers(text: str, kind: type, option: str) -> list:
    """Parse '1,2,4' (or '0,0.8') into numbers; a bad item is a SpecbuildError naming the option."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    try:
        return [kind(t) for t in items]
    except ValueError:
        raise SpecbuildError(
            f"{option}: cannot read {text!r}",
            expected=f"a comma-separated list of {kind.__name__} values, e.g. 1,2,4",
            found=text,
            fix=f"pass {option} 1,2,4",
        ) from None
