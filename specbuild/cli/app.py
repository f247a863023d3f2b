"""The `specbuild` command line. Thin: each command parses options and calls one library function.

Commands live beside the code they drive (cli/builder.py, engines/.../cli.py, ...) and register
themselves on `app`; heavy imports (torch, transformers, tritonclient) happen inside the commands.
"""

from __future__ import annotations

import os

import typer

app = typer.Typer(
    name="specbuild",
    help=(
        "Build, serve and benchmark speculative decoding (draft/target and Medusa) on TensorRT-LLM "
        "engines and Triton Inference Server.\n\n"
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
    debug: bool = typer.Option(False, "--debug", help="Show full tracebacks instead of short error messages."),
) -> None:
    if debug:
        os.environ["SPECBUILD_DEBUG"] = "1"


def _register() -> None:
    # Each module's register(app) adds its commands; all of them import only typer at module level.
    from specbuild.cli import builder as builder_cli
    from specbuild.cli import client as client_cli
    from specbuild.cli import engines as trtllm_cli
    from specbuild.cli import generate as reference_cli
    from specbuild.cli import repo as repo_cli
    from specbuild.cli import tuning as tuning_cli

    for module in (builder_cli, trtllm_cli, reference_cli, repo_cli, client_cli, tuning_cli):
        module.register(app)


_register()


def main() -> None:
    app(prog_name="specbuild")


if __name__ == "__main__":
    main()
