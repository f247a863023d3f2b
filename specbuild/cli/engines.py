"""Commands of the engines stage: `specbuild convert` (HF -> TensorRT-LLM checkpoint).

Thin: builds options and calls one library function. Only typer is imported at module level; torch,
safetensors and the converter load inside the command body.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from specbuild.cli.common import GPU_NOTE, INPUT, OUT_DIR, Force, command, console, progress_bar


@command("convert", GPU_NOTE)
def convert(
    hf_model: Annotated[
        str,
        typer.Argument(help="HF model folder (config.json + *.safetensors) or a cached hub id."),
        INPUT("HF model"),
    ],
    out: Annotated[
        Path,
        typer.Option(
            "--out", help="Output folder for the TensorRT-LLM checkpoint (must not exist unless --force)."
        ),
        OUT_DIR,
    ],
    dtype: Annotated[
        str | None,
        typer.Option("--dtype", help="float32 | float16 | bfloat16 (default: the checkpoint's dtype)."),
    ] = None,
    tp_size: Annotated[
        int,
        typer.Option("--tp-size", help="Tensor-parallel ranks (KV heads are repeated when tp > KV heads)."),
    ] = 1,
    pp_size: Annotated[
        int,
        typer.Option("--pp-size", help="Pipeline-parallel stages (layers split like torch.tensor_split)."),
    ] = 1,
    medusa: Annotated[
        Path | None,
        typer.Option(
            "--medusa",
            help="Folder with HF Medusa heads (medusa_lm_head.safetensors or .pt, optional config.json).",
        ),
        INPUT("Medusa heads"),
    ] = None,
    num_medusa_heads: Annotated[
        int | None,
        typer.Option(
            "--num-medusa-heads",
            help="Medusa heads (default: medusa_num_heads of the heads' config.json); must match the "
            "weights.",
        ),
    ] = None,
    num_medusa_layers: Annotated[
        int | None,
        typer.Option(
            "--num-medusa-layers",
            help="ResBlocks per head (default: medusa_num_layers of the heads' config.json); must match the "
            "weights.",
        ),
    ] = None,
    max_draft_len: Annotated[
        int | None,
        typer.Option(
            "--max-draft-len",
            help="Medusa only: max_draft_len written to the checkpoint (>= the tree size; default: the size "
            "of the default tree, mc_sim_7b_63).",
        ),
    ] = None,
    weight_only: Annotated[
        str,
        typer.Option(
            "--weight-only",
            help="none | int8 | int4: sets quant_algo W8A16 / W4A16; trtllm-build quantizes the float "
            "weights.",
        ),
    ] = "none",
    force: Force = False,
) -> None:
    """Convert an HF Llama/Mistral/Qwen2 checkpoint (plus optional Medusa heads) into a TensorRT-LLM 1.2.x
    checkpoint: config.json + rank{N}.safetensors + specbuild.json. Runs on CPU; building engines from it
    needs `trtllm-build`, which only runs on GPU hosts."""
    from specbuild.builder.resolve import resolve_model
    from specbuild.core.formats.medusa_choices import DEFAULT_TREE, MedusaChoices
    from specbuild.engines.trtllm.convert import convert_checkpoint
    from specbuild.engines.trtllm.medusa import MedusaHeadsSource

    hf_dir = resolve_model(hf_model)
    k = max_draft_len if max_draft_len is not None else MedusaChoices.parse(DEFAULT_TREE).size
    heads = (
        MedusaHeadsSource(medusa, num_heads=num_medusa_heads, num_layers=num_medusa_layers, max_draft_len=k)
        if medusa
        else None
    )
    with progress_bar() as progress:
        task = progress.add_task(f"convert {hf_dir.name}", total=None)
        path = convert_checkpoint(
            hf_dir,
            out,
            dtype=dtype,
            tp_size=tp_size,
            pp_size=pp_size,
            medusa=heads,
            weight_only=weight_only,
            force=force,
            on_progress=lambda done, total, _name: progress.update(task, completed=done, total=total),
        )
    console().print(f"wrote TensorRT-LLM checkpoint {path} (world size {tp_size * pp_size})")
