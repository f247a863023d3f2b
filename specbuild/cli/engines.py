"""`specbuild convert`, `specbuild compile`, `specbuild verify` (registered on the root app).

Thin: each command builds options and calls one library function. Only typer is imported at module
level; torch, safetensors and the converter load inside the command bodies.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from specbuild.cli.common import EXIT_CHECK_FAILED, console, handle_errors
from specbuild.engines.trtllm.medusa import DEFAULT_MAX_DRAFT_LEN  # torch-free at import

GPU_NOTE = "trtllm-build (the TensorRT-LLM engine build) only runs on GPU hosts with tensorrt_llm 1.2.x installed."


def _progress():
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    return Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn(), console=console(), transient=False)


def convert(
    hf_model: Annotated[str, typer.Argument(help="HF model folder (config.json + *.safetensors) or a cached hub id.")],
    out: Annotated[Path, typer.Option("--out", help="Output folder for the TensorRT-LLM checkpoint (must not exist unless --force).")],
    dtype: Annotated[str | None, typer.Option("--dtype", help="float32 | float16 | bfloat16 (default: the checkpoint's dtype).")] = None,
    tp_size: Annotated[int, typer.Option("--tp-size", help="Tensor-parallel ranks (KV heads are repeated when tp > KV heads).")] = 1,
    pp_size: Annotated[int, typer.Option("--pp-size", help="Pipeline-parallel stages (layers split like torch.tensor_split).")] = 1,
    medusa: Annotated[Path | None, typer.Option("--medusa", help="Folder with HF Medusa heads (medusa_lm_head.safetensors or .pt, optional config.json).")] = None,
    num_medusa_heads: Annotated[int | None, typer.Option("--num-medusa-heads", help="Medusa heads (default: medusa_num_heads of the heads' config.json); must match the weights.")] = None,
    num_medusa_layers: Annotated[int | None, typer.Option("--num-medusa-layers", help="ResBlocks per head (default: medusa_num_layers of the heads' config.json); must match the weights.")] = None,
    max_draft_len: Annotated[int, typer.Option("--max-draft-len", help="Medusa only: max_draft_len written to the checkpoint (>= the tree size).")] = DEFAULT_MAX_DRAFT_LEN,
    weight_only: Annotated[str, typer.Option("--weight-only", help="none | int8 | int4: sets quant_algo W8A16 / W4A16; trtllm-build quantizes the float weights.")] = "none",
    force: Annotated[bool, typer.Option("--force", help="Replace an existing output folder (only after the new one is complete).")] = False,
) -> None:
    """Convert an HF Llama/Mistral/Qwen2 checkpoint (plus optional Medusa heads) into a TensorRT-LLM 1.2.x
    checkpoint: config.json + rank{N}.safetensors + specbuild.json. Runs on CPU; building engines from it
    needs `trtllm-build`, which only runs on GPU hosts."""
    from specbuild.builder.resolve import resolve_model
    from specbuild.engines.trtllm.convert import convert_checkpoint
    from specbuild.engines.trtllm.medusa import MedusaHeadsSource

    hf_dir = resolve_model(hf_model)
    heads = MedusaHeadsSource(medusa, num_heads=num_medusa_heads, num_layers=num_medusa_layers, max_draft_len=max_draft_len) if medusa else None
    with _progress() as progress:
        task = progress.add_task(f"convert {hf_dir.name}", total=None)
        path = convert_checkpoint(
            hf_dir, out, dtype=dtype, tp_size=tp_size, pp_size=pp_size, medusa=heads, weight_only=weight_only, force=force,
            on_progress=lambda done, total, _name: progress.update(task, completed=done, total=total),
        )
    console().print(f"wrote TensorRT-LLM checkpoint {path} (world size {tp_size * pp_size})")


def compile_cmd(
    spec_path: Annotated[Path, typer.Argument(metavar="SPEC", help="Build spec (YAML).")],
    out: Annotated[Path, typer.Option("--out", help="Output folder: target/, draft/, plan.json, build.sh, specbuild.json.")],
    engine: Annotated[str, typer.Option("--engine", help="reference (PyTorch engine folder, runs on CPU) | trtllm (runs trtllm-build; GPU hosts only).")] = "reference",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="With --engine trtllm: convert and write plan.json + build.sh, but do not run trtllm-build.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing output folder (only after the new one is complete).")] = False,
) -> None:
    """Run preflight, convert every model of SPEC to TensorRT-LLM checkpoints, and build the engines.

    --engine trtllm runs the exact trtllm-build commands when trtllm-build is installed (GPU hosts only;
    logs in <role>/build.log); otherwise, or with --dry-run, it writes build.sh and plan.json to run on a
    GPU host. --engine reference writes engine folders for the PyTorch reference engine (CPU)."""
    from specbuild.builder.compile import compile_spec
    from specbuild.core.spec import load_spec

    spec = load_spec(spec_path)
    with _progress() as progress:
        tasks: dict[str, int] = {}

        def on_progress(label: str, done: int, total: int) -> None:
            if label not in tasks:
                tasks[label] = progress.add_task(label, total=total)
            progress.update(tasks[label], completed=done, total=total)

        path = compile_spec(spec, out, engine=engine, dry_run=dry_run, force=force, on_progress=on_progress, on_message=lambda m: progress.console.print(m))
    console().print(f"wrote build {path}")


def verify(
    folder: Annotated[Path, typer.Argument(metavar="DIR", help="A folder written by specbuild (checkpoint, build, engine, repository).")],
) -> None:
    """Re-hash every file of DIR and of every artifact folder nested in it against their specbuild.json
    manifests; print what changed; exit 1 if anything did."""
    from specbuild.core.manifest import MANIFEST, verify_manifest

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


def register(app: typer.Typer) -> None:
    """Add convert, compile and verify to `app`."""
    app.command("convert", help=_help(convert, GPU_NOTE))(handle_errors(convert))
    app.command("compile", help=_help(compile_cmd, GPU_NOTE))(handle_errors(compile_cmd))
    app.command("verify", help=_help(verify))(handle_errors(verify))


def _help(fn, *extra: str) -> str:
    """The docstring's paragraphs as single lines (rich keeps the docstring's line breaks otherwise)."""
    import inspect

    paragraphs = inspect.cleandoc(fn.__doc__ or "").split("\n\n")
    return "\n\n".join([" ".join(p.split()) for p in paragraphs] + list(extra))
