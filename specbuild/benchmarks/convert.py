"""Benchmark of `convert_checkpoint` (run by `make bench-convert`; not a timed test).

Writes a random Llama-shaped bfloat16 checkpoint of >= 1 GB (two shards + index, straight with
safetensors, no transformers model), then measures:
* throughput: the conversion's time against a plain copy of the same input files (ratio = copy time /
  convert time; goal >= 0.5), and, for scale, against a copy plus the sha256 that a manifest needs;
* peak RSS of the converting process (a fresh interpreter, ru_maxrss) against the largest tensor and
  the interpreter's own baseline after imports (goal: peak < baseline + 3 x largest tensor).
Files go under build/bench_convert/ (removed afterwards unless --keep).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from specbuild.core.manifest import sha256_file
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


def copy_time(src: Path, dst: Path) -> float:
    dst.mkdir(parents=True)
    os.sync()  # start from clean page cache writeback, like the conversion run
    t0 = time.perf_counter()
    for f in sorted(src.iterdir()):
        shutil.copyfile(f, dst / f.name)
    return time.perf_counter() - t0


def hash_time(folder: Path) -> float:
    """sha256 of every file (what a manifest costs on top of a copy)."""
    t0 = time.perf_counter()
    for f in sorted(folder.iterdir()):
        sha256_file(f)
    return time.perf_counter() - t0


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
    t0 = time.perf_counter()
    convert_checkpoint(src, out, tp_size=tp)
    seconds = time.perf_counter() - t0
    status = Path("/proc/self/status").read_text().splitlines()
    peak = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) * 1024  # kB
    print(json.dumps({"seconds": seconds, "baseline_rss": baseline, "peak_rss": peak}))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, default=Path("build/bench_convert"))
    ap.add_argument("--layers", type=int, default=SHAPE["layers"])
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="copy/convert rounds (best of each is reported)")
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
    copies, runs = [], []
    for _ in range(args.rounds):  # copy and convert alternate, so load changes hit both alike
        shutil.rmtree(work / "copy", ignore_errors=True)
        copies.append(copy_time(src, work / "copy"))
        shutil.rmtree(work / "ckpt", ignore_errors=True)
        cmd = [
            sys.executable,
            "-m",
            "specbuild.benchmarks.convert",
            "--child",
            str(src),
            str(work / "ckpt"),
            str(args.tp),
        ]
        proc = subprocess.run(cmd, check=True, capture_output=True, text=True, preexec_fn=die_with_parent())
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    copy_s = min(copies)  # the best of each: the least disturbed run
    hash_s = hash_time(work / "copy")
    res = {
        "seconds": min(r["seconds"] for r in runs),
        "peak_rss": max(r["peak_rss"] for r in runs),
        "baseline_rss": min(r["baseline_rss"] for r in runs),
    }
    output_bytes = sum(f.stat().st_size for f in (work / "ckpt").iterdir())
    gb = 1e9
    ratio = copy_s / res["seconds"]
    over = res["peak_rss"] - res["baseline_rss"]
    print(
        f"input: {input_bytes / gb:.2f} GB in {len(list(src.glob('*.safetensors')))} shards, largest tensor "
        f"{largest / 1e6:.0f} MB; output tp={args.tp}: {output_bytes / gb:.2f} GB"
    )
    conv = " ".join(f"{r['seconds']:.2f}" for r in runs)
    print(f"rounds: copy {' '.join(f'{c:.2f}' for c in copies)} s; convert {conv} s")
    print(f"copy:    {copy_s:6.2f} s  {input_bytes / gb / copy_s:6.2f} GB/s")
    print(
        f"convert: {res['seconds']:6.2f} s  {input_bytes / gb / res['seconds']:6.2f} GB/s  (incl. sha256 "
        "manifest)"
    )
    print(f"throughput ratio convert/copy: {ratio:.2f}  (goal >= 0.5) {'OK' if ratio >= 0.5 else 'MISSED'}")
    print(
        f"for scale: sha256 of the copied files alone takes {hash_s:.2f} s; ratio against copy + sha256: "
        f"{(copy_s + hash_s) / res['seconds']:.2f}"
    )
    print(
        f"peak RSS {res['peak_rss'] / 1e6:.0f} MB = baseline {res['baseline_rss'] / 1e6:.0f} MB + "
        f"{over / 1e6:.0f} MB "
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
