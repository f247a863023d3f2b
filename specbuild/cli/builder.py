"""Commands of the builder stage: check, inspect, compile, verify.

Only typer is imported here; each command imports its library module when it runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from specbuild.cli.common import (
    EXIT_CHECK_FAILED,
    GPU_NOTE,
    INPUT,
    OUT_DIR,
    AsJson,
    Force,
    SpecArg,
    command,
    console,
    progress_bar,
)


@command("check")
def check(
    spec: SpecArg,
    as_json: AsJson = False,
    reserve_gib: Annotated[
        float | None,
        typer.Option(
            "--reserve-gib",
            help="Runtime memory reserve per GPU in GiB for the plan (default 2: CUDA context, workspaces, "
            "Triton).",
        ),
    ] = None,
) -> None:
    """Run every preflight check of SPEC and print a pass/warn/fail table and the per-GPU memory plan.

    Checks: supported architecture (Llama, Mistral, Qwen2); draft and target share the tokenizer
    (vocabulary, merges, special-token ids) and the vocab size; TP/PP divisibility (heads, KV heads incl.
    duplication when tp > KV heads, layers, hidden/intermediate); Medusa heads and tree; sequence length;
    memory plan (weights, KV cache per token, tokens that fit, kv_cache_free_gpu_mem_fraction and
    max_tokens_in_paged_kv_cache of each engine). The flow row: the method x flow x version matrix (flow
    llmapi: the LLM API on the PyTorch backend, one KV pool, kv_cache_config in the plan). EAGLE-3
    (mode eagle3, flow llmapi): the draft's hidden size, vocabulary (draft_vocab_size, d2t, lm_head) and
    captured layers against the target, and its weights and KV in the plan; `compile --flow llmapi --engine
    reference` also writes a reference target engine that runs the draft one-model on this CPU.

    Works from config.json alone (weights absent: a warning), on any machine, without a GPU. Exit code 1
    when a check fails, 2 when the spec itself is invalid.
    """
    import math

    from specbuild.builder.memory_plan import RUNTIME_RESERVE_GIB
    from specbuild.builder.preflight import run_checks
    from specbuild.core.errors import SpecbuildError
    from specbuild.core.spec import MAX_GPU_MEMORY_GB, load_spec

    if reserve_gib is not None and not (math.isfinite(reserve_gib) and 0 <= reserve_gib <= MAX_GPU_MEMORY_GB):
        raise SpecbuildError(
            f"--reserve-gib {reserve_gib} is not a memory size",
            expected=f"GiB per GPU kept for the runtime: a finite number in 0..{MAX_GPU_MEMORY_GB:g}",
            found=str(reserve_gib),
            fix=f"pass --reserve-gib {RUNTIME_RESERVE_GIB:g}, or leave it out",
        )

    loaded = load_spec(spec, validate_tree=False)  # the tree becomes a row of the table
    report = run_checks(
        loaded, runtime_reserve_gib=RUNTIME_RESERVE_GIB if reserve_gib is None else reserve_gib
    )
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2, default=str))
    else:
        from specbuild.cli.render import render_check

        render_check(report, console())
    if not report.ok:
        raise typer.Exit(EXIT_CHECK_FAILED)


@command("inspect")
def inspect(
    model: Annotated[
        str,
        typer.Argument(
            help="A model folder (config.json, weights, tokenizer) or a hub id in the local Hugging Face "
            "cache."
        ),
        INPUT("model"),
    ],
    as_json: AsJson = False,
    check_values: bool = typer.Option(
        False,
        "--check-values",
        help="Also read every weight and list the tensors holding NaN or Inf (reads the whole checkpoint "
        "once).",
    ),
    target: Annotated[
        str | None,
        typer.Option(
            "--target",
            help="An EAGLE-3 draft's target (folder or cached hub id): also run `check`'s EAGLE-3 rows "
            "against it (exit 1 when one fails).",
        ),
        INPUT("target model"),
    ] = None,
    layers: Annotated[
        str | None,
        typer.Option(
            "--layers",
            help="With --target: the layers the target will capture, as eagle3.layers_to_capture "
            "(comma-separated layer outputs; default TensorRT-LLM's).",
        ),
    ] = None,
) -> None:
    """Show what a checkpoint is: architecture, layers, hidden size, heads / KV heads, head dim, vocab, rope
    settings, dtype, parameter count and bytes, weight files, and a tokenizer summary (class, vocab size,
    special tokens).

    Reads config.json, safetensors headers and tokenizer files only (nothing is loaded, never downloads;
    --check-values reads every weight once to find NaN/Inf); also describes a Medusa heads folder and an
    EAGLE-3 draft in either checkpoint format (HF layout or speculators: sizes, vocabularies, the aux-layer
    ids in both numberings, the verifier); with --target, `check`'s EAGLE-3 rows against that target
    (hidden size, vocabularies and d2t, tokenizer, the layers it was trained on), without a spec.
    """
    from specbuild.builder.inspect_model import inspect_model

    report = inspect_model(model, check_values=check_values)
    rows = _eagle3_rows(report, model, target, layers) if target is not None else None
    if as_json:
        out = report.to_dict()
        if rows is not None:
            out["checks"] = [r.__dict__ for r in rows]
        typer.echo(json.dumps(out, indent=2, default=str))
    else:
        from specbuild.cli.render import render_check_rows, render_inspection

        render_inspection(report, console())
        if rows is not None:
            render_check_rows(rows, console(), title=f"against {target}")
    if rows is not None and any(r.status == "fail" for r in rows):
        raise typer.Exit(EXIT_CHECK_FAILED)


def _eagle3_rows(report, model: str, target: str, layers: str | None):
    from specbuild.builder.eagle3_checks import check_draft_folder
    from specbuild.core.errors import SpecbuildError

    if report.eagle3 is None:
        raise SpecbuildError(
            "--target compares an EAGLE-3 draft with its target",
            expected="an EAGLE-3 draft folder (HF layout or speculators)",
            found=f"{model}: not an EAGLE-3 draft",
            fix="leave out --target, or point at the draft",
        )
    try:
        given = [int(x) for x in layers.split(",")] if layers else None
    except ValueError:
        raise SpecbuildError(
            f"--layers {layers!r} is not a list of layer ids",
            expected="comma-separated integers, e.g. 1,14,26 (the outputs of those target layers)",
            found=layers,
            fix="pass --layers like 1,14,26",
        ) from None
    return check_draft_folder(model, target, layers_to_capture=given)


@command("compile", GPU_NOTE)
def compile_cmd(
    spec_path: SpecArg,
    out: Annotated[
        Path,
        typer.Option(
            "--out",
            help="Output folder: target/, draft/, plan.json, build.sh, specbuild.json (flow llmapi: "
            "llmapi_options.yaml, serve.sh, plan.json, specbuild.json).",
        ),
        OUT_DIR,
    ],
    flow: Annotated[
        str | None,
        typer.Option(
            "--flow",
            help="engine (convert + trtllm-build, TensorRT-LLM up to 1.2.x) | llmapi (the LLM API on the "
            "PyTorch backend: the options file for trtllm-serve / Triton's LLM-API model / Dynamo and the "
            "exact trtllm-serve command, no conversion). Default: the spec's flow.",
        ),
    ] = None,
    trtllm_version: Annotated[
        str | None,
        typer.Option(
            "--trtllm-version",
            help="Target this TensorRT-LLM release instead of the spec's trtllm_version (flow "
            "llmapi: 1.2.1 | "
            "1.4.0rc4).",
        ),
    ] = None,
    engine: Annotated[
        str | None,
        typer.Option(
            "--engine",
            help="reference (PyTorch engine folder, runs on CPU) | trtllm (runs trtllm-build; GPU hosts "
            "only). Flow llmapi: none (default) | reference (also writes reference engines so the build "
            "runs on this CPU: `generate --engine`, `tune --engine`, the LLM-API interface).",
        ),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="With --engine trtllm: convert and write plan.json + build.sh, but do not run trtllm-build.",
        ),
    ] = False,
    force: Force = False,
) -> None:
    """Run preflight, convert every model of SPEC to TensorRT-LLM checkpoints, and build the engines.

    --engine trtllm runs the exact trtllm-build commands when trtllm-build is installed (GPU hosts only;
    logs in <role>/build.log); otherwise, or with --dry-run, it writes build.sh and plan.json to run on a
    GPU host. --engine reference writes engine folders for the PyTorch reference engine (CPU).

    --flow llmapi (or `flow: llmapi` in the spec) writes the LLM-API options (speculative_config spelled for
    the spec's trtllm_version, kv_cache_config from the memory plan, batch/sequence limits, TP/PP, backend
    pytorch), serve.sh with the exact trtllm-serve command, and plan.json; the same preflight runs first."""
    from specbuild.builder.compile import compile_spec
    from specbuild.core.spec import load_spec

    spec = load_spec(spec_path, overrides={"flow": flow, "trtllm_version": trtllm_version})
    with progress_bar() as progress:
        tasks: dict[str, int] = {}

        def on_progress(label: str, done: int, total: int) -> None:
            if label not in tasks:
                tasks[label] = progress.add_task(label, total=total)
            progress.update(tasks[label], completed=done, total=total)

        path = compile_spec(
            spec,
            out,
            engine=engine,
            dry_run=dry_run,
            force=force,
            on_progress=on_progress,
            on_message=lambda m: progress.console.print(m),
        )
    console().print(f"wrote build {path}")


@command("verify")
def verify(
    folder: Annotated[
        Path,
        typer.Argument(
            metavar="DIR", help="A folder written by specbuild (checkpoint, build, engine, repository)."
        ),
        INPUT("folder"),
    ],
) -> None:
    """Re-hash every file of DIR and of every artifact folder nested in it against their specbuild.json
    manifests; print what changed; exit 1 if anything did."""
    from specbuild.core.formats.manifest import MANIFEST, verify_manifest

    root = Path(folder)
    folders = sorted(p.parent for p in root.rglob(MANIFEST)) or [root]  # none: read_manifest explains
    seen: dict[Path, str] = {}  # a nested artifact's file is in its own and its parents' manifests
    for f in folders:
        for c in verify_manifest(f):
            seen.setdefault((f / c.path).resolve(), c.status)
    for path, status in sorted(seen.items()):
        console().print(f"{status:8} {path}")
    if seen:
        console().print(f"{len(seen)} change(s) under {root}")
        raise typer.Exit(EXIT_CHECK_FAILED)
    console().print(f"ok: {len(folders)} manifest(s) under {root} match")
