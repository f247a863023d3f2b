"""`make aiperf`: AIPerf 0.13.0's standard `completions` and `chat` flows against specbuild's local
server (the OpenAI frontend of `specbuild serve --openai-port`), next to `specbuild bench` on the same
prompts and lengths, in one table (build/aiperf/table.md, table.json).

What runs, per round (rounds interleave the tools, so load changes hit both alike):
* one tritonserver on the demo's draft/target repository (`make demo` builds it) with the frontend;
  the chat flow gets a pass-through chat template (the demo tokenizer has none): a single user message
  renders as its own text, so chat and completions send the same tokens as `bench`;
* `aiperf profile --endpoint-type {completions,chat} --streaming --concurrency {1,4}` with speculation on
  (the repository's K, sent as `num_draft_tokens` through --extra-inputs, so a repository's load-aware
  schedule does not pick another K than the other tools run) and off (`num_draft_tokens: 0`),
  temperature 0, the bench prompts as a `single_turn` dataset (output_length = --max-tokens, sampled
  in order),
  `--use-server-token-count` (token counts from the server's usage) and, for chat (AIPerf 0.13.0 allows
  it there only), `--per-chunk-usage` (the first chunk's real token count in ITL), `--tokenizer` the
  repository's local tokenizer folder (HF_HUB_OFFLINE must NOT be set: AIPerf 0.13.0 then mistakes a
  local folder for a hub id), AIPerf scraping the frontend's
  /metrics (Triton's page, with the engines' trtllm_spec_decode_* series);
* `aiperf profile --endpoint-type template` against Triton's own HTTP generate extension
  (`/v2/models/tensorrt_llm_bls/generate_stream`, no frontend), with a payload template file
  (`text_input`, `max_tokens`, `stream`, `num_draft_tokens`, `temperature`: the BLS's inputs) and
  `response_field: text_output` — the recipe that works on any Triton server, GPU hosts included; token
  counts are AIPerf's own (its tokenizer on the text: Triton's generate answer has no usage);
* `specbuild bench` at the same concurrency on the same prompts (baseline and speculative), its records
  summarised under AIPerf's names (bench/aiperf_export.py: the same definitions).

A flow that fails is reported in the table (its log under build/aiperf/runs/) and the others go on.

The table gives each figure's mean over the rounds and its range (min-max); the machine's load average
is printed with it. Figures from a loaded machine are for comparing the tools, not for quoting.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from specbuild.bench.aiperf_export import run_export
from specbuild.bench.bench import run_bench
from specbuild.bench.options import BenchConfig, load_prompts
from specbuild.core.errors import SpecbuildError
from specbuild.core.pdeathsig import die_with_parent
from specbuild.demo.pipeline import local_server
from specbuild.frontend.run import FrontendOptions, start_frontend
from specbuild.frontend.triton import describe
from specbuild.serve.tritonserver import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_REPO = REPO_ROOT / "build" / "demo" / "draft_target" / "repo"
DEFAULT_PROMPTS = REPO_ROOT / "build" / "demo" / "draft_target" / "bench_prompts.jsonl"
DEFAULT_OUT = REPO_ROOT / "build" / "aiperf"
PASS_THROUGH_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
TEMPLATE = "template"
# AIPerf's template endpoint -> the BLS through Triton's generate_stream (JSON keys = the BLS's input names);
# a file: AIPerf splits an inline k:v template on its commas
PAYLOAD_TEMPLATE = (
    '{{"text_input": {{{{ text|tojson }}}}, "max_tokens": {{{{ max_tokens }}}}, "stream": true, '
    '"temperature": 0.0, "num_draft_tokens": {k}}}'
)
AIPERF_TIMEOUT_S = 900
# (table column, AIPerf tag, how to show it)
COLUMNS = (
    ("TTFT ms", "time_to_first_token", "{:.1f}"),
    ("ITL ms", "inter_token_latency", "{:.2f}"),
    ("latency ms", "request_latency", "{:.0f}"),
    ("out tok/s", "output_token_throughput", "{:.1f}"),
    ("tok/s/user", "output_token_throughput_per_user", "{:.1f}"),
    ("AL", "spec_decode_token_weighted_acceptance_length", "{:.2f}"),
    ("accept %", "spec_decode_overall_draft_acceptance_rate", "{:.1f}"),
)


def aiperf_command(
    aiperf: str,
    *,
    url: str,
    model: str,
    endpoint: str,
    concurrency: int,
    dataset: Path,
    requests: int,
    tokenizer: str,
    num_draft_tokens: int,
    artifacts: Path,
    payload_template: Path | None = None,
) -> list[str]:
    """num_draft_tokens: K sent with every request (0: speculation off); the template's payload carries it."""
    if endpoint == TEMPLATE:  # Triton's generate extension: the template carries every request field
        extra: dict = {"payload_template": str(payload_template), "response_field": "text_output"}
        counting: list[str] = []  # no usage in Triton's answer: AIPerf counts with the tokenizer
    else:
        # K explicit either way: a repository with a load-aware schedule would otherwise pick K by load,
        # and every tool of the table must run the same rounds
        extra = {"temperature": 0, "num_draft_tokens": num_draft_tokens}
        # token counts from the server's usage; per-chunk usage gives ITL the first chunk's real size
        # (AIPerf 0.13.0 injects continuous_usage_stats on the chat endpoint only: it refuses the flag
        # for completions, whose ITL then divides by OSL - 1)
        counting = ["--use-server-token-count"] + (["--per-chunk-usage"] if endpoint == "chat" else [])
    return [
        aiperf,
        "profile",
        "--model",
        model,
        "--url",
        url,
        "--endpoint-type",
        endpoint,
        "--streaming",
        "--concurrency",
        str(concurrency),
        "--request-count",
        str(requests),
        "--input-file",
        str(dataset),
        "--custom-dataset-type",
        "single_turn",
        "--dataset-sampling-strategy",
        "sequential",
        "--tokenizer",
        tokenizer,
        *counting,
        "--extra-inputs",
        json.dumps(extra),  # the JSON form: a k:v list is split on commas
        "--random-seed",
        "0",
        # one worker process and one record processor (they are async: concurrency 4 still overlaps):
        # AIPerf's defaults spawn several, which on a 2-core host starve its own event loop (SSE chunks
        # read late get one timestamp: TTFT inflated, ITL deflated)
        "--workers-max",
        "1",
        "--record-processors",
        "1",
        "--ui-type",
        "none",
        "--artifact-dir",
        str(artifacts),
    ]


def run_aiperf(command: list[str], artifacts: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    shutil.rmtree(artifacts, ignore_errors=True)
    artifacts.mkdir(parents=True)
    with open(artifacts / "aiperf.stdout", "wb") as log:
        done = subprocess.run(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            timeout=AIPERF_TIMEOUT_S,
            preexec_fn=die_with_parent(),
        )
    if done.returncode != 0:
        tail = (artifacts / "aiperf.stdout").read_text(errors="replace")[-3000:]
        raise SpecbuildError(
            f"aiperf exited with {done.returncode}",
            found=tail,
            fix=f"read {artifacts / 'aiperf.stdout'} and the logs/ folder next to it",
        )
    return json.loads((artifacts / "profile_export_aiperf.json").read_text())


def _avg(export: dict, tag: str) -> float | None:
    value = (export.get(tag) or {}).get("avg")
    return float(value) if value is not None else None


def _cell(values: list[float | None], fmt: str) -> str:
    xs = [v for v in values if v is not None]
    if not xs:
        return "-"
    mean = statistics.fmean(xs)
    if len(xs) == 1 or max(xs) == min(xs):
        return fmt.format(mean)
    return f"{fmt.format(mean)} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


def table(results: dict[tuple[str, int, str], list[dict]]) -> str:
    head = "| tool / flow | conc | speculation | " + " | ".join(c for c, _, _ in COLUMNS) + " |"
    rows = [head, "|" + "---|" * (3 + len(COLUMNS))]
    for (tool, concurrency, spec), exports in sorted(
        results.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])
    ):
        cells = [_cell([_avg(e, tag) for e in exports], fmt) for _, tag, fmt in COLUMNS]
        rows.append(f"| {tool} | {concurrency} | {spec} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--aiperf", default=str(REPO_ROOT / ".venv-aiperf" / "bin" / "aiperf"))
    ap.add_argument("--repo", type=Path, default=DEFAULT_REPO)
    ap.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompt-count", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--endpoints", default="completions,chat,template")
    args = ap.parse_args(argv)
    if not Path(args.aiperf).exists():
        print(f"no aiperf at {args.aiperf}: run `make aiperf` (it installs AIPerf 0.13.0 in .venv-aiperf)")
        return 2
    if not (args.repo / "tensorrt_llm_bls").is_dir() or not args.prompts.is_file():
        print(f"no demo repository / prompts ({args.repo}, {args.prompts}): run `make demo` first")
        return 2
    prompts = load_prompts(args.prompts)[: args.prompt_count]
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    endpoints = args.endpoints.split(",")
    args.out.mkdir(parents=True, exist_ok=True)
    dataset = args.out / "dataset.jsonl"
    dataset.write_text(
        "".join(json.dumps({"text": p, "output_length": args.max_tokens}) + "\n" for p in prompts)
    )
    template = args.out / "pass_through.jinja"
    template.write_text(PASS_THROUGH_TEMPLATE)
    results: dict[tuple[str, int, str], list[dict]] = {}
    loads = [os.getloadavg()[0]]
    started = time.monotonic()
    failed: dict[tuple[str, int, str], str] = {}
    with local_server(args.repo) as server:  # started (every model READY) on entry
        opts = server.options
        metrics_url = f"http://{opts.host}:{opts.metrics_port}/metrics"
        frontend = start_frontend(
            server.grpc_url,
            FrontendOptions(
                port=free_port(), chat_template=template, metrics_url=metrics_url, repo=args.repo
            ),
            default_name=args.repo.resolve().parent.name,
        )
        try:
            tokenizer = describe(server.grpc_url).tokenizer_dir
            base_url = frontend.url.removesuffix("/v1")
            http = f"http://{opts.host}:{opts.http_port}"
            k = describe(server.grpc_url).loop_k or 0
            for round_ in range(args.rounds):
                for c in concurrencies:
                    for endpoint in endpoints:
                        for spec in (False, True):
                            label = f"{endpoint}-c{c}-{'on' if spec else 'off'}-r{round_}"
                            print(f"[{time.monotonic() - started:6.0f} s] aiperf {label}", flush=True)
                            key = (f"AIPerf {endpoint}", c, "on" if spec else "off")
                            artifacts = args.out / "runs" / label
                            payload = None
                            url = base_url
                            if endpoint == TEMPLATE:
                                payload = args.out / f"triton_generate_k{k if spec else 0}.json"
                                payload.write_text(PAYLOAD_TEMPLATE.format(k=k if spec else 0) + "\n")
                                url = f"{http}/v2/models/tensorrt_llm_bls/generate_stream"
                            command = aiperf_command(
                                args.aiperf,
                                url=url,
                                model=frontend.model if endpoint != TEMPLATE else "tensorrt_llm_bls",
                                endpoint=endpoint,
                                concurrency=c,
                                dataset=dataset,
                                requests=len(prompts),
                                tokenizer=tokenizer,
                                num_draft_tokens=k if spec else 0,
                                artifacts=artifacts,
                                payload_template=payload,
                            )
                            try:
                                export = run_aiperf(command, artifacts)
                            except SpecbuildError as exc:
                                print(
                                    f"  failed: {exc.what} (log: {artifacts / 'aiperf.stdout'})", flush=True
                                )
                                failed[key] = str(artifacts / "aiperf.stdout")
                                continue
                            results.setdefault(key, []).append(export)
                            loads.append(os.getloadavg()[0])
                    print(
                        f"[{time.monotonic() - started:6.0f} s] specbuild bench c={c} round {round_}",
                        flush=True,
                    )
                    config = BenchConfig(
                        url=server.grpc_url,
                        prompts=prompts,
                        concurrency=(c,),
                        temperatures=(0.0,),
                        max_tokens=args.max_tokens,
                        metrics_url=metrics_url,
                        unary_baseline=False,  # AIPerf streams: compare streamed runs only
                    )
                    runs, context = run_bench(config)
                    for run in runs:
                        k = run.num_draft_tokens or None
                        export = run_export(run.records, duration_s=run.duration_s, num_spec_tokens=k)
                        spec = "on" if run.mode == "speculative" else "off"
                        results.setdefault(("specbuild bench", c, spec), []).append(export)
                    loads.append(os.getloadavg()[0])
        finally:
            frontend.stop()
    text = table(results)
    if failed:
        text += "\n\nfailed flows: " + "; ".join(
            f"{t} c={c} {sp}: {log}" for (t, c, sp), log in failed.items()
        )
    load = f"load average (1 min) during the runs: {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} CPUs"
    summary = {
        "table": text,
        "load": load,
        "rounds": args.rounds,
        "prompts": len(prompts),
        "max_tokens": args.max_tokens,
        "results": {f"{t}|{c}|{s}": v for (t, c, s), v in results.items()},
        "failed": {f"{t}|{c}|{s}": v for (t, c, s), v in failed.items()},
    }
    (args.out / "table.json").write_text(json.dumps(summary, indent=2) + "\n")
    (args.out / "table.md").write_text(text + "\n\n" + load + "\n")
    print(text)
    print(load)
    return 0


if __name__ == "__main__":
    sys.exit(main())
