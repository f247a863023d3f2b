"""`specbuild plan`: capacity and cost of a spec for a traffic, with and without speculation.

Only typer is imported at module level: `specbuild --help` stays instant.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from specbuild.cli.common import INPUT, OUT_DIR, AsJson, SpecArg, command, console
from specbuild.core.errors import PlanError

_SUFFIX = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9}


def parse_amount(text: str | None, option: str) -> float | None:
    """'100M', '1.5e8', '2k' -> a number."""
    if text is None:
        return None
    t = text.strip().replace(",", "").replace("_", "")
    scale = _SUFFIX.get(t[-1:].lower(), 1.0) if t else 1.0
    try:
        return float(t[:-1] if scale != 1.0 else t) * scale
    except ValueError:
        raise PlanError(
            f"{option}: not a number",
            expected="e.g. 100M, 1.5e8, 2500",
            found=text,
            fix=f"write {option} as a number with an optional k/M/B suffix",
        ) from None


def _pair(text: str | None, option: str) -> tuple:
    if text is None:
        return None
    parts = [p.strip() for p in text.split(",")]
    if len(parts) > 2 or not parts[0]:
        raise PlanError(
            f"{option}: expected one or two numbers",
            expected="BASE or BASE,SPEC",
            found=text,
            fix=f"e.g. {option} 45,105",
        )
    values = [parse_amount(p, option) if p else None for p in parts]
    return tuple(values) if len(values) == 2 else (values[0], None)


def _gpu_counts(text: str | None) -> tuple[int, int] | None:
    """--claim 'BASE,SPEC' -> two whole GPU counts (PlanRequest checks they are >= 1)."""
    pair = _pair(text, "--claim")
    if pair is None:
        return None
    if any(v is None or not float(v).is_integer() for v in pair):
        raise PlanError(
            "--claim: expected two whole GPU counts",
            expected="BASE,SPEC, e.g. 16,8",
            found=text,
            fix="write --claim 16,8",
        )
    return int(pair[0]), int(pair[1])


@command("plan")
def plan(
    spec: SpecArg,
    tokens_per_day: Annotated[
        str | None,
        typer.Option("--tokens-per-day", help="Tokens a day, e.g. 100M (generated tokens; see --counts)."),
    ] = None,
    counts: Annotated[
        str,
        typer.Option(
            "--counts",
            help="What --tokens-per-day counts: output (generated) "
            "or total (prompt + generated, split by the lengths).",
        ),
    ] = "output",
    peak_rps: Annotated[float | None, typer.Option("--peak-rps", help="Peak requests per second.")] = None,
    peak_factor: Annotated[
        float | None,
        typer.Option("--peak-factor", help="Peak / average load (default 1: average load, no headroom)."),
    ] = None,
    input_len: Annotated[int, typer.Option("--input-len", help="Prompt tokens per request.")] = 512,
    output_len: Annotated[int, typer.Option("--output-len", help="Generated tokens per request.")] = 256,
    ttft_p99_ms: Annotated[
        float | None, typer.Option("--ttft-p99-ms", help="Latency objective: TTFT p99.")
    ] = None,
    itl_p99_ms: Annotated[
        float | None, typer.Option("--itl-p99-ms", help="Latency objective: ITL p99.")
    ] = None,
    latency_p99_ms: Annotated[
        float | None, typer.Option("--latency-p99-ms", help="Objective: request p99.")
    ] = None,
    utilisation: Annotated[
        float,
        typer.Option(
            "--utilisation",
            help="Fraction of the operating point's throughput a replica is planned to carry.",
        ),
    ] = 1.0,
    gpu_price_per_hour: Annotated[
        float | None,
        typer.Option(
            "--gpu-price-per-hour",
            help="USD per GPU-hour (default: the GPU's documented on-demand price, data/gpus.json).",
        ),
    ] = None,
    gpu: Annotated[
        str | None, typer.Option("--gpu", help="h100 | h200 | a100 (default: from serving.gpu_memory_gb).")
    ] = None,
    bench: Annotated[
        Path | None,
        typer.Option("--bench", help="Measured: a `specbuild bench` bench.json."),
        INPUT("--bench file"),
    ] = None,
    baseline_bench: Annotated[
        Path | None,
        typer.Option("--baseline-bench", help="The baseline runs, when --bench has none (Medusa)."),
        INPUT("--baseline-bench file"),
    ] = None,
    profile: Annotated[
        Path | None,
        typer.Option(
            "--profile",
            help="Speculation profile: the JSON of `specbuild tune SPEC --json`, or a "
            "speculation_profile.json "
            "(`bench`, `tune --save-profile`, ModelOpt's specdec_bench).",
        ),
        INPUT("--profile file"),
    ] = None,
    stated: Annotated[
        str | None, typer.Option("--stated", help="Stated tok/s per GPU: BASE,SPEC (e.g. 45,105).")
    ] = None,
    alpha: Annotated[
        float | None, typer.Option("--alpha", help="Prediction only: assumed acceptance.")
    ] = None,
    temperature: Annotated[float, typer.Option("--temperature", help="Which bench runs to use.")] = 0.0,
    claim: Annotated[
        str | None, typer.Option("--claim", help="Check a claim 'BASE,SPEC' GPUs, e.g. 16,8.")
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", help="Folder for plan.json and plan.png."), OUT_DIR
    ] = None,
    as_json: AsJson = False,
) -> None:
    """GPUs, replicas and cost for a traffic, with and without speculation, from a bench report
    (measured), stated figures, or the roofline prediction (labelled PREDICTED). See docs/plan.md."""
    from specbuild.core.perf import capacity as C
    from specbuild.core.spec import load_spec
    from specbuild.planning.plan import PlanRequest, make_plan
    from specbuild.planning.report import PLOT, render, write_json, write_plot

    request = PlanRequest(
        traffic=C.make_traffic(
            input_len=input_len,
            output_len=output_len,
            tokens_per_day=parse_amount(tokens_per_day, "--tokens-per-day"),
            counts=counts,
            peak_rps=peak_rps,
            peak_factor=peak_factor,
        ),
        objective=C.Objective(ttft_p99_ms, itl_p99_ms, latency_p99_ms),
        utilisation=utilisation,
        price_per_gpu_hour=gpu_price_per_hour,
        gpu=gpu,
        bench=bench,
        baseline_bench=baseline_bench,
        profile=profile,
        stated=_pair(stated, "--stated"),
        alpha=alpha,
        temperature=temperature,
        claim=_gpu_counts(claim),
    )
    result = make_plan(load_spec(spec), request)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        write_json(result, out / "plan.json")
        write_plot(result, out / PLOT)
    if as_json:
        from specbuild.planning.report import _finite

        typer.echo(json.dumps(_finite(result.to_dict()), indent=2))
        return
    c = console()
    c.print(render(result))
    if out is not None:
        c.print(f"wrote {out / 'plan.json'}, {out / PLOT}")
