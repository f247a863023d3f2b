"""Benchmark of `convert_checkpoint` (run by `make bench-convert`; not a timed test).

Writes a random Llama-shaped bfloat16 checkpoint of >= 1 GB (two shards + index, straight with
safetensors, no transformers model), then measures, in interleaved rounds (copy then convert, the
order reversed every other round, so a load change hits both alike):
* throughput: each round's ratio = plain copy time of the input files / conversion time (with the
  sha256 of every output file the manifest records); the median and the spread of the rounds
  (goal: median >= 0.8). For scale, two floors, each with the best ratio it allows: the sha256 floor
  (a file's sha256 is sequential: the largest rank file / one thread's sha256 rate, from memory) and
  the CPU floor (every output byte is hashed and put in the page cache, as the copy puts its bytes:
  output bytes x (1 / sha256 rate + the copy's CPU per byte), spread over min(cores, rank files));
* peak RSS of the converting process (a fresh interpreter, VmHWM) against the largest tensor and the
  interpreter's own baseline after imports (goal: peak < baseline + 3 x largest tensor).
Files go under build/bench_convert/ (removed afterwards unless --keep).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from specbuild.core.pdeathsig import die_with_parent

# Llama-shaped (TinyLlama-like widths, GQA 32/4 heads); 9 layers ~ 1.07 GB at bfloat16.
SHAPE = {"hidden": 2048, "inter": 5632, "heads": 32, "kv_heads": 4, "vocab": 32000, "layers": 9}


def make_checkpoint(folder: Path, *, layers: int, seed: int = 0) -> tuple[int, int]:
    """Write config.json + 2 shards + index; returns (total bytes of tensors, largest tensor bytes)."""
    s = SHAPE
    hd = s["hidden"] // s["heads"]
    folder.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)

    def layer(i: int) -> dict:
        p = f"model.layers.{i}."
        h, kv, inter = s["hidden"], s["kv_heads"] * hd, s["inter"]
        return {
            p + "input_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
            p + "post_attention_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
            p + "self_attn.q_proj.weight": rand(h, h),
            p + "self_attn.k_proj.weight": rand(kv, h),
            p + "self_attn.v_proj.weight": rand(kv, h),
            p + "self_attn.o_proj.weight": rand(h, h),
            p + "mlp.gate_proj.weight": rand(inter, h),
            p + "mlp.up_proj.weight": rand(inter, h),
            p + "mlp.down_proj.weight": rand(h, inter),
        }

    half = layers // 2
    shards = [
        {
            "model.embed_tokens.weight": rand(s["vocab"], s["hidden"]),
            **{k: v for i in range(half) for k, v in layer(i).items()},
        },
        {
            **{k: v for i in range(half, layers) for k, v in layer(i).items()},
            "model.norm.weight": torch.ones(s["hidden"], dtype=torch.bfloat16),
            "lm_head.weight": rand(s["vocab"], s["hidden"]),
        },
    ]
    weight_map, total, largest = {}, 0, 0
    for n, shard in enumerate(shards):
        name = f"model-{n + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, folder / name, metadata={"format": "pt"})
        for k, t in shard.items():
            weight_map[k] = name
            total += t.numel() * t.element_size()
            largest = max(largest, t.numel() * t.element_size())
        del shard
    shards.clear()
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    )
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": s["vocab"],
        "hidden_size": s["hidden"],
        "intermediate_size": s["inter"],
        "num_hidden_layers": layers,
        "num_attention_heads": s["heads"],
        "num_key_value_heads": s["kv_heads"],
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
    }
    (folder / "config.json").write_text(json.dumps(config))
    return total, largest


def cpu_seconds() -> float:
    """User + system CPU time of this process so far, every thread's (the kernel's copying included)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def copy_time(src: Path, dst: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of a plain copy of the files of `src` (shutil.copyfile: in the kernel)."""
    dst.mkdir(parents=True)
    os.sync()  # start from clean page cache writeback, like the conversion run
    t0, c0 = time.perf_counter(), cpu_seconds()
    for f in sorted(src.iterdir()):
        shutil.copyfile(f, dst / f.name)
    return time.perf_counter() - t0, cpu_seconds() - c0


def hash_rate(nbytes: int = 256 << 20, chunk: int = 1 << 20, tries: int = 3) -> float:
    """One thread's sha256 rate in bytes/s over a buffer in memory, in the writer's chunks: the best
    of `tries` (the least disturbed by other load)."""
    data = memoryview(os.urandom(nbytes))
    best = 0.0
    for _ in range(tries):
        digest, t0 = hashlib.sha256(), time.perf_counter()
        for pos in range(0, nbytes, chunk):
            digest.update(data[pos : pos + chunk])
        best = max(best, nbytes / (time.perf_counter() - t0))
    return best


def spread(values: list[float]) -> str:
    ordered = sorted(values)
    mid = statistics.median(ordered)
    return f"median {mid:.2f} (min {ordered[0]:.2f}, max {ordered[-1]:.2f}, n={len(ordered)})"


def child(src: str, out: str, tp: int) -> None:
    """Runs in a fresh interpreter: baseline RSS after imports, then convert, then peak RSS.

    Peak = VmHWM of /proc/self/status: unlike ru_maxrss it is not inherited from the parent that
    spawned this process (the parent held the generated tensors)."""
    # The baseline is the RSS after exactly the imports a conversion needs, so they happen here.
    import psutil  # noqa: PLC0415
    import safetensors.torch  # noqa: F401, PLC0415
    import torch  # noqa: F401, PLC0415

    from specbuild.engines.trtllm.convert import convert_checkpoint  # noqa: PLC0415

    baseline = psutil.Process().memory_info().rss
    os.sync()
    t0, c0 = time.perf_counter(), cpu_seconds()
    convert_checkpoint(src, out, tp_size=tp)
    seconds, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    status = Path("/proc/self/status").read_text().splitlines()
    peak = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) * 1024  # kB
    print(json.dumps({"seconds": seconds, "cpu": cpu, "baseline_rss": baseline, "peak_rss": peak}))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, default=Path("build/bench_convert"))
    ap.add_argument("--layers", type=int, default=SHAPE["layers"])
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=6, help="interleaved copy/convert rounds")
    ap.add_argument("--keep", action="store_true", help="keep the generated checkpoint (for --reuse)")
    ap.add_argument("--reuse", action="store_true", help="reuse a checkpoint kept by an earlier --keep run")
    ap.add_argument("--child", nargs=3, metavar=("SRC", "OUT", "TP"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]))
        return 0
    work = args.workdir
    src = work / "hf"
    shutil.rmtree(work / "copy", ignore_errors=True)
    shutil.rmtree(work / "ckpt", ignore_errors=True)
    if args.reuse and (src / "config.json").is_file():
        largest = SHAPE["vocab"] * SHAPE["hidden"] * 2  # embedding / lm_head, bfloat16
    else:
        shutil.rmtree(work, ignore_errors=True)
        print(
            f"generating a Llama-shaped bfloat16 checkpoint ({args.layers} layers) in {src} ...", flush=True
        )
        _, largest = make_checkpoint(src, layers=args.layers)
    input_bytes = sum(f.stat().st_size for f in src.iterdir())
    copies, copy_cpu, runs = [], [], []

    def copy_round() -> None:
        shutil.rmtree(work / "copy", ignore_errors=True)
        wall, cpu = copy_time(src, work / "copy")
        copies.append(wall)
        copy_cpu.append(cpu)

    def convert_round() -> None:
        shutil.rmtree(work / "ckpt", ignore_errors=True)
        cmd = [sys.executable, "-m", "lab.benchmarks.convert", "--child", str(src), str(work / "ckpt")]
        proc = subprocess.run(
            [*cmd, str(args.tp)], check=True, capture_output=True, text=True, preexec_fn=die_with_parent()
        )
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))

    for n in range(args.rounds):  # interleaved, the order reversed every other round
        for step in (copy_round, convert_round) if n % 2 == 0 else (convert_round, copy_round):
            step()
    ratios = [c / r["seconds"] for c, r in zip(copies, runs, strict=True)]  # each round's own pair
    output_bytes = sum(f.stat().st_size for f in (work / "ckpt").iterdir())
    ranks = [f.stat().st_size for f in (work / "ckpt").glob("rank*.safetensors")]
    files = len(ranks)
    rate = hash_rate()
    threads = min(os.cpu_count() or 1, files)
    sha_floor = max(ranks) / rate  # the largest file's sha256, one thread
    write_cpu = statistics.median(copy_cpu) / input_bytes  # CPU s per byte put in the page cache
    cpu_floor = output_bytes * (1 / rate + write_cpu) / threads
    peak = max(r["peak_rss"] for r in runs)
    baseline = min(r["baseline_rss"] for r in runs)
    over = peak - baseline
    gb = 1e9
    median = statistics.median(ratios)
    print(
        f"input: {input_bytes / gb:.2f} GB in {len(list(src.glob('*.safetensors')))} shards, largest tensor "
        f"{largest / 1e6:.0f} MB; output tp={args.tp}: {output_bytes / gb:.2f} GB in {files} rank files"
    )
    print(f"rounds: copy {' '.join(f'{c:.2f}' for c in copies)} s")
    seconds = [r["seconds"] for r in runs]
    print(f"        convert {' '.join(f'{t:.2f}' for t in seconds)} s")
    print(f"copy:    {spread(copies)} s  ({input_bytes / gb / statistics.median(copies):.2f} GB/s)")
    print(f"convert: {spread(seconds)} s  (incl. the sha256 of every output file)")
    print(
        f"CPU (every thread, kernel included): copy {spread(copy_cpu)} s, "
        f"convert {spread([r['cpu'] for r in runs])} s"
    )
    print(
        f"ratio copy/convert per round: {spread(ratios)}  (goal median >= 0.8) "
        f"{'OK' if median >= 0.8 else 'MISSED'}"
    )
    copy_median = statistics.median(copies)
    print(
        f"sha256 floor: largest rank file {max(ranks) / gb:.2f} GB at {rate / gb:.2f} GB/s (one thread, "
        f"from memory) = {sha_floor:.2f} s: a ratio of at most {copy_median / sha_floor:.2f}"
    )
    print(
        f"CPU floor: {output_bytes / gb:.2f} GB x ({1 / rate * gb:.2f} s/GB sha256 + {write_cpu * gb:.2f} "
        f"s/GB into the page cache, the copy's) on {threads} thread(s) of {os.cpu_count()} cores = "
        f"{cpu_floor:.2f} s: a ratio of at most {copy_median / cpu_floor:.2f} (before the NaN/Inf check "
        f"and the assembling)"
    )
    print(
        f"peak RSS {peak / 1e6:.0f} MB = baseline {baseline / 1e6:.0f} MB + {over / 1e6:.0f} MB "
        f"= baseline + {over / largest:.2f} x largest tensor  (goal < 3) "
        f"{'OK' if over < 3 * largest else 'MISSED'}"
    )
    shutil.rmtree(work / "copy", ignore_errors=True)
    shutil.rmtree(work / "ckpt", ignore_errors=True)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
