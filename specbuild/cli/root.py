"""The `specbuild` command line. Thin: each command parses options and calls one library function.

Commands live in one module per stage in this package (builder, engines, generate, repo, tuning,
serve, client) and register themselves with `common.command`; `register` adds them to `app`. Heavy
imports (torch, transformers, tritonclient) happen inside the commands, so `--help` stays instant.
"""

from __future__ import annotations

import os

import typer

from specbuild.cli import builder, client, deploy, engines, generate, plan, repo, serve, train_eagle3, tuning  # noqa: F401 - they register commands
from specbuild.cli.common import register

app = typer.Typer(
    name="specbuild",
    help=(
        "Build, serve and benchmark speculative decoding (draft/target, Medusa, n-gram, EAGLE-3) on "
        "TensorRT-LLM and Triton Inference Server.\n\n"
        "TensorRT-LLM engine builds need a GPU host with tensorrt_llm 1.2.x; without it, `compile` "
        "writes the exact build plan (build.sh, plan.json) plus a PyTorch reference engine that runs "
        "the same checkpoint, so the whole pipeline runs and is tested on a CPU."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root(
    debug: bool = typer.Option(
        False, "--debug", help="Show full tracebacks instead of short error messages."
    ),
) -> None:
    if debug:
        os.environ["SPECBUILD_DEBUG"] = "1"


# `--help` lists the commands in pipeline order
register(
    app,
    order=(
        "check",
        "inspect",
        "doctor",
        "convert",
        "compile",
        "verify",
        "generate",
        "serve",
        "bench",
        "train-medusa",
        "tune",
        "plan",
        "deploy",
    ),
)


def main() -> None:
    app(prog_name="specbuild")


if __name__ == "__main__":
    main()
