"""The tritonserver that the nvidia-pytriton wheel bundles: where its parts are and how to run it.

Facts (Triton 2.51 in nvidia-pytriton 0.7, read from the installed wheel):
* `pytriton/tritonserver/bin/tritonserver` links its libraries from `nvidia_pytriton.libs/`
  (RPATH), but the Python backend's stub is loaded as a separate process, so the libs folder
  goes on `LD_LIBRARY_PATH` as well.
* The Python backend looks for `triton_python_backend_stub` next to `libtriton_python.so`; the
  wheel ships one stub per Python version under `python_backend_stubs/<X.Y>/`, so we lay out a
  private backend folder (`python/` = backend library + utils + the stub for this Python).
* The stub embeds `libpython3.X.so.1.0` and takes its module search path from the `python3` it
  finds first on `PATH`: the virtualenv's `bin/` goes first, and this interpreter's LIBDIR goes
  on `LD_LIBRARY_PATH` so the stub uses the same libpython as the interpreter.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from specbuild.core.errors import ServerError

PY_VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"


@dataclass(frozen=True)
class TritonBundle:
    """Paths of the bundled server; `find_bundle()` builds it from the installed wheel."""

    binary: Path  # tritonserver executable
    python_backend: Path  # folder with libtriton_python.so + triton_python_backend_utils.py
    stub: Path  # triton_python_backend_stub for this interpreter's Python version
    libs: Path  # nvidia_pytriton.libs (shared libraries of the server and the stub)

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """Environment for the server process (and, through it, the stubs)."""
        env = dict(os.environ if base is None else base)
        libdirs = [str(self.libs)]
        py_libdir = sysconfig.get_config_var("LIBDIR")
        if py_libdir:
            libdirs.append(py_libdir)
        if env.get("LD_LIBRARY_PATH"):
            libdirs.append(env["LD_LIBRARY_PATH"])
        env["LD_LIBRARY_PATH"] = os.pathsep.join(libdirs)
        # The stub's module search path comes from the first python3 on PATH: ours (the venv).
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        return env

    def make_backend_dir(self, dest: Path) -> Path:
        """Lay out `dest/python/` (backend library, utils and our stub); return `dest`."""
        python_dir = dest / "python"
        python_dir.mkdir(parents=True, exist_ok=True)
        for item in self.python_backend.iterdir():
            if item.is_file():
                shutil.copy2(item, python_dir / item.name)
        shutil.copy2(self.stub, python_dir / "triton_python_backend_stub")
        return dest


def find_bundle() -> TritonBundle:
    """Locate the bundled tritonserver, or say how to install it."""
    try:
        import pytriton  # noqa: PLC0415 - probes the optional `local` extra
    except ImportError:
        raise ServerError(
            "the local tritonserver is not installed",
            expected="the nvidia-pytriton wheel (bundles tritonserver 2.51 and its Python backend)",
            found="no module named pytriton",
            fix="pip install -e '.[local]' (or: pip install nvidia-pytriton)",
        ) from None
    root = Path(pytriton.__file__).parent / "tritonserver"
    bundle = TritonBundle(
        binary=root / "bin" / "tritonserver",
        python_backend=root / "backends" / "python",
        stub=root / "python_backend_stubs" / PY_VERSION / "triton_python_backend_stub",
        libs=root.parent.parent / "nvidia_pytriton.libs",
    )
    for name in ("binary", "python_backend", "stub", "libs"):
        path = getattr(bundle, name)
        if not path.exists():
            raise ServerError(
                f"the nvidia-pytriton wheel is incomplete: its {name} is missing",
                expected=str(path),
                found="nothing there",
                fix=f"reinstall it: pip install --force-reinstall nvidia-pytriton (Python {PY_VERSION} must "
                "be supported)",
            )
    return bundle


def check_libpython(bundle: TritonBundle, env: dict[str, str]) -> None:
    """Fail early, with the fix, when the stub cannot load libpython (a static-only Python build)."""
    if shutil.which("ldd") is None:
        return  # cannot check here; the server log will say it
    out = subprocess.run(
        ["ldd", str(bundle.stub)], env=env, capture_output=True, text=True, check=False
    ).stdout
    missing = [line.strip() for line in out.splitlines() if "not found" in line]
    if missing:
        lib = missing[0].split()[0]
        raise ServerError(
            "the Python backend stub cannot load a shared library it needs",
            expected=f"{lib} (the shared libpython of Python {PY_VERSION}) findable by the dynamic loader",
            found="; ".join(missing),
            fix=(
                f"install the shared library (Debian/Ubuntu: apt install libpython{PY_VERSION}), or use a "
                "Python "
                "built with --enable-shared (pyenv: PYTHON_CONFIGURE_OPTS=--enable-shared pyenv install ...)"
            ),
        )
