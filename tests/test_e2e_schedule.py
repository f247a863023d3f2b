"""End to end: a draft/target repository whose BLS follows a load-aware schedule (`repo --schedule`),
served by a real tritonserver: K follows the requests in flight across the BLS instances (their shared
counter), greedy output stays the target's, and an explicit num_draft_tokens stays a fixed K."""

from __future__ import annotations

import re
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

pytestmark = pytest.mark.slow

MAX_TOKENS = 40
PROMPTS = ["The quick brown fox", "Once upon a time", "def main():", "Speculative decoding is"]


@pytest.fixture(scope="module")
def scheduled_server(e2e_builds, tmp_path_factory):
    from specbuild.demo.pipeline import local_server
    from specbuild.model_repo.generate import generate_repo

    build = e2e_builds["draft_target"][0]
    repo = generate_repo(
        build, tmp_path_factory.mktemp("sched") / "repo", backend="python", schedule="1:4,2:0", guard="2:1.0"
    )
    server = local_server(repo).launch().wait_ready()
    try:
        yield server
    finally:
        server.stop()


def _remote(server, prompt, **kw):
    from specbuild.client.remote import generate_remote
    from specbuild.core.sampling_params import SamplingParams

    return generate_remote(
        server.grpc_url, prompt, SamplingParams(max_tokens=MAX_TOKENS), timeout_s=180, **kw
    )


def test_repository_records_the_schedule(e2e_builds, scheduled_server):
    config = (scheduled_server.repo / "tensorrt_llm_bls" / "config.pbtxt").read_text()
    assert '"draft_len_schedule"' in config and '"1:4,2:0"' in config
    assert '"acceptance_guard"' in config and '"2:1"' in config and "speculation_stopped" in config


def test_schedule_follows_the_load_and_keeps_greedy_output(scheduled_server, greedy):
    alone = {p: _remote(scheduled_server, p, stream=True) for p in PROMPTS}
    for p, r in alone.items():
        assert r.token_ids == greedy(p, MAX_TOKENS)[1]
        assert r.stats.drafted > 0  # one request in flight: K = 4
    # the guard (2 rounds under 100% acceptance) stopped the requests whose drafts were rejected, and the
    # perf outputs say so; stopped requests drafted at most two rounds of 4
    stopped = [r for r in alone.values() if r.stats.guard_stopped]
    assert stopped and all(r.stats.drafted <= 8 for r in stopped)
    assert all(r.stats.accepted == r.stats.drafted for r in alone.values() if not r.stats.guard_stopped)

    barrier = threading.Barrier(len(PROMPTS))

    def together(p, **kw):
        barrier.wait()
        return _remote(scheduled_server, p, stream=True, **kw)

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        crowd = dict(zip(PROMPTS, pool.map(together, PROMPTS), strict=True))
    for p, r in crowd.items():
        assert r.token_ids == greedy(p, MAX_TOKENS)[1]
    # four in flight (four BLS instances): K = 0 while two or more run, so far fewer drafts than alone
    assert sum(r.stats.drafted for r in crowd.values()) < sum(r.stats.drafted for r in alone.values()) / 2

    barrier.reset()
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        fixed = list(pool.map(lambda p: together(p, num_draft_tokens=3), PROMPTS))
    for p, r in zip(PROMPTS, fixed, strict=True):
        assert r.token_ids == greedy(p, MAX_TOKENS)[1]
        assert r.stats.drafted > 0  # an explicit K is not scheduled


def test_bench_runs_baseline_fixed_k_and_the_schedule_interleaved(scheduled_server, tmp_path):
    from typer.testing import CliRunner

    from specbuild.cli import app

    prompts = tmp_path / "p.txt"
    prompts.write_text("\n".join(PROMPTS[:2]) + "\n")
    out = tmp_path / "bench"
    args = ["bench", "--url", scheduled_server.grpc_url, "--prompts", str(prompts), "--concurrency", "1,2"]
    args += ["--temperature", "0", "--max-tokens", "8", "--rounds", "2", "--fixed-k", "2", "--out", str(out)]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    import json

    load = json.loads((out / "load.json").read_text())
    assert load["context"]["draft_len_schedule"] == "1:4,2:0" and load["context"]["rounds"] == 2
    for point in load["points"]:
        assert set(point["modes"]) == {
            "baseline",
            "baseline-unary",
            "K=2",
            "K=4",
            "schedule",
            "schedule-unary",
        }
        assert all(m["rounds"] == 2 for m in point["modes"].values())
        assert point["schedule_over_baseline"]["rounds"] == 2 and point["best_fixed"] in ("K=2", "K=4")
    runs = json.loads((out / "bench.json").read_text())["runs"]
    order = [(r["concurrency"], r["mode"], r["num_draft_tokens"]) for r in runs]
    first = [
        (1, "baseline", 0),
        (1, "baseline-unary", 0),
        (1, "speculative", 2),
        (1, "speculative", 4),
        (1, "schedule", 4),
        (1, "schedule-unary", 4),
    ]
    assert order[:6] == first
    assert order[12:18] == first[::-1]  # round 2 (after c=1, 2 of round 1): the order reversed
    assert all(p["schedule_over_baseline_unary"]["rounds"] == 2 for p in load["points"])
    assert all(p["schedule_unary_over_baseline_unary"]["rounds"] == 2 for p in load["points"])
    assert (out / "load_T0.png").stat().st_size > 1000
    assert "schedule / baseline" in r.output


def test_tune_schedule_through_the_server(e2e_builds, scheduled_server, tmp_path):
    """`tune --schedule --url`: the round cost measured through the served BLS at each (c, K), combined with
    the profiled acceptance into a prediction and a schedule; K stops at the spec's max_draft_len (what
    the served engines were built with: a larger K would be refused) even when more K were profiled."""
    import json
    import shutil

    from typer.testing import CliRunner

    from specbuild.cli import app

    workdir = e2e_builds["draft_target"][0].parent
    spec = tmp_path / "dt.yaml"
    shutil.copy(workdir / "draft-target.yaml", spec)
    text = spec.read_text().replace("model: target", f"model: {workdir / 'target'}")
    text = text.replace("model: draft", f"model: {workdir / 'draft'}")
    spec.write_text(re.sub(r"max_draft_len: \d+", "max_draft_len: 2", text))
    assert "max_draft_len: 2" in spec.read_text()
    prompts = tmp_path / "p.txt"
    prompts.write_text("\n".join(PROMPTS[:2]) + "\n")
    args = ["tune", str(spec), "--prompts", str(prompts), "--max-tokens", "8", "--k-max", "3", "--schedule"]
    args += ["--url", scheduled_server.grpc_url, "--concurrency", "1,2", "--json"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    sched = json.loads(r.stdout)["details"]["schedule"]
    assert sched["curve"]["kind"] == "served" and set(sched["curve"]["points"]) == {
        f"{c}/{k}" for c in (1, 2) for k in (0, 1, 2)
    }
    # the sweep repeated (interleaved), every point once per repeat; a decision per concurrency
    assert sched["curve"]["repeats"] == 3 and all(len(v) == 3 for v in sched["curve"]["points"].values())
    assert [d["concurrency"] for d in sched["decisions"]] == [1, 2]
    rows = [row for row in sched["table"] if row["k"] > 0]
    assert all(row["round_ms"] > 0 and row["measured_tokens_per_s"] > 0 for row in rows)
    assert all(row["predicted"]["min"] <= row["tokens_per_s"] <= row["predicted"]["max"] for row in rows)
    assert sched["schedule"] is None or sched["schedule"]["1"] == sched["chosen"]["1"]


def test_bench_calibrates_on_other_prompts_and_reports_measured_over_predicted(scheduled_server, tmp_path):
    """`bench --calibrate`: each (c, mode) runs the calibration prompts once before its first round; every
    benched run carries the served cost model's prediction; --no-streamed-baseline drops that mode."""
    import json

    from typer.testing import CliRunner

    from specbuild.cli import app

    prompts, tune = tmp_path / "p.txt", tmp_path / "tune.txt"
    prompts.write_text("\n".join(PROMPTS[:2]) + "\n")
    tune.write_text("\n".join(PROMPTS[2:]) + "\n")
    out = tmp_path / "bench"
    args = ["bench", "--url", scheduled_server.grpc_url, "--prompts", str(prompts), "--concurrency", "1"]
    args += ["--temperature", "0", "--max-tokens", "8", "--rounds", "2", "--out", str(out)]
    args += ["--calibrate", str(tune), "--no-streamed-baseline"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    (point,) = json.loads((out / "load.json").read_text())["points"]
    assert set(point["modes"]) == {"baseline-unary", "K=4", "schedule", "schedule-unary"}
    for m in point["modes"].values():
        assert m["rounds"] == 2 and m["measured_over_predicted"] > 0
        assert m["ratio_min"] <= m["measured_over_predicted"] <= m["ratio_max"]
    runs = json.loads((out / "bench.json").read_text())["runs"]
    assert len(runs) == 8  # the calibration runs are not benched runs
    assert "measured/predicted" in r.output
