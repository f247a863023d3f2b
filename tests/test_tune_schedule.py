"""`tune --schedule`: the cost model's choice per batch size (synthetic curves with a known answer), and
the command end to end on the tiny models (cost curve measured, schedule written with comments kept,
the predicted curve plotted)."""

from __future__ import annotations

import json

import pytest

from specbuild.core.perf.theory import tokens_per_pass_chain


def _curve(compute_bound_from: int):
    """A roofline-like target: a pass costs 1 ms until b x (K+1) tokens reach `compute_bound_from`, then
    grows linearly; drafts cost 0.1 ms per pass, the loop 0.05 ms per round."""
    from specbuild.tuning.cost_curve import CostCurve

    sizes = [1, 2, 4, 8]

    def t(tokens):
        return 1e-3 * max(1.0, tokens / compute_bound_from)

    return CostCurve(
        batch_sizes=sizes,
        max_k=4,
        verify_s={b: [t(b * (k + 1)) for k in range(5)] for b in sizes},
        draft_s=dict.fromkeys(sizes, 1e-4),
        loop_s=dict.fromkeys(sizes, 5e-5),
        plain_step_s={b: t(b) + 5e-5 for b in sizes},
    )


def test_k_falls_with_the_load_where_verification_gets_compute_bound():
    from specbuild.tuning.cost_curve import predict

    acceptance = [0.8, 0.7, 0.6, 0.5]
    pred = predict(_curve(8), acceptance)
    # b=1: K=3 (2.696 tokens / 1.35 ms) and K=4 (2.864 / 1.45) tie within 3%: one request takes the larger
    assert pred.chosen[1] == 4 and pred.chosen[8] == 0
    assert all(pred.chosen[a] >= pred.chosen[b] for a, b in zip([1, 2, 4], [2, 4, 8], strict=True))
    assert pred.schedule.to_dict()[1] == 4 and pred.schedule.k_for(8) == 0
    # the predicted rate of each row is b E(K) / (K t_d + t_v(b, K) + o)
    row = next(r for r in pred.table if r["batch"] == 2 and r["k"] == 3)
    e = tokens_per_pass_chain(acceptance, 3)
    assert row["tokens_per_s"] == pytest.approx(2 * e / (3 * 1e-4 + 1e-3 + 5e-5))
    # a memory-bound target at every size: speculate everywhere, one step in the schedule
    assert predict(_curve(1000), acceptance).schedule.to_dict() == {1: 4, 2: 3}


def test_modes_break_near_ties_the_other_way():
    from specbuild.tuning.cost_curve import predict

    flat = [0.9, 0.183, 0.0, 0.0]  # b=1: K=1 1.9 tokens / 1.15 ms, K=2 2.065 / 1.25 ms: a tie
    thr, lat = predict(_curve(1000), flat, mode="throughput"), predict(_curve(1000), flat, mode="latency")
    assert thr.chosen[2] < lat.chosen[2]  # at b=1 a tie always takes the larger K


def test_no_schedule_when_speculation_never_pays():
    from specbuild.tuning.cost_curve import predict

    pred = predict(_curve(1), [0.01, 0.01, 0.01, 0.01])
    assert pred.schedule is None and pred.notes


def test_the_ngram_report_prints_its_schedule():
    """`tune --schedule` on an n-gram spec: the cost curve it measured and the schedule it chose are in the
    printed report (they were measured for minutes and then left out)."""
    from specbuild.cli.tuning import format_tune_report
    from specbuild.tuning.cost_curve import predict
    from specbuild.tuning.tune_report import Setting, TuneReport

    pred = predict(_curve(8), [], tokens={1: 1.5, 2: 1.8, 3: 2.0, 4: 2.1})
    value = {"speculation.max_draft_len": 4, "ngram.max_matching_ngram_size": 2}
    chosen, current = (Setting(label, value, 2.1, 1.2, 4) for label in ("chosen", "current"))
    profile = {"acceptance_per_position": [0.5], "hit_rate": 0.5, "acceptance_rate": 0.5}
    details = {
        "flags": {},
        "profiled_tokens": 8,
        "verify_cost": [1.0, 1.5],
        "table": [],
        "chosen_profile": profile,
        "current_profile": profile,
        "schedule": pred.to_dict(),
    }
    text = format_tune_report(TuneReport("ngram", "ngram", chosen, current, details=details))
    assert "cost curve (reference engine" in text and "predicted tokens/s" in text
    assert f"schedule: {pred.to_dict()['schedule']}" in text


@pytest.mark.slow
def test_tune_schedule_end_to_end(tmp_path, tiny_target, tiny_draft):
    from typer.testing import CliRunner

    from specbuild.cli import app
    from specbuild.core.spec import load_spec

    spec_path = tmp_path / "dt.yaml"
    spec_path.write_text(
        f"name: tiny-dt\nmode: draft_target\ndtype: float32\ntarget: {{model: {tiny_target}}}\n"
        f"draft: {{model: {tiny_draft}}}\nspeculation:\n  max_draft_len: 3  # K\n"
        "build: {max_batch_size: 2, max_input_len: 128, max_seq_len: 256}\n"
    )
    prompts = tmp_path / "p.txt"
    prompts.write_text("The quick brown fox\nOnce upon a time\n")
    plot = tmp_path / "curve.png"
    args = ["tune", str(spec_path), "--prompts", str(prompts), "--max-tokens", "8", "--k-max", "2"]
    args += ["--schedule", "--concurrency", "1,2,4", "--plot", str(plot), "--json"]
    r = CliRunner().invoke(app, [*args, "--write"])
    assert r.exit_code == 0, r.output
    sched = json.loads(r.stdout)["details"]["schedule"]
    assert sched["curve"]["batch_sizes"] == [1, 2]  # capped at build.max_batch_size
    assert {(row["batch"], row["k"]) for row in sched["table"]} == {(b, k) for b in (1, 2) for k in range(3)}
    assert all(row["tokens_per_s"] > 0 and row["round_ms"] > 0 for row in sched["table"])
    curve = sched["curve"]  # the loop on the tune prompts: every (b, K) timed, each prompt's rounds
    assert sorted(curve["loop_round_s"]) == ["1", "2"] and all(
        len(v) == 3 for v in curve["loop_round_s"].values()
    )
    assert {k: len(v) for k, v in curve["rounds"].items()} == {"0": 2, "1": 2, "2": 2}
    assert curve["tokens"] == [8, 8] or all(0 < n <= 8 for n in curve["tokens"])
    assert plot.stat().st_size > 1000
    spec = load_spec(spec_path)
    if sched["schedule"] is None:  # possible on a loaded CPU: no K pays even at b=1, speculation off
        assert sched["chosen"]["1"] == 0 and spec.speculation.schedule == {1: 0}
    else:
        want = {int(k): v for k, v in sched["schedule"].items()}
        assert spec.speculation.schedule == want
        assert spec.speculation.max_draft_len == want[1]
        assert "# K" in spec_path.read_text()  # the narrow edit kept the comment
    r = CliRunner().invoke(app, args[:-1])  # the table
    assert r.exit_code == 0 and "cost curve" in r.output and "predicted tokens/s" in r.output
    # the demo's in-process check of the cost model on other prompts (tuning/holdout.py): each held-out
    # run predicted from a calibration run on the tune prompts right before it
    from specbuild.builder.compile import compile_spec
    from specbuild.engines.reference.engine import ReferenceEngine
    from specbuild.tuning.holdout import check

    engine = ReferenceEngine.load(compile_spec(spec, tmp_path / "build", engine="reference"))
    held = [engine.encode(t) for t in ("def main():", "Speculative decoding is")]
    tune_ids = [engine.encode(t) for t in ("The quick brown fox", "Once upon a time")]
    result = check(
        engine,
        held,
        calibration=tune_ids,
        fixed_k=2,
        concurrency=[1, 2],
        rounds=2,
        max_tokens=8,
        log=lambda _: None,
    )
    written = spec.speculation.schedule is not None  # measured, or {1: 0} (speculation off)
    assert (engine.schedule is not None) == written  # the build carries it
    labels = ["baseline", "K=2"] + (["schedule"] if written else [])
    assert set(result["points"]) == {f"{c}/{label}" for c in (1, 2) for label in labels}
    for point in result["points"].values():
        assert point["tokens_per_s"]["n"] == 2 and point["predicted_tokens_per_s"]["n"] == 2
        ratio = point["measured_over_predicted"]
        assert ratio["n"] == 2 and ratio["min"] <= ratio["median"] <= ratio["max"] and ratio["min"] > 0
        own = point["measured_over_cost_model"]  # the same with the run's own rounds
        assert own["n"] == 2 and own["min"] <= own["median"] <= own["max"] and own["min"] > 0
    assert set(result["schedule_over_fixed"]) == ({1, 2} if written else set())


def test_write_when_speculation_never_pays_leaves_a_spec_that_does_not_speculate(tmp_path):
    """A draft that never agrees (acceptance 0 at every position): no K > 0 beats K=0 even at one request
    in flight. `--write` must leave what the measurement says, speculation off on every flow, and say so
    (it used to write max_draft_len 1 and no schedule: a spec that speculates at every load)."""
    from pathlib import Path

    import yaml

    from specbuild.builder.compile import llmapi_models
    from specbuild.builder.llmapi import llmapi_options
    from specbuild.builder.memory_plan import plan_memory
    from specbuild.cli.tuning import written_lines
    from specbuild.core.perf.schedule import schedule_of
    from specbuild.core.spec import load_spec
    from specbuild.tuning.cost_curve import predict
    from specbuild.tuning.tune import _write
    from specbuild.tuning.tune_report import Setting, TuneReport

    pred = predict(_curve(8), [0.0, 0.0, 0.0, 0.0])
    assert pred.chosen[1] == 0 and any("does not pay" in n for n in pred.notes)
    example = Path(__file__).resolve().parents[1] / "examples" / "llama33-70b-1b.yaml"
    raw = yaml.safe_load(example.read_text())
    for section in ("target", "draft"):
        raw[section]["model"] = str(example.parent / raw[section]["model"])
    spec_path = tmp_path / "s.yaml"
    spec_path.write_text(yaml.safe_dump(raw))
    report = TuneReport(
        "draft_target",
        "draft_len",
        Setting("chosen", 1, 1.0, 0.9, 1),
        Setting("current", 5, 1.0, 0.7, 5),
        details={"schedule": pred.to_dict()},
    )
    written = _write(spec_path, report, inputs={})
    spec = load_spec(spec_path)
    assert spec.speculation.schedule == {1: 0} and schedule_of(spec).off
    assert all(schedule_of(spec).k_for(n) == 0 for n in (1, 2, 8))  # the BLS / reference engine: K=0
    assert any("speculation off" in line for line in written_lines(written))
    for version in ("1.2.1", "1.4.0rc4"):  # the LLM-API flow: the target alone
        s = load_spec(spec_path, overrides={"flow": "llmapi", "trtllm_version": version})
        options = llmapi_options(s, plan_memory(s), models={k: str(v) for k, v in llmapi_models(s).items()})
        assert "speculative_config" not in options and "disable_overlap_scheduler" not in options
    from specbuild.builder.compile import compile_spec
    from specbuild.model_repo.check import check_repo
    from specbuild.model_repo.generate import generate_repo

    build = compile_spec(load_spec(spec_path, overrides={"flow": "llmapi"}), tmp_path / "build")
    assert "speculative_config" not in yaml.safe_load((build / "llmapi_options.yaml").read_text())
    assert check_repo(generate_repo(build, tmp_path / "repo")) == []  # Triton's LLM-API model: target alone
