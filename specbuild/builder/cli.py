"""CLI commands of the builder stage: check, inspect, doctor (registered on the root app by specbuild.cli).

Only typer is imported here; each command imports its library module when it runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from specbuild.cli_common import EXIT_CHECK_FAILED, console, handle_errors


@handle_errors
def check(
    spec: Annotated[Path, typer.Argument(help="The build spec (YAML). Model paths in it are relative to the spec file.")],
    as_json: bool = typer.Option(False, "--json", help="Print the results and the memory plan as JSON instead of tables."),
    reserve_gib: float | None = typer.Option(None, "--reserve-gib", help="Runtime memory reserve per GPU in GiB for the plan (default 2: CUDA context, workspaces, Triton)."),
) -> None:
    """Run every preflight check of SPEC and print a pass/warn/fail table and the per-GPU memory plan.

    Checks: supported architecture (Llama, Mistral, Qwen2); draft and target share the tokenizer (vocabulary, merges, special-token ids) and the vocab size; TP/PP divisibility (heads, KV heads incl. duplication when tp > KV heads, layers, hidden/intermediate); Medusa heads and tree; sequence length; memory plan (weights, KV cache per token, tokens that fit, kv_cache_free_gpu_mem_fraction and max_tokens_in_paged_kv_cache of each engine).

    Works from config.json alone (weights absent: a warning), on any machine, without a GPU. Exit code 1 when a check fails, 2 when the spec itself is invalid.
    """
    from specbuild.builder.memory_plan import RUNTIME_RESERVE_GIB
    from specbuild.builder.preflight import run_checks
    from specbuild.builder.spec import load_spec

    loaded = load_spec(spec, validate_tree=False)  # the tree becomes a row of the table
    report = run_checks(loaded, runtime_reserve_gib=RUNTIME_RESERVE_GIB if reserve_gib is None else reserve_gib)
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2, default=str))
    else:
        from specbuild.builder.render import render_check

        render_check(report, console())
    if not report.ok:
        raise typer.Exit(EXIT_CHECK_FAILED)


@handle_errors
def inspect(
    model: Annotated[str, typer.Argument(help="A model folder (config.json, weights, tokenizer) or a hub id in the local Hugging Face cache.")],
    as_json: bool = typer.Option(False, "--json", help="Print a JSON object instead of the table."),
    check_values: bool = typer.Option(False, "--check-values", help="Also read every weight and list the tensors holding NaN or Inf (reads the whole checkpoint once)."),
) -> None:
    """Show what a checkpoint is: architecture, layers, hidden size, heads / KV heads, head dim, vocab, rope settings, dtype, parameter count and bytes, weight files, and a tokenizer summary (class, vocab size, special tokens).

    Reads config.json, safetensors headers and tokenizer files only (nothing is loaded, never downloads; --check-values reads every weight once to find NaN/Inf); also describes a Medusa heads folder.
    """
    from specbuild.builder.inspect_model import inspect_model

    report = inspect_model(model, check_values=check_values)
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2, default=str))
    else:
        from specbuild.builder.render import render_inspection

        render_inspection(report, console())


@handle_errors
def doctor(
    as_json: bool = typer.Option(False, "--json", help="Print the rows as JSON."),
) -> None:
    """Report the environment: Python, torch (+CUDA, GPUs), tensorrt_llm and trtllm-build (GPU hosts only), the local tritonserver binary from the nvidia-pytriton wheel, its Python backend stub and the libpython the stub loads.

    Exit code 1 when something required is missing (a fail row).
    """
    from specbuild.builder.doctor import run_doctor

    rows = run_doctor()
    if as_json:
        typer.echo(json.dumps([r.__dict__ for r in rows], indent=2))
    else:
        from specbuild.builder.render import render_doctor

        render_doctor(rows, console())
    if any(r.status == "fail" for r in rows):
        raise typer.Exit(EXIT_CHECK_FAILED)


def register(app: typer.Typer) -> None:
    """Add this stage's commands to `app`."""
    app.command("check")(check)
    app.command("inspect")(inspect)
    app.command("doctor")(doctor)
