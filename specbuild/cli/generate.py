"""`specbuild generate`: one prompt in-process on the reference engine (--engine, the engines stage) or
through a Triton server (--url, the client stage).

Thin: options -> SamplingParams -> generate_local / generate_remote. Heavy imports inside the body.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated

import typer

from specbuild.cli.common import INPUT, NumDraftTokens, command, console, err_console
from specbuild.core.errors import SpecbuildError
from specbuild.core.sampling_params import SamplingParams

REMOTE_MODELS = ("ensemble", "tensorrt_llm_bls", "tensorrt_llm")  # the last: an LLM-API repository
DEFAULT_TIMEOUT_S = 60.0  # --url requests


def _default(name: str):
    """SamplingParams' own default, so the CLI never declares a second one."""
    return SamplingParams.__dataclass_fields__[name].default


@command("generate")
def generate(
    prompt: Annotated[
        str, typer.Option("--prompt", help="Prompt text (tokenized with the build's tokenizer).")
    ],
    engine: Annotated[
        Path | None,
        typer.Option(
            "--engine",
            help="Run in-process on CPU: a `specbuild compile` output folder, an engine folder or a "
            "TensorRT-LLM checkpoint.",
        ),
        INPUT("engine folder"),
    ] = None,
    url: Annotated[
        str | None,
        typer.Option(
            "--url",
            help="Send the request to a running Triton server instead, HOST:PORT of its gRPC endpoint.",
        ),
    ] = None,
    max_tokens: Annotated[
        int, typer.Option("--max-tokens", help="New tokens to generate (prompt excluded).")
    ] = _default("max_tokens"),
    temperature: Annotated[
        float, typer.Option("--temperature", help="0 = greedy; > 0 samples (speculation stays lossless).")
    ] = _default("temperature"),
    top_k: Annotated[
        int, typer.Option("--top-k", help="Keep the k most likely tokens (0 = off).")
    ] = _default("top_k"),
    top_p: Annotated[float, typer.Option("--top-p", help="Nucleus sampling mass (1.0 = off).")] = _default(
        "top_p"
    ),
    seed: Annotated[int | None, typer.Option("--seed", help="Seed for reproducible sampling.")] = _default(
        "seed"
    ),
    no_speculation: Annotated[
        bool, typer.Option("--no-speculation", help="--engine only: run the target alone (baseline).")
    ] = False,
    num_draft_tokens: NumDraftTokens = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print one JSON object: text and token_ids of the continuation, finish_reason, stats, "
            "timings.",
        ),
    ] = False,
    stream: Annotated[
        bool, typer.Option("--stream", help="--url only: use the decoupled streaming gRPC API.")
    ] = False,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="--url only: Triton model to call, ensemble | tensorrt_llm_bls | tensorrt_llm (Triton's "
            "LLM-API model) (default: the BLS, or an LLM-API repository's tensorrt_llm; the interface is "
            "read from the model's metadata).",
        ),
    ] = None,
    timeout: Annotated[
        float, typer.Option("--timeout", help="--url only: seconds to wait for the server.")
    ] = DEFAULT_TIMEOUT_S,
) -> None:
    """Generate a continuation of PROMPT, with speculative decoding (the build's method: draft/target,
    Medusa, n-gram or EAGLE-3) when the build has it.

    --engine runs the PyTorch reference engine in this process (CPU, no TensorRT-LLM needed);
    --url talks to a tritonserver serving a repository from `specbuild repo`. Without --json
    the text is printed as it is generated and the statistics go to stderr.
    """
    if (engine is None) == (url is None):
        raise SpecbuildError(
            "generate needs exactly one of --engine and --url",
            expected="--engine DIR or --url HOST:PORT",
            found=f"--engine {engine} --url {url}",
            fix="pass --engine build/NAME to run locally, or --url 127.0.0.1:8001",
        )
    if url is not None:
        from specbuild.core.addresses import grpc_address

        grpc_address(url, option="--url")
    if not (timeout > 0 and math.isfinite(timeout)):
        raise SpecbuildError(
            f"--timeout must be a finite number of seconds > 0, got {timeout}",
            expected="seconds one request may take",
            found=str(timeout),
            fix=f"pass --timeout {DEFAULT_TIMEOUT_S:g}",
        )
    if num_draft_tokens is not None and num_draft_tokens < 0:
        raise SpecbuildError(
            f"--num-draft-tokens must be >= 0, got {num_draft_tokens}",
            expected="draft tokens per round (0: the target alone)",
            found=str(num_draft_tokens),
            fix="pass --num-draft-tokens 4, or leave it out for the build's K",
        )
    if model is not None and model not in REMOTE_MODELS:
        raise SpecbuildError(
            f"unknown --model {model!r}",
            expected=" | ".join(REMOTE_MODELS),
            found=model,
            fix="use --model ensemble, tensorrt_llm_bls or (an LLM-API repository) tensorrt_llm",
        )
    params = SamplingParams(
        max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed
    )
    out = console()
    shown: list[str] = []

    def show(text: str) -> None:
        shown.append(text)
        out.print(text, end="", markup=False)

    on_text = None if as_json else show
    if url is not None:
        from specbuild.client.remote import generate_remote

        result = generate_remote(
            url,
            prompt,
            params,
            stream=stream,
            num_draft_tokens=num_draft_tokens,
            model=model,
            timeout_s=timeout,
            on_text=on_text,
        )
    else:
        from specbuild.engines.reference.api import generate_local

        result = generate_local(
            engine,
            prompt,
            params,
            speculative=not no_speculation,
            num_draft_tokens=num_draft_tokens,
            on_text=on_text,
        )
    if as_json:
        typer.echo(json.dumps(result.to_json()))
        return
    out.print("" if shown else result.text, markup=False)  # a client that did not stream: print it all now
    s = result.stats
    # in-process the passes are counted; a server reports only the drafts (its passes stay unknown)
    passes = f", target passes {s.target_passes}, draft passes {s.draft_passes}" if url is None else ""
    err_console().print(
        f"{len(result.token_ids)} tokens, finish={result.finish_reason}, speculative={result.speculative}, "
        f"accepted {s.accepted}/{s.drafted} drafts (rate {s.acceptance_rate:.2f}){passes}",
        markup=False,
    )
