"""`specbuild eagle3 ...`: EAGLE-3 draft checkpoints (`eagle3 convert` between the HF layout and the
speculators format). Thin: calls builder/eagle3_convert.py when the command runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from specbuild.cli.common import INPUT, OUT_DIR, Force, console, group, group_command

eagle3_app = group(
    "eagle3",
    typer.Typer(
        no_args_is_help=True,
        help="EAGLE-3 draft checkpoints: `specbuild eagle3 convert DRAFT --to speculators|hf --out DIR`.",
    ),
)


@group_command(eagle3_app, "convert")
def convert(
    draft: Annotated[
        str,
        typer.Argument(help="An EAGLE-3 draft folder, HF layout or speculators format (read only)."),
        INPUT("EAGLE-3 draft"),
    ],
    to: Annotated[str, typer.Option("--to", help="The format to write: speculators or hf.")],
    out: Annotated[Path, typer.Option("--out", help="The folder to write (created whole)."), OUT_DIR],
    verifier: Annotated[
        str | None,
        typer.Option(
            "--verifier",
            help="--to speculators: the target the draft was trained for (hub id or folder), recorded as "
            "speculators_config.verifier (vLLM loads it from there).",
        ),
    ] = None,
    speculative_tokens: Annotated[
        int | None,
        typer.Option(
            "--speculative-tokens",
            min=1,
            help="--to speculators: proposal_methods[0].speculative_tokens (vLLM's K when it serves the "
            "folder directly; default 3, what speculators' converter writes).",
        ),
    ] = None,
    force: Force = False,
) -> None:
    """Convert an EAGLE-3 draft between the HF layout (`midlayer.*`, `eagle_config`; SpecForge,
    TensorRT-LLM, SGLang) and the speculators format (`layers.0.*`, `transformer_layer_config`,
    `speculators_config`; vLLM).

    Tensors keep their bytes (a round trip is byte-exact); the aux-layer ids are converted between the
    numberings explicitly (HF `eagle_config`: i = the output of target layer i; speculators and vLLM: i +
    1, 0 being the embedding). Run `specbuild check` on a spec naming the result to validate it against
    the target.
    """
    from specbuild.builder.eagle3_convert import convert_eagle3, describe

    result = convert_eagle3(
        draft, out, to=to, verifier=verifier, speculative_tokens=speculative_tokens, force=force
    )
    console().print(describe(result))
