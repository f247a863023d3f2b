"""The `specbuild` command line (root.py); `from specbuild.cli import app, main`."""

from specbuild.cli.root import app, main

__all__ = ["app", "main"]
