"""`specbuild doctor` and the speed of `specbuild --help` (no heavy imports at CLI import time)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from typer.testing import CliRunner

from specbuild.cli import app

runner = CliRunner()


def test_doctor_reports_environment():
    result = runner.invoke(app, ["doctor", "--json"])
    rows = {r["name"]: r for r in json.loads(result.output)}
    assert {"python", "torch", "tensorrt_llm", "trtllm-build", "tritonserver"} <= set(rows)
    assert rows["python"]["status"] == "pass" and sys.executable in rows["python"]["found"]
    assert all(r["status"] in ("pass", "warn", "fail") for r in rows.values())
    assert all(r["fix"] for r in rows.values() if r["status"] != "pass")  # every non-pass says the fix
    if rows["tritonserver"]["status"] == "pass":  # the nvidia-pytriton wheel is installed here
        assert rows["python backend stub"]["status"] == "pass"
        assert rows["libpython"]["status"] in ("pass", "fail")
    assert result.exit_code == (1 if any(r["status"] == "fail" for r in rows.values()) else 0)


def test_doctor_table():
    result = runner.invoke(app, ["doctor"], env={"COLUMNS": "200"})
    assert "specbuild doctor" in result.output and "tensorrt_llm" in result.output


def test_help_is_fast_and_imports_nothing_heavy():
    code = (
        "import sys, time; t = time.perf_counter(); sys.argv = ['specbuild', '--help']\n"
        "from specbuild.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "heavy = [m for m in ('torch', 'transformers', 'numpy', 'tritonclient', 'safetensors', 'tokenizers') "
        "if m in sys.modules]\n"
        "print('HEAVY', heavy, time.perf_counter() - t)"
    )
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    wall = time.perf_counter() - start
    line = next(ln for ln in out.splitlines() if ln.startswith("HEAVY"))
    assert line.startswith("HEAVY []"), line
    assert "check" in out and "inspect" in out and "doctor" in out
    assert wall < 5.0, f"specbuild --help took {wall:.2f} s"  # ~0.5 s alone; generous for a loaded CI machine
