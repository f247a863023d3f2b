"""Tables in logs and pipes: when stdout is not a terminal (CliRunner's is not) the CLI's tables keep
their natural width instead of being squeezed into rich's 80 columns (headers cut to "so…", cells
wrapped and ellipsized)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from specbuild.cli import app

ROOT = Path(__file__).resolve().parent.parent
SEED = ROOT / "examples" / "llama33-70b-1b.yaml"
NO_COLUMNS = {"COLUMNS": None}  # unset: COLUMNS, when given, sets the width (as rich reads it)


def _unsqueezed(output: str) -> None:
    assert "…" not in output, output  # rich's ellipsis: a cut cell or header
    widest = max(len(line) for line in output.splitlines())
    assert widest > 80, widest  # rich's fallback width when it cannot ask a terminal


def test_check_tables_keep_their_width_off_a_terminal():
    r = CliRunner().invoke(app, ["check", str(SEED)], env=NO_COLUMNS)
    _unsqueezed(r.output)
    assert "memory plan, GPU 0 of" in r.output
    # a row is one line: its found and fix cells are not wrapped
    row = next(line for line in r.output.splitlines() if "prompt limit" in line)
    assert "max_num_tokens" in row and "TensorRT-LLM ignores" in row


def test_plan_table_keeps_its_width_off_a_terminal(tmp_path):
    args = ["plan", str(SEED), "--tokens-per-day", "100M", "--stated", "45,105", "--gpu", "h100"]
    r = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "plan")], env=NO_COLUMNS)
    assert r.exit_code == 0, r.output
    _unsqueezed(r.output)


def test_bench_table_keeps_its_width_off_a_terminal():
    from test_client_metrics import _runs

    from specbuild.bench.report import table
    from specbuild.cli.common import console

    runner = CliRunner()
    with runner.isolation(
        env=NO_COLUMNS
    ) as streams:  # stdout as a `specbuild bench` run under CliRunner sees it
        console().print(table(_runs()))
        text = streams[0].getvalue().decode()
    _unsqueezed(text)
    header = next(line for line in text.splitlines() if "speedup" in line)
    for column in ("latency p50", "out tok/s", "tok/pass", "vs 1-call", "predicted"):
        assert column in header


def test_columns_still_sets_the_width():
    r = CliRunner().invoke(app, ["check", str(SEED)], env={"COLUMNS": "100"})
    rows = [line for line in r.output.splitlines() if line[:1] in "┏┃┡│└"]  # the tables' lines
    assert rows and max(len(line) for line in rows) <= 100
