"""CLI commands of this stage (registered on the root app by specbuild.cli)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this stage's commands to `app`."""
