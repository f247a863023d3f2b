"""`make test-isa`: the numeric tests under every CPU kernel family this machine can run.

Float32 results differ in the last bits between the code paths the CPU libraries pick by machine
(oneMKL GEMM, oneDNN, ATen's vectorized kernels for AVX2 / AVX-512 / AMX). CI may run on another
x86 than the developer's, so the numeric tests (pytest marker `numeric`) must pass on every path.
This runner:

1. reads the CPU's flags (/proc/cpuinfo) and keeps the settings it can run: asking ATen for AVX-512
   on a CPU without it dies of SIGILL, and oneDNN / MKL never go above what the CPU has;
2. fingerprints each setting with a probe (bits of a GEMM, softmax/SiLU, an SDPA, a bf16 matmul
   and a convolution) and reports which settings really select other kernels than the default here;
3. runs `pytest -m numeric` once per setting and fails if any run fails.

Settings: the default; ATEN_CPU_CAPABILITY=default|avx2|avx512 (ATen's own vectorized kernels);
ONEDNN_MAX_CPU_ISA=SSE41|AVX2|AVX512_CORE (oneDNN's ceiling); MKL_CBWR=COMPATIBLE (oneMKL's
reproducible, ISA-independent GEMM path) and, on AVX-512 CPUs, MKL_ENABLE_INSTRUCTIONS=AVX2.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROBE = r"""
import hashlib, json, numpy as np, torch
torch.set_num_threads(1)
rng = np.random.default_rng(0)
def t(*shape):  # inputs from numpy: identical bits under every setting
    return torch.from_numpy(rng.standard_normal(shape).astype(np.float32))
a, b, x = t(64, 256), t(256, 300), t(64, 300)
q = t(1, 4, 16, 64)
w = t(16, 8, 3, 3)
img = t(2, 8, 12, 12)
out = {
    "gemm (MKL)": a @ b,
    "softmax/silu (ATen)": torch.cat([torch.softmax(x, -1), torch.nn.functional.silu(x)]),
    "sdpa (ATen)": torch.nn.functional.scaled_dot_product_attention(q, q, q),
    "bf16 matmul": (a.bfloat16() @ b.bfloat16()).float(),
    "conv (oneDNN)": torch.nn.functional.conv2d(img, w),
}
print(json.dumps({k: hashlib.sha256(v.contiguous().numpy().tobytes()).hexdigest()[:12] for k, v in out.items()}
                 | {"capability": torch.backends.cpu.get_cpu_capability()}))
"""


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def settings(flags: set[str]) -> list[tuple[str, dict[str, str]]]:
    avx2 = "avx2" in flags and "fma" in flags
    avx512 = {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags
    out: list[tuple[str, dict[str, str]]] = [("default", {}), ("ATEN_CPU_CAPABILITY=default", {"ATEN_CPU_CAPABILITY": "default"})]
    if avx2:
        out.append(("ATEN_CPU_CAPABILITY=avx2", {"ATEN_CPU_CAPABILITY": "avx2"}))
    if avx512:
        out.append(("ATEN_CPU_CAPABILITY=avx512", {"ATEN_CPU_CAPABILITY": "avx512"}))
    out.append(("ONEDNN_MAX_CPU_ISA=SSE41", {"ONEDNN_MAX_CPU_ISA": "SSE41"}))
    if avx2:
        out.append(("ONEDNN_MAX_CPU_ISA=AVX2", {"ONEDNN_MAX_CPU_ISA": "AVX2"}))
    if avx512:
        out.append(("ONEDNN_MAX_CPU_ISA=AVX512_CORE", {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}))
        out.append(("MKL_ENABLE_INSTRUCTIONS=AVX2", {"MKL_ENABLE_INSTRUCTIONS": "AVX2"}))
    out.append(("MKL_CBWR=COMPATIBLE", {"MKL_CBWR": "COMPATIBLE"}))
    return out


def probe(env: dict[str, str]) -> dict[str, str]:
    proc = subprocess.run([sys.executable, "-c", PROBE], env={**os.environ, **env}, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", default=[], help="run only settings whose name contains this")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args()
    flags = cpu_flags()
    chosen = [s for s in settings(flags) if not args.only or any(o in s[0] for o in args.only)]
    isa = ", ".join(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16") if f in flags) or "none of avx2/avx512/amx"
    print(f"CPU: {isa}")
    base = probe({})
    results = []
    for name, env in chosen:
        fp = base if not env else probe(env)
        changed = [k for k in base if k != "capability" and fp.get(k) != base.get(k)]
        note = fp.get("error") or (("changes: " + ", ".join(changed)) if changed else "same kernels as the default here")
        print(f"\n=== {name}  [ATen capability {fp.get('capability', '?')}; {note}]", flush=True)
        start = time.monotonic()
        cmd = [sys.executable, "-m", "pytest", "-q", "-m", "numeric", "-p", "no:cacheprovider", *args.pytest_args]
        rc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **env}).returncode
        results.append((name, rc, time.monotonic() - start, note))
    print("\nsetting                              result  seconds  kernels")
    for name, rc, secs, note in results:
        print(f"{name:<36} {'pass' if rc == 0 else f'FAIL {rc}':<7} {secs:7.1f}  {note}")
    return 0 if all(rc == 0 for _, rc, _, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
