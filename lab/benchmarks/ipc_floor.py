"""The Python backend's own cost per call on this machine, independent of specbuild (bench-serve `--floor`).

A repository of three Python models (floor_models/): `floor_caller`, a decoupled BLS-style model that
times each piece of a speculative BLS round, and `floor_draft` / `floor_target`, no-op models served
with the config.pbtxt of the real repository's `tensorrt_llm_draft` / `tensorrt_llm` (same tensor
table, batching and instance count; the model answers zeros at once). What a piece costs there is the
floor any Python-backend BLS pays on this machine: the stub -> server -> stub hops of
`InferenceRequest.exec`, of a streamed response, of a cancellation ask, and the `pb_utils.Tensor`
objects a call's inputs need. No engine, tokenizer or specbuild module runs inside the server.

    python -m lab.benchmarks.ipc_floor REPO [--calls 200] [--prompt-len 40] [--draft-len 4]

REPO: a draft/target repository (bench-serve's); its two engine configs are copied.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import threading
from pathlib import Path

import numpy as np
import torch
import tritonclient.grpc as grpcclient

from lab.benchmarks.floor_models_probe import PIECES as PROBE_PIECES
from lab.benchmarks.floor_models_probe import time_engine_pieces
from specbuild.demo.pipeline import local_server
from specbuild.engines.reference.engine import ReferenceEngine

MODELS = Path(__file__).with_name("floor_models")
PIECES = ("build", "draft", "target", "send", "cancel")  # = floor_models/caller.py PIECES
CALLEES = {"floor_draft": "tensorrt_llm_draft", "floor_target": "tensorrt_llm"}
CALLER_CONFIG = """name: "floor_caller"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [
  { name: "calls", data_type: TYPE_INT32, dims: [ 1 ] },
  { name: "prompt_len", data_type: TYPE_INT32, dims: [ 1 ] },
  { name: "draft_len", data_type: TYPE_INT32, dims: [ 1 ] }
]
output [
  { name: "timings_ns", data_type: TYPE_INT64, dims: [ -1 ] },
  { name: "text_output", data_type: TYPE_STRING, dims: [ -1 ] },
  { name: "output_ids", data_type: TYPE_INT32, dims: [ -1, -1, -1 ] },
  { name: "sequence_length", data_type: TYPE_INT32, dims: [ -1, -1 ] }
]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""


PROBE_CONFIG = """name: "probe_engine"
backend: "python"
max_batch_size: 0
input [
  { name: "reps", data_type: TYPE_INT32, dims: [ 1 ] },
  { name: "prompt_len", data_type: TYPE_INT32, dims: [ 1 ] },
  { name: "draft_len", data_type: TYPE_INT32, dims: [ 1 ] },
  { name: "max_tokens", data_type: TYPE_INT32, dims: [ 1 ] }
]
output [ { name: "timings_ns", data_type: TYPE_INT64, dims: [ -1 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
parameters { key: "reference_engine", value: { string_value: "%s" } }
"""


def build_floor_repo(real_repo: Path, out: Path, *, engine_build: Path | None = None) -> Path:
    """The floor repository in OUT (replaced), from REAL_REPO's engine model configs; with ENGINE_BUILD
    also `probe_engine` (floor_models/engine_probe.py), the reference engine of that build in a stub."""
    if out.exists():
        shutil.rmtree(out)
    for name, source in CALLEES.items():
        config = (real_repo / source / "config.pbtxt").read_text()
        config, found = re.subn(r'^name: "[^"]*"', f'name: "{name}"', config, count=1, flags=re.M)
        if not found:
            raise ValueError(f"{real_repo / source / 'config.pbtxt'}: no name line")
        (out / name / "1").mkdir(parents=True)
        (out / name / "config.pbtxt").write_text(config)
        shutil.copy(MODELS / "noop.py", out / name / "1" / "model.py")
    (out / "floor_caller" / "1").mkdir(parents=True)
    (out / "floor_caller" / "config.pbtxt").write_text(CALLER_CONFIG)
    shutil.copy(MODELS / "caller.py", out / "floor_caller" / "1" / "model.py")
    if engine_build is not None:
        if '"' in str(engine_build) or "\\" in str(engine_build):
            raise ValueError(
                f"{engine_build}: a build path with quotes or backslashes cannot go in config.pbtxt"
            )
        (out / "probe_engine" / "1").mkdir(parents=True)
        (out / "probe_engine" / "config.pbtxt").write_text(PROBE_CONFIG % engine_build)
        shutil.copy(MODELS / "engine_probe.py", out / "probe_engine" / "1" / "model.py")
    return out


def engine_probe(
    url: str,
    engine_build: Path,
    *,
    rounds: int = 3,
    reps: int = 10,
    prompt_len: int = 40,
    draft_len: int = 4,
    max_tokens: int = 32,
) -> dict:
    """The same engine work inside a stub (probe_engine) and in this process, interleaved `rounds` times
    (reps each): piece -> {stub_ms, in_process_ms (medians), stub_over_in_process}."""
    engine = ReferenceEngine.load(engine_build)
    kw = {"prompt_len": prompt_len, "draft_len": draft_len, "max_tokens": max_tokens}
    stub: dict[str, list[int]] = {piece: [] for piece in PROBE_PIECES}
    local: dict[str, list[int]] = {piece: [] for piece in PROBE_PIECES}
    time_engine_pieces(engine, reps=2, **kw)  # warm-up (the stub warms in its first round's first reps)
    client = grpcclient.InferenceServerClient(url)
    try:
        for _ in range(rounds):
            inputs = []
            for name, value in (("reps", reps), *kw.items()):
                tensor = grpcclient.InferInput(name, [1], "INT32")
                tensor.set_data_from_numpy(np.array([value], dtype=np.int32))
                inputs.append(tensor)
            flat = client.infer("probe_engine", inputs, client_timeout=600).as_numpy("timings_ns")
            for i, piece in enumerate(PROBE_PIECES):
                stub[piece] += [int(t) for t in flat[i * reps : (i + 1) * reps]]
            for piece, values in time_engine_pieces(engine, reps=reps, **kw).items():
                local[piece] += values
    finally:
        client.close()
    out = {"rounds": rounds, "reps": reps, **kw}
    for piece in PROBE_PIECES:
        s_ms = statistics.median(stub[piece][2:]) / 1e6  # the stub's first reps warm it up
        l_ms = statistics.median(local[piece]) / 1e6
        out[piece] = {
            "stub_ms": round(s_ms, 3),
            "in_process_ms": round(l_ms, 3),
            "stub_over_in_process": round(s_ms / l_ms, 3),
        }
    return out


def time_pieces(url: str, *, calls: int, prompt_len: int, draft_len: int) -> dict[str, list[int]]:
    """One floor_caller request over gRPC (a stream, as the BLS is decoupled): piece -> ns per call."""
    done, got = threading.Event(), {}

    def callback(result, error):  # tritonclient passes both by keyword
        if error is not None:
            got["error"] = error
            done.set()
            return
        timings = result.as_numpy("timings_ns")
        if timings is not None:
            got["timings"] = timings
            done.set()

    client = grpcclient.InferenceServerClient(url)
    try:
        inputs = []
        for name, value in (("calls", calls), ("prompt_len", prompt_len), ("draft_len", draft_len)):
            tensor = grpcclient.InferInput(name, [1], "INT32")
            tensor.set_data_from_numpy(np.array([value], dtype=np.int32))
            inputs.append(tensor)
        client.start_stream(callback=callback)
        client.async_stream_infer(
            "floor_caller", inputs, outputs=[grpcclient.InferRequestedOutput("timings_ns")]
        )
        if not done.wait(timeout=30 + calls):
            raise TimeoutError("floor_caller did not answer")
        client.stop_stream()
    finally:
        client.close()
    if "error" in got:
        raise RuntimeError(f"floor_caller: {got['error']}")
    flat = got["timings"].reshape(len(PIECES), calls)
    return {piece: [int(t) for t in flat[i]] for i, piece in enumerate(PIECES)}


def callee_stats(url: str) -> dict[str, dict[str, float]]:
    """The no-op models' own time per call in Triton's statistics (what bench-serve's breakdown counts
    as a draft / target call's time in Triton): queue + compute, and compute_infer alone (the stub's
    execute and the server <-> stub hops around it)."""
    client = grpcclient.InferenceServerClient(url)
    out = {}
    try:
        for name in CALLEES:
            stats = client.get_inference_statistics(name, as_json=True)["model_stats"][0]["inference_stats"]
            n = max(int(stats["success"].get("count", 0)), 1)
            out[name] = {
                "calls": n,
                "total_ms": round(int(stats["success"].get("ns", 0)) / n / 1e6, 4),
                "compute_infer_ms": round(int(stats["compute_infer"].get("ns", 0)) / n / 1e6, 4),
            }
    finally:
        client.close()
    return out


def summarize(times: dict[str, list[int]], *, skip: int = 10) -> dict[str, dict[str, float]]:
    """piece -> {median_ms, mean_ms, p10_ms, p90_ms} over the calls after the first `skip` (warm-up)."""
    out = {}
    for piece, values in times.items():
        kept = sorted(values[skip:] if len(values) > skip else values)
        out[piece] = {
            "median_ms": round(statistics.median(kept) / 1e6, 4),
            "mean_ms": round(statistics.fmean(kept) / 1e6, 4),  # comparable with Triton's statistics (sums)
            "p10_ms": round(kept[len(kept) // 10] / 1e6, 4),
            "p90_ms": round(kept[(len(kept) * 9) // 10] / 1e6, 4),
        }
    return out


def round_floor_ms(summary: dict[str, dict[str, float]], *, cancel_asks: int, sends: int) -> float:
    """The floor of one speculative BLS round: its two engine calls, `sends` streamed responses and
    `cancel_asks` cancellation asks, each at its median, plus building the tensors of the two calls."""
    m = {piece: summary[piece]["median_ms"] for piece in PIECES}
    return round(2 * m["build"] + m["draft"] + m["target"] + sends * m["send"] + cancel_asks * m["cancel"], 3)


def measure(
    real_repo: Path,
    out: Path,
    *,
    calls: int,
    prompt_len: int,
    draft_len: int,
    engine_build: Path | None = None,
) -> dict:
    repo = build_floor_repo(real_repo, out, engine_build=engine_build)
    probe = None
    with local_server(repo) as server:
        times = time_pieces(server.grpc_url, calls=calls, prompt_len=prompt_len, draft_len=draft_len)
        callee = callee_stats(server.grpc_url)
        if engine_build is not None:
            probe = engine_probe(server.grpc_url, engine_build, prompt_len=prompt_len, draft_len=draft_len)
    summary = summarize(times)
    return {
        "engine_probe": probe,
        "calls": calls,
        "prompt_len": prompt_len,
        "draft_len": draft_len,
        "pieces": summary,
        "callee_per_call_ms": callee,
        "note": "ms per piece inside a Python-backend BLS-style model calling no-op models (no specbuild)",
    }


def format_floor(result: dict) -> list[str]:
    lines = [
        f"Python-backend floor ({result['calls']} calls, L={result['prompt_len']}, k={result['draft_len']}):"
    ]
    for piece, row in result["pieces"].items():
        lines.append(
            f"  {piece:7s} {row['median_ms']:7.3f} ms  (p10 {row['p10_ms']:.3f}, p90 {row['p90_ms']:.3f}, "
            f"mean {row['mean_ms']:.3f})"
        )
    probe = result.get("engine_probe")
    for piece in PROBE_PIECES if probe else ():
        row = probe[piece]
        lines.append(
            f"  engine work '{piece}' in a stub {row['stub_ms']:.3f} ms vs in-process "
            f"{row['in_process_ms']:.3f} ms (x{row['stub_over_in_process']:.3f})"
        )
    for name, row in result.get("callee_per_call_ms", {}).items():
        lines.append(
            f"  {name} in Triton's statistics: {row['total_ms']:.3f} ms a call "
            f"(compute_infer {row['compute_infer_ms']:.3f}; {row['calls']} calls)"
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m lab.benchmarks.ipc_floor", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("repo", type=Path, help="a draft/target repository (its engine configs are copied)")
    parser.add_argument("--out", type=Path, default=Path("build/ipc-floor"), help="floor repository folder")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--prompt-len", type=int, default=40)
    parser.add_argument("--draft-len", type=int, default=4)
    parser.add_argument(
        "--engine-build", type=Path, default=None, help="also time this build's engine inside a stub vs here"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("SPECBUILD_TORCH_THREADS", "1")))  # = the served default
    os.environ["SPECBUILD_TORCH_THREADS"] = str(torch.get_num_threads())
    result = measure(
        args.repo,
        args.out.resolve() / "repo",
        calls=args.calls,
        prompt_len=args.prompt_len,
        draft_len=args.draft_len,
        engine_build=args.engine_build.resolve() if args.engine_build else None,
    )
    print("\n".join(format_floor(result)))
    (args.out / "ipc_floor.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
