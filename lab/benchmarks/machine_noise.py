"""How much this machine's own speed drifts: one fixed piece of single-thread work, timed over and over.

The load benches compare two modes run one after the other; on a shared (virtual) machine the time the
same work takes moves by itself, and no bench can resolve a difference smaller than that drift. This
probe times the same float32 matrix product in chunks for `--seconds` and reports, for runs of 1, 4 and
16 chunks, the coefficient of variation of their times and the spread of the ratio of one run to the
next (what an A/B comparison of two back-to-back runs of equal work would see). `bench --aa-baseline`
measures the same thing through the server (two runs of the one-call baseline per round).

    python -m lab.benchmarks.machine_noise [--seconds 40] [--out build/machine_noise.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

BLOCKS = (1, 4, 16)  # chunks per run
SIZE = (512, 512, 2048)  # [m, k] @ [k, n]: about 20 ms single-threaded on this build machine
PRODUCTS_PER_CHUNK = 20


def spread(times: list[float], block: int) -> dict[str, float] | None:
    """Runs of `block` consecutive chunks: their count, mean seconds, coefficient of variation, and the
    median and extremes of |1 - ratio| of each run to the next (None: fewer than two runs)."""
    runs = [sum(times[i : i + block]) for i in range(0, len(times) - block + 1, block)]
    if len(runs) < 2:
        return None
    mean = statistics.mean(runs)
    ratios = [b / a for a, b in zip(runs[:-1], runs[1:], strict=True)]
    off = sorted(abs(1 - r) for r in ratios)
    return {
        "runs": len(runs),
        "run_s": mean,
        "cv": statistics.pstdev(runs) / mean,
        "next_over_this_min": min(ratios),
        "next_over_this_max": max(ratios),
        "abs_diff_median": statistics.median(off),
        "abs_diff_p90": off[min(len(off) - 1, int(0.9 * len(off)))],
    }


def measure(seconds: float) -> list[float]:
    """Seconds per chunk of PRODUCTS_PER_CHUNK equal matrix products, one thread, for `seconds`."""
    import torch  # noqa: PLC0415 - the probe's one heavy import

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each served engine process (tensorrt_llm_local: SPECBUILD_TORCH_THREADS)
    try:
        m, k, n = SIZE
        a, b = torch.randn(m, k), torch.randn(k, n)
        times, end = [], time.perf_counter() + seconds
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            for _ in range(PRODUCTS_PER_CHUNK):
                a @ b
            times.append(time.perf_counter() - t0)
        return times
    finally:
        torch.set_num_threads(threads)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--out", type=Path, default=Path("build/machine_noise.json"))
    args = parser.parse_args(argv)
    times = measure(args.seconds)
    result = {"seconds": args.seconds, "chunks": len(times), "blocks": {b: spread(times, b) for b in BLOCKS}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{len(times)} chunks of the same work in {args.seconds:g} s")
    for block, s in result["blocks"].items():
        if s:
            print(
                f"  runs of {block:2d} chunks ({s['run_s']:.2f} s): cv {s['cv']:.3f}; next / this "
                f"{s['next_over_this_min']:.2f}-{s['next_over_this_max']:.2f}, |1 - ratio| median "
                f"{s['abs_diff_median']:.3f}, p90 {s['abs_diff_p90']:.3f}"
            )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
