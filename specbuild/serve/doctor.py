"""`specbuild doctor`: what this machine can run, as pass / warn / fail rows. Fast: nothing is built.

torch is imported (for CUDA and the GPU list); tensorrt_llm is only looked up by its installed
metadata, because importing it initialises CUDA and takes seconds.
"""

from __future__ import annotations

import importlib.metadata as md
import shutil
import subprocess
import sys
from dataclasses import dataclass

from specbuild.core.errors import SpecbuildError
from specbuild.serve.bundle import PY_VERSION, check_libpython, find_bundle

PASS, WARN, FAIL = "pass", "warn", "fail"
SUPPORTED_PYTHON = ((3, 10), (3, 12))
TRTLLM_LINE = "1.2"  # the last release line with the convert -> trtllm-build engine flow


@dataclass(frozen=True)
class DoctorRow:
    name: str
    status: str
    found: str
    fix: str = ""


def run_doctor() -> list[DoctorRow]:
    rows = [_python(), *_packages(), _torch(), _tensorrt_llm(), _trtllm_build()]
    rows += _triton()
    return rows


def _python() -> DoctorRow:
    v = sys.version_info[:2]
    found = f"{sys.version.split()[0]} at {sys.executable}"
    if SUPPORTED_PYTHON[0] <= v <= SUPPORTED_PYTHON[1]:
        return DoctorRow("python", PASS, found)
    return DoctorRow("python", WARN, found + " (outside 3.10-3.12)", "use Python 3.10, 3.11 or 3.12")


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _packages() -> list[DoctorRow]:
    rows = []
    for dist in ("specbuild", "transformers", "tokenizers", "safetensors", "tritonclient"):
        v = _version(dist)
        rows.append(
            DoctorRow(dist, PASS, v)
            if v
            else DoctorRow(dist, FAIL, "not installed", "make setup (pip install -e '.[local,dev]')")
        )
    return rows


def _torch() -> DoctorRow:
    try:
        import torch  # noqa: PLC0415 - probes whether torch imports at all
    except ImportError:
        return DoctorRow("torch", FAIL, "not installed", "make setup installs torch==2.13.0")
    if not torch.cuda.is_available():
        return DoctorRow(
            "torch",
            WARN,
            f"{torch.__version__}, no CUDA (CPU only): the reference engine runs, TensorRT-LLM builds do not",
            "build engines on a GPU host (NVIDIA container with tensorrt_llm 1.2.x)",
        )
    gpus = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        gpus.append(f"{i}: {p.name} {p.total_memory / 2**30:.1f} GiB")
    return DoctorRow(
        "torch",
        PASS,
        f"{torch.__version__}, CUDA {torch.version.cuda}, {len(gpus)} GPU(s): " + "; ".join(gpus),
    )


def _tensorrt_llm() -> DoctorRow:
    v = _version("tensorrt_llm") or _version("tensorrt-llm")
    if v is None:
        return DoctorRow(
            "tensorrt_llm",
            WARN,
            "not installed (GPU hosts only): compile writes the build plan + a reference engine",
            f"on a GPU host: pip install 'specbuild[trtllm]' (tensorrt_llm {TRTLLM_LINE}.x) or use the "
            "trtllm-python-py3 container",
        )
    if not v.startswith(TRTLLM_LINE + "."):
        return DoctorRow(
            "tensorrt_llm",
            WARN,
            f"{v}: the engine flow (convert -> trtllm-build) is targeted at {TRTLLM_LINE}.x",
            f"install tensorrt_llm {TRTLLM_LINE}.x",
        )
    return DoctorRow("tensorrt_llm", PASS, v)


def _trtllm_build() -> DoctorRow:
    path = shutil.which("trtllm-build")
    if path:
        return DoctorRow("trtllm-build", PASS, path)
    return DoctorRow(
        "trtllm-build",
        WARN,
        "not on PATH (GPU hosts only)",
        "installed with tensorrt_llm; add its bin/ to PATH",
    )


def _triton() -> list[DoctorRow]:
    try:
        bundle = find_bundle()
    except SpecbuildError as exc:
        return [DoctorRow("tritonserver", FAIL, f"{exc.what} ({exc.found})", exc.fix or "")]
    rows = [
        DoctorRow(
            "tritonserver", PASS, f"{bundle.binary} (nvidia-pytriton {_version('nvidia-pytriton') or '?'})"
        ),
        DoctorRow("python backend stub", PASS, f"{bundle.stub} (Python {PY_VERSION})"),
    ]
    env = bundle.env()
    try:
        check_libpython(bundle, env)
    except SpecbuildError as exc:
        rows.append(DoctorRow("libpython", FAIL, f"{exc.found}", exc.fix or ""))
        return rows
    rows.append(
        DoctorRow(
            "libpython",
            PASS,
            _resolved_libpython(str(bundle.stub), env) or "resolvable (ldd not available to show the path)",
        )
    )
    return rows


def _resolved_libpython(stub: str, env: dict[str, str]) -> str | None:
    if shutil.which("ldd") is None:
        return None
    out = subprocess.run(
        ["ldd", stub], env=env, capture_output=True, text=True, check=False, timeout=10
    ).stdout
    line = next((ln.strip() for ln in out.splitlines() if "libpython" in ln), None)
    return line.split(" (0x")[0] if line else None
