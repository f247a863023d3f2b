"""What every `specbuild` command shares: registration, the error mapping, option aliases, consoles.

Every command is a function decorated with `@command("name")` in the module of its stage (or
`@group_command(group, "name")` inside a command group such as `repo`); `cli/root.py` imports those
modules and `register(app)` adds them all, each wrapped once by `handle_errors`, with its help built
from its docstring's paragraphs. Only typer and rich are imported here: `specbuild --help` stays
instant; each command imports its stage's modules when it runs.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from specbuild.cli.paths import INPUT, OUT_DIR, OUT_FILE, SPEC  # noqa: F401 - the roles commands declare
from specbuild.core.errors import SpecbuildError

F = TypeVar("F", bound=Callable[..., Any])

EXIT_ERROR = 2  # a SpecbuildError (bad input, missing file, server down, ...)
EXIT_CHECK_FAILED = 1  # `check` / `verify` / `repo check` found failures
GPU_NOTE = (
    "trtllm-build (the TensorRT-LLM engine build) only runs on GPU hosts with tensorrt_llm 1.2.x installed."
)

_COMMANDS: list[
    tuple[str, Callable[..., Any], tuple[str, ...]]
] = []  # (name, function, extra help paragraphs)
_GROUPS: list[tuple[str, typer.Typer]] = []

# ---- shared options ------------------------------------------------------------------------------
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]
Force = Annotated[
    bool,
    typer.Option("--force", help="Replace an existing output folder (only after the new one is complete)."),
]
SpecArg = Annotated[
    Path,
    typer.Argument(
        metavar="SPEC", help="Build spec (YAML). Model paths in it are relative to the spec file."
    ),
    SPEC,
]
Url = Annotated[str, typer.Option("--url", help="gRPC address of a running Triton server, HOST:PORT.")]
MaxTokens = Annotated[int, typer.Option("--max-tokens", help="New tokens per request (prompt excluded).")]
NumDraftTokens = Annotated[
    int | None,
    typer.Option(
        "--num-draft-tokens",
        help="Draft tokens per round K (methods that draft per round; default: the build's / repository's "
        "K).",
    ),
]
Timeout = Annotated[float, typer.Option("--timeout", help="Seconds one request may take.")]


def command(name: str, *extra_help: str) -> Callable[[F], F]:
    """Register the decorated function as `specbuild NAME`."""

    def wrap(fn: F) -> F:
        _COMMANDS.append((name, fn, extra_help))
        return fn

    return wrap


def group(name: str, app: typer.Typer) -> typer.Typer:
    """Register a command group (`specbuild NAME ...`) whose commands use `group_command`."""
    _GROUPS.append((name, app))
    return app


def group_command(app: typer.Typer, name: str) -> Callable[[F], F]:
    """Add the decorated function to a group, with the same error mapping and help as `command`."""

    def wrap(fn: F) -> F:
        app.command(name, help=help_text(fn))(handle_errors(fn))
        return fn

    return wrap


def register(app: typer.Typer, order: tuple[str, ...] = ()) -> None:
    """Add every registered command and group to the root app (`order` first, then the rest)."""
    rank = {name: i for i, name in enumerate(order)}
    for name, fn, extra in sorted(_COMMANDS, key=lambda c: rank.get(c[0], len(rank))):
        app.command(name, help=help_text(fn, *extra))(handle_errors(fn))
    for name, sub in _GROUPS:
        app.add_typer(sub, name=name)


def help_text(fn: Callable[..., Any], *extra: str) -> str:
    """The docstring's paragraphs as single lines (rich keeps the docstring's line breaks otherwise)."""
    paragraphs = inspect.cleandoc(fn.__doc__ or "").split("\n\n")
    return "\n\n".join([" ".join(p.split()) for p in paragraphs] + list(extra))


# ---- errors and output ---------------------------------------------------------------------------


def debug_enabled() -> bool:
    return os.environ.get("SPECBUILD_DEBUG", "") not in ("", "0")


# Columns of stdout when it is not a terminal (a log, a pipe, CliRunner) and COLUMNS does not say: rich would
# squeeze every table into 80 and cut its headers ("so…"); this wide, each table keeps its natural width
# (rich pads no line to the console's width: the tables do not expand, text is soft-wrapped).
PIPE_WIDTH = 100_000


def console():
    """stdout's console: a terminal's own width (or COLUMNS), else PIPE_WIDTH: full-width tables in logs
    and pipes."""
    from rich.console import Console

    out = Console(stderr=False, highlight=False, soft_wrap=True)
    if out.is_terminal or os.environ.get("COLUMNS", "").isdigit():
        return out
    return Console(stderr=False, highlight=False, soft_wrap=True, width=PIPE_WIDTH)


def err_console():
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=True)


def handle_errors(fn: F) -> F:
    """Check the command's declared paths (cli/paths.py) before it runs, and map SpecbuildError, any
    OSError no stage turned into one, and Ctrl-C to a clear message and a non-zero exit; traceback only
    with --debug."""
    from specbuild.cli.paths import check_paths  # noqa: PLC0415 - beside its use

    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            check_paths(fn, signature.bind_partial(*args, **kwargs).arguments)
            return fn(*args, **kwargs)
        except (SpecbuildError, OSError) as exc:
            if debug_enabled():
                raise
            if isinstance(exc, OSError):
                from specbuild.core.formats.output_checks import file_system_error

                exc = file_system_error(exc)
            err_console().print(f"[bold red]error:[/] {exc.message()}", markup=True)
            raise typer.Exit(EXIT_ERROR) from None
        except KeyboardInterrupt:
            err_console().print("interrupted")
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


def parse_csv_numbers(text: str, kind: type, option: str) -> list:
    """Parse '1,2,4' (or '0,0.8') into numbers; a bad or empty item ('1,,2') is a SpecbuildError naming
    the option."""
    items = [t.strip() for t in text.split(",")]
    try:
        if "" in items:
            raise ValueError("an empty item")
        return [kind(t) for t in items]
    except ValueError:
        raise SpecbuildError(
            f"{option}: cannot read {text!r}",
            expected=f"a comma-separated list of {kind.__name__} values, e.g. 1,2,4",
            found=text,
            fix=f"pass {option} 1,2,4",
        ) from None


def progress_bar():
    """A rich progress bar with transfer columns (convert, compile)."""
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console(),
        transient=False,
    )
