"""The demo orchestration without models: spec copies, echoed commands, the closing summary."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from specbuild.core.errors import SpecbuildError
from specbuild.demo import commands, pipeline
from specbuild.demo import models as dm
from specbuild.demo import report as demo_report
from specbuild.demo import stages as demo


def _run(mode, concurrency, *, tps, ttft=10.0, itl=5.0, **extra):
    metrics = {
        "time_to_first_token": {"avg": ttft},
        "inter_token_latency": {"avg": itl},
        "output_token_throughput": tps,
    }
    metrics.update(extra)
    return {"mode": mode, "temperature": 0.0, "concurrency": concurrency, "metrics": metrics}


def test_summary_rows_take_the_bench_baseline_or_borrow_the_draft_target_one():
    dt = {
        "runs": [
            _run("baseline", 1, tps=50.0, itl=20.0),
            _run(
                "speculative",
                1,
                tps=100.0,
                itl=9.0,
                acceptance_rate=0.8,
                mean_accepted_tokens_per_pass=3.2,
                speedup_measured=2.0,
                speedup_predicted=2.4,
            ),
            _run("baseline", 4, tps=80.0),
            _run("speculative", 4, tps=120.0, speedup_measured=1.5),
        ]
    }
    rows = demo_report.summary_rows(dt)
    assert [(r["conc"], r["measured"], r["base ITL ms"], r["baseline"]) for r in rows] == [
        (1, 2.0, 20.0, "own baseline"),
        (4, 1.5, 5.0, "own baseline"),
    ]
    assert rows[0]["tok/pass"] == 3.2 and rows[0]["predicted"] == 2.4
    medusa = {
        "runs": [
            _run("speculative", 1, tps=75.0, mean_accepted_tokens_per_pass=1.9),
            _run("speculative", 2, tps=60.0),
        ]
    }
    rows = demo_report.summary_rows(medusa, baseline_from=dt)
    assert (
        rows[0]["measured"] == pytest.approx(1.5) and rows[0]["baseline"] == "vs draft/target baseline"
    )  # float64 arithmetic of a few terms (~1e-16): approx's default rel 1e-6 is a sound bound
    assert rows[1]["measured"] is None and rows[1]["baseline"] == "none"  # no baseline at concurrency 2
    table = demo_report.markdown("medusa", rows)
    assert "| 0.00 | 1 | - | 1.90 | - | 1.50 |" in table


def test_print_summary_writes_json_and_markdown(tmp_path):
    bench_dir = tmp_path / "draft_target" / "bench"
    bench_dir.mkdir(parents=True)
    bench = {
        "context": {"num_draft_tokens": 4, "cost_ratio": 0.2},
        "runs": [_run("baseline", 1, tps=50.0), _run("speculative", 1, tps=90.0, speedup_measured=1.8)],
    }
    (bench_dir / "bench.json").write_text(json.dumps(bench))
    (bench_dir / "speedup_vs_concurrency.png").write_bytes(b"png")
    summary = demo_report.print_summary(
        {"draft_target": bench_dir / "bench.json"},
        family_metrics=None,
        out=tmp_path,
        timings={"compile": 3.0},
        total_s=10.0,
    )
    assert summary["modes"]["draft_target"]["rows"][0]["measured"] == 1.8
    assert json.loads((tmp_path / "summary.json").read_text())["total_s"] == 10.0
    assert "K=4, cost ratio c=0.20" in (tmp_path / "summary.md").read_text()


def test_the_figures_page_holds_the_runs_tune_reports_and_summary(tmp_path):
    from specbuild.demo.figures import figures_page, write_figures

    text = figures_page(
        summary_md="**draft_target: K=4, cost ratio c=0.20**\n\n| T | conc |\n|---|---|\n"
        f"plots: `{commands.REPO_ROOT / 'build' / 'demo' / 'x.png'}`\n",
        tune_reports={"draft_target": "$ specbuild tune build/demo/specs/draft_target.yaml\nchosen   K=6\n"},
        family_line=demo_report.family_line(
            {
                "target_params": 6.6e6,
                "draft_params": 3.3e5,
                "held_out_greedy_acceptance": {"alpha_token": 0.84},
            },
        ),
        stage_times={"compile": 3.2},
    )
    assert text.startswith("# Current figures: `make demo`\n")
    assert "Written by `make figures`" in text and " CPU cores (" in text
    assert "```text\n$ specbuild tune build/demo/specs/draft_target.yaml\nchosen   K=6\n```" in text
    assert "**draft_target: K=4, cost ratio c=0.20**" in text and "Stage times: compile 3 s." in text
    assert "plots: `build/demo/x.png`" in text  # paths as the docs name them, not this checkout's
    assert "demo family: target 6.6M params, draft 0.33M; offline greedy acceptance per token 0.84" in text
    page = tmp_path / "figures" / "demo.md"
    with pytest.raises(SpecbuildError, match="cannot write the figures page"):
        write_figures(page, text)  # no docs/figures folder: nothing is created by mistake
    page.parent.mkdir()
    write_figures(page, text)
    assert page.read_text() == text


def test_spec_copies_point_at_the_cache_links(tmp_path):
    from specbuild.core.spec import load_spec

    cache = tmp_path / "cache"
    specs = demo.stage_specs(demo.DemoOptions(out=tmp_path, cache=cache), demo.MODES)
    # the examples name the links in .cache/demo at the repository root; the copies name the chosen cache
    assert "../../.cache/demo/target" in (demo.EXAMPLES / "draft_target.yaml").read_text()
    dt = load_spec(specs["draft_target"])
    assert Path(dt.target.model) == cache / "target" and Path(dt.draft.model) == cache / "draft"
    medusa = load_spec(specs["medusa"])
    assert Path(medusa.medusa.heads) == cache / "medusa_heads"
    original = load_spec(demo.EXAMPLES / "medusa.yaml")
    assert medusa.medusa_choices() == original.medusa_choices()
    assert medusa.speculation == original.speculation and medusa.build == original.build
    # the heads the demo trains are the heads the example spec describes
    for settings in (dm.DemoSettings(), dm.MICRO):
        assert (settings.medusa.num_heads, settings.medusa.num_layers) == (
            medusa.medusa.num_heads,
            medusa.medusa.num_layers,
        )


def test_commands_are_echoed_as_a_user_types_them(tmp_path, monkeypatch):
    monkeypatch.chdir(commands.REPO_ROOT)
    argv = [
        "/x/.venv/bin/specbuild",
        "compile",
        str(commands.REPO_ROOT / "build/demo/specs/medusa.yaml"),
        "--prompt",
        "def f(x):",
    ]
    assert commands.shown(argv) == 'specbuild compile build/demo/specs/medusa.yaml --prompt "def f(x):"'


def test_free_ports_are_distinct_loopback_ports():
    ports = {pipeline.free_port() for _ in range(3)}
    assert all(1024 < p < 65536 for p in ports)


def test_summary_rows_compare_with_the_one_call_baseline_when_bench_ran_it():
    dt = {
        "runs": [
            _run("baseline", 1, tps=40.0),
            _run("baseline-unary", 1, tps=64.0),
            _run("speculative", 1, tps=96.0, speedup_measured=2.4),
            _run("baseline", 2, tps=50.0),
            _run("speculative", 2, tps=60.0),
        ]
    }
    rows = demo_report.summary_rows(dt)
    assert rows[0]["1-call base tok/s"] == 64.0 and rows[0]["vs 1-call"] == pytest.approx(1.5)
    # float64 ratio of two small numbers: approx's default rel 1e-6
    assert rows[1]["1-call base tok/s"] is None and rows[1]["vs 1-call"] is None  # no one-call run at c=2
    medusa = {"runs": [_run("speculative", 1, tps=32.0)]}
    borrowed = demo_report.summary_rows(medusa, baseline_from=dt)  # the lender's one-call run too
    assert borrowed[0]["vs 1-call"] == pytest.approx(0.5)


def test_summary_has_the_load_aware_table(tmp_path):
    """The draft/target load bench (load.json, with bench --calibrate's measured / predicted) beside the
    in-process check (in_process.json) and tune --schedule's report: per concurrency and mode the
    tokens/s through Triton and in-process as median (range) of the rounds, measured / predicted of
    both, the schedule over the one-call baseline and over the fixed K, and the plot paths."""
    mode = tmp_path / "draft_target"
    (mode / "schedule").mkdir(parents=True)
    (mode / "bench-load").mkdir()
    tune = {"details": {"schedule": {"schedule": {"1": 4, "6": 0}, "chosen": {"1": 4, "8": 0}}}}
    (mode / "schedule" / "tune.json").write_text(json.dumps(tune))
    (mode / "schedule" / "schedule_predicted.png").write_bytes(b"png")

    def spread(m, lo, hi):
        return {"median": m, "min": lo, "max": hi}

    def mode_(v, ratio):
        return {
            "throughput_median": v,
            "throughput_min": v - 1,
            "throughput_max": v + 1,
            "measured_over_predicted": ratio,
            "ratio_min": ratio - 0.05,
            "ratio_max": ratio + 0.05,
        }

    def point(c, base, k4, sched):
        return {
            "concurrency": c,
            "modes": {
                "baseline-unary": mode_(base, 1.0),
                "K=4": {**mode_(k4, 0.9), "measured_over_cost_model": spread(0.96, 0.93, 0.99)},
                "schedule": mode_(sched, 1.1),
            },
            "schedule_over_baseline_unary": spread(sched / base, 1.0, 1.2),
            "schedule_over_best_fixed": spread(1.0, 0.98, 1.02),
        }

    load = {"context": {"rounds": 3}, "points": [point(1, 50.0, 150.0, 160.0), point(8, 300.0, 200.0, 310.0)]}
    (mode / "bench-load" / "load.json").write_text(json.dumps(load))
    (mode / "bench-load" / "bench.json").write_text(json.dumps({"runs": []}))
    local = {
        "points": {
            "1/baseline": {
                "tokens_per_s": spread(80.0, 78.0, 82.0),
                "measured_over_predicted": spread(0.97, 0.9, 1.0),
            },
            "1/schedule": {
                "tokens_per_s": spread(200.0, 200.0, 200.0),
                "measured_over_predicted": None,
                "measured_over_cost_model": spread(1.02, 1.0, 1.05),
            },
        },
        "schedule_over_fixed": {"1": spread(1.01, 0.99, 1.03)},
    }
    (mode / "schedule" / "in_process.json").write_text(json.dumps(local))

    def load_rows():
        summary = demo_report.print_summary(
            {},
            loads={"draft_target": mode / "bench-load" / "bench.json"},
            family_metrics=None,
            out=tmp_path,
            timings={},
            total_s=1.0,
        )
        return {(r["conc"], r["mode"]): r for r in summary["load_aware"]["draft_target"]["rows"]}

    by = load_rows()
    assert by[1, "target alone"]["Triton tok/s"] == "50.0 (49.0-51.0)"
    assert by[1, "target alone"]["in-process tok/s"] == "80.0 (78.0-82.0)"
    assert by[1, "target alone"]["in-process meas/pred"] == "0.97 (0.90-1.00)"
    assert by[1, "K=4"]["Triton meas/pred"] == "0.90 (0.85-0.95)" and by[1, "K=4"]["in-process tok/s"] == "-"
    # the same prediction with each run's own rounds (the cost model alone), where a run carried it
    assert by[1, "K=4"]["Triton meas/pred, own rounds"] == "0.96 (0.93-0.99)"
    assert by[1, "schedule"]["in-process meas/pred, own rounds"] == "1.02 (1.00-1.05)"
    assert by[1, "target alone"]["Triton meas/pred, own rounds"] == ""  # no rounds: the column stays empty
    assert by[1, "schedule"]["in-process tok/s"] == "200.0" and by[1, "schedule"]["sched K"] == 4
    assert by[1, "schedule"]["sched / fixed K (in-process)"] == "1.01 (0.99-1.03)"
    assert (
        by[8, "schedule"]["sched K"] == 0
        and by[8, "schedule"]["sched / fixed K (Triton)"] == "1.00 (0.98-1.02)"
    )
    md = (tmp_path / "summary.md").read_text()
    assert "load-aware schedule" in md and "schedule_predicted.png" in md and "3 interleaved rounds" in md

    # the schedule the repository served came from the served cost curve (tune --schedule --url):
    # the Triton side's K is its choice, the in-process schedule stays beside it
    served = {"details": {"schedule": {"schedule": {"1": 4, "3": 0}, "chosen": {"1": 4, "8": 0, "2": 4}}}}
    (mode / "schedule" / "served.json").write_text(json.dumps(served))
    (mode / "schedule" / "served_predicted.png").write_bytes(b"png")
    (mode / "schedule" / "tune.json").write_text(
        json.dumps({"details": {"schedule": {"schedule": {"1": 4}, "chosen": {"1": 4, "8": 4}}}})
    )
    by = load_rows()
    assert by[8, "schedule"]["sched K"] == 0 and by[8, "schedule"]["in-process sched K"] == 4
    md = (tmp_path / "summary.md").read_text()
    assert "served schedule {'1': 4, '3': 0}" in md and "served_predicted.png" in md
    # make demo's flow: no in-process curve, the served schedule everywhere
    (mode / "schedule" / "tune.json").unlink()
    by = load_rows()
    assert by[8, "schedule"]["sched K"] == 0 and "in-process sched K" not in by[8, "schedule"]
    assert "the repository and the in-process engine both carry it" in (tmp_path / "summary.md").read_text()


def test_a_served_build_is_the_commands_a_user_types(tmp_path):
    """The pipeline API's stages as `make demo` typed them before it existed: compile with the reference
    engine, `repo` of the kind (LLM-API kinds compile with --flow llmapi and stream when decoupled)."""
    from specbuild.core.deployment import RepoKind

    spec, out = tmp_path / "dt.yaml", tmp_path / "dt"
    served = pipeline.ServedBuild(spec=spec, out=out, build_dir="reference")
    assert served.compile_args() == [
        "compile",
        str(spec),
        "--out",
        str(out / "reference"),
        "--engine",
        "reference",
        "--force",
    ]
    assert served.repo_args() == [
        "repo",
        str(out / "reference"),
        "--out",
        str(out / "repo"),
        "--backend",
        "python",
        "--force",
    ]
    off = dataclasses.replace(served, schedule="1:0")
    assert off.repo_args()[-2:] == ["--schedule", "1:0"]
    llmapi = pipeline.ServedBuild(spec=spec, out=out, kind=RepoKind.LLMAPI_LOCAL, decoupled=True)
    assert llmapi.compile_args()[2:4] == ["--flow", "llmapi"]
    assert llmapi.repo_args()[4:8] == ["--backend", "llmapi-local", "--decoupled", "--force"]
    unary = dataclasses.replace(llmapi, decoupled=False)
    assert "--no-decoupled" in unary.repo_args()


def test_serving_says_so_when_serve_exits_before_the_server_is_ready(tmp_path, monkeypatch):
    """`serving` starts `specbuild serve` in the background; a serve that exits (a bad repository, a port
    taken) is an error naming its exit code and the log, not a wait for the ready timeout."""
    fake = tmp_path / "specbuild"
    fake.write_text("#!/bin/sh\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setattr(pipeline, "specbuild_exe", lambda: str(fake))
    with (
        pytest.raises(pipeline.SpecbuildError, match="exited before the server was ready") as err,
        pipeline.serving(tmp_path / "repo", tmp_path / "server.log"),
    ):
        pytest.fail("the block must not run")
    assert err.value.found == "exit code 3" and "server.log" in err.value.fix
