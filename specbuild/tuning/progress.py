"""Rich progress bars for the training and profiling loops (the CLI's Reporter)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

_LABELS = {
    "train": "training heads",
    "distill": "self-distilling",
    "profile": "profiling",
    "convert": "converting (MB)",
}


class Reporter:
    """Progress hooks of the long loops. This base is silent; RichReporter draws bars."""

    def log(self, text: str) -> None: ...

    def start(self, name: str, total: int, done: int = 0) -> None: ...

    def advance(self, name: str, n: int = 1, **fields: Any) -> None: ...

    def stop(self, name: str) -> None: ...


class RichReporter(Reporter):
    def __init__(self) -> None:
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[info]}"),
            transient=False,
            console=Console(stderr=True),  # stdout carries the results (tune --json)
        )
        self._tasks: dict[str, Any] = {}

    def __enter__(self) -> RichReporter:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def log(self, text: str) -> None:
        self._progress.console.print(text)

    def start(self, name: str, total: int, done: int = 0) -> None:
        self._tasks[name] = self._progress.add_task(
            _LABELS.get(name, name), total=total, completed=done, info=""
        )

    def advance(self, name: str, n: int = 1, **fields: Any) -> None:
        info = "  ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in fields.items())
        self._progress.update(self._tasks[name], advance=n, info=info)

    def stop(self, name: str) -> None:
        task = self._tasks.pop(name, None)
        if task is not None:
            self._progress.refresh()
