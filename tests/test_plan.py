"""`specbuild plan`: the capacity arithmetic, the seed's worked case, plans from a measured bench report
and from the prediction, and the CLI outputs (table, plan.json, plan.png)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from specbuild.core.errors import PlanError
from specbuild.core.perf import capacity as C
from specbuild.core.perf import theory

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "examples" / "llama33-70b-1b.yaml"
DEMO_BENCH = ROOT / "tests" / "data" / "plan" / "demo_draft_target_bench.json"
DEMO_SPEC = ROOT / "examples" / "demo" / "draft_target.yaml"


def _plan(spec_path, **kw):
    from specbuild.core.spec import load_spec
    from specbuild.planning.plan import PlanRequest, make_plan

    traffic = kw.pop("traffic")
    return make_plan(load_spec(spec_path), PlanRequest(traffic, **kw))


def test_seed_worked_case_reproduces_and_refutes_16_to_8():
    """100M generated tokens/day at 45 vs 105 tok/s per GPU: 1,157 tok/s, 25.7 vs 11.0 GPUs ideally;
    in TP4 replicas 28 vs 12 GPUs, so "16 -> 8" does not follow at any utilisation <= 100 %."""
    t = C.make_traffic(input_len=512, output_len=256, tokens_per_day=100e6)
    assert t.avg_output_tok_s == pytest.approx(1157.407, abs=1e-3)
    plan = _plan(SEED, traffic=t, stated=(45, 105), gpu="h100", claim=(16, 8))
    b, s = plan.sizings["baseline"], plan.sizings["speculative"]
    assert b.gpus_ideal_average == pytest.approx(1e8 / 86400 / 45)  # 25.72
    assert s.gpus_ideal_average == pytest.approx(1e8 / 86400 / 105)  # 11.02
    assert (b.gpus_per_replica, s.gpus_per_replica) == (4, 4)  # TP 4; the 1B draft shares GPU 0
    assert (b.replicas, b.gpus, s.replicas, s.gpus) == (7, 28, 3, 12)
    assert b.cost_per_day == pytest.approx(28 * 24 * 3.00)  # the documented H100 default price
    assert plan.claim["holds"] is False
    low, high = plan.claim["window"]["peak_tok_s"]
    assert (low, high) == pytest.approx((540.0, 720.0))  # 3..4 baseline replicas x 180 tok/s
    assert plan.claim["window"]["of_average"] == pytest.approx(
        (540 / t.avg_output_tok_s, 720 / t.avg_output_tok_s)
    )
    # every row of the sensitivity table needs more than 16 baseline GPUs
    assert all(r["baseline"] > 16 for r in plan.sensitivity)


def test_seed_claim_holds_when_the_day_counts_prompt_tokens_equally():
    """If the 100M counts prompt + generated tokens of equal length (generated share 1/2), at average
    load and 100 % utilisation: 578.7 tok/s -> 4 x 4 = 16 GPUs vs 2 x 4 = 8 GPUs."""
    t = C.make_traffic(input_len=256, output_len=256, tokens_per_day=100e6, counts="total")
    plan = _plan(SEED, traffic=t, stated=(45, 105), gpu="h100", claim=(16, 8))
    assert plan.claim["holds"] is True
    assert (plan.sizings["baseline"].gpus, plan.sizings["speculative"].gpus) == (16, 8)
    # and a 1.5x peak breaks it again
    t15 = C.make_traffic(input_len=256, output_len=256, tokens_per_day=100e6, counts="total", peak_factor=1.5)
    assert _plan(SEED, traffic=t15, stated=(45, 105), gpu="h100", claim=(16, 8)).claim["holds"] is False


def test_traffic_inputs():
    t = C.make_traffic(input_len=100, output_len=200, tokens_per_day=86_400 * 10, peak_rps=0.2)
    assert t.avg_output_tok_s == 10 and t.peak_output_tok_s == pytest.approx(40) and t.peak_factor == 4
    with pytest.raises(PlanError, match="over-determined"):
        C.make_traffic(input_len=1, output_len=1, tokens_per_day=1e6, peak_rps=1, peak_factor=2)
    with pytest.raises(PlanError, match="below the average"):
        C.make_traffic(input_len=1, output_len=10, tokens_per_day=86_400 * 100, peak_rps=1)
    with pytest.raises(PlanError, match="no traffic"):
        C.make_traffic(input_len=1, output_len=1)
    with pytest.raises(PlanError, match="peak factor"):
        C.make_traffic(input_len=1, output_len=1, tokens_per_day=1e6, peak_factor=0.5)


def test_alpha_break_even_is_where_the_predicted_speedup_is_one():
    for k, c in ((5, 0.05), (6, 0.169), (2, 0.4)):
        a = C.alpha_break_even(k, c)
        assert theory.predicted_speedup(a, k, c) == pytest.approx(1.0, abs=1e-9)
        assert theory.predicted_speedup(a + 0.01, k, c) > 1 > theory.predicted_speedup(a - 0.01, k, c)
    assert C.alpha_break_even(2, 1.0) is None  # a draft as slow as the target never pays


def test_operating_point_respects_the_objective_and_unknowns():
    curve = C.Curve(
        "speculative",
        "measured",
        1,
        (C.Point(1, 100.0, 50, 10, 700), C.Point(4, 250.0, 120, 20, 1500), C.Point(8, 300.0, None, 40, None)),
    )
    assert C.operating_point(curve, C.Objective()).point.concurrency == 8
    assert C.operating_point(curve, C.Objective(itl_p99_ms=25)).point.concurrency == 4
    op = C.operating_point(curve, C.Objective(ttft_p99_ms=200))
    assert op.point.concurrency == 8 and any("unknown" in n for n in op.notes)  # unknown: noted, not failed
    assert (
        C.size(
            C.make_traffic(input_len=1, output_len=1, peak_rps=1),
            curve,
            C.Objective(itl_p99_ms=5),
            utilisation=1,
            price_per_gpu_hour=1,
        )
        is None
    )


def test_concurrency_break_even_interpolates():
    base = C.Curve("baseline", "measured", 1, (C.Point(1, 100.0), C.Point(4, 300.0), C.Point(16, 800.0)))
    spec = C.Curve("speculative", "measured", 1, (C.Point(1, 200.0), C.Point(4, 330.0), C.Point(16, 600.0)))
    # ratio 1.1 at 4, 0.75 at 16: crosses 1 at 4 + 12 * 0.1 / 0.35
    assert C.concurrency_break_even(base, spec) == pytest.approx(4 + 12 * 0.1 / 0.35)


def test_plan_from_the_demo_bench_report_is_measured():
    t = C.make_traffic(input_len=32, output_len=64, tokens_per_day=10e6, peak_factor=2)
    plan = _plan(DEMO_SPEC, traffic=t, bench=DEMO_BENCH, price_per_gpu_hour=3.0)
    assert plan.labels == {"baseline": "measured", "speculative": "measured"}
    data = json.loads(DEMO_BENCH.read_text())
    best = {
        m: max(r["metrics"]["output_token_throughput"] for r in data["runs"] if r["mode"] == m)
        for m in ("baseline", "speculative")
    }
    for name in ("baseline", "speculative"):
        s = plan.sizings[name]
        assert s.tokens_per_s_per_replica == pytest.approx(best[name])
        assert s.replicas == math.ceil(t.peak_output_tok_s / best[name])
    assert any("not streamed" in n for n in plan.notes)  # the demo's baseline answered in one response
    assert plan.break_even.alpha is not None and plan.break_even.alpha_inputs["cost_ratio"] == pytest.approx(
        data["context"]["cost_ratio"]
    )
    # an ITL objective the speculative runs only meet at concurrency 1
    strict = _plan(
        DEMO_SPEC, traffic=t, bench=DEMO_BENCH, price_per_gpu_hour=3.0, objective=C.Objective(itl_p99_ms=15)
    )
    assert strict.sizings["speculative"].concurrency == 1


def test_predicted_plan_is_labelled_and_uses_the_memory_plan():
    t = C.make_traffic(input_len=512, output_len=256, tokens_per_day=100e6)
    plan = _plan(SEED, traffic=t, gpu="h100")
    assert set(plan.labels.values()) == {"predicted"}
    assert any("PREDICTED" in n for n in plan.notes) and any("assumed acceptance" in n for n in plan.notes)
    base, spec = plan.curves[:2]
    assert max(p.concurrency for p in base.points) == 8  # the seed's build.max_batch_size
    # at low load speculation wins (memory bound); its advantage shrinks as the batch grows
    ratios = [s.tokens_per_s / b.tokens_per_s for b, s in zip(base.points, spec.points, strict=True)]
    assert ratios[0] > 1.5 and ratios[-1] < ratios[0]


def test_profile_scales_a_measured_baseline(tmp_path):
    profile = tmp_path / "tune.json"
    profile.write_text(
        json.dumps(
            {
                "mode": "draft_target",
                "tunes": "draft_len",
                "chosen": {},
                "current": {},
                "details": {"acceptance_per_position": [0.8] * 6, "cost_ratio": 0.1},
            }
        )
    )
    bench = json.loads(DEMO_BENCH.read_text())
    bench["runs"] = [r for r in bench["runs"] if r["mode"] == "baseline"]
    only_base = tmp_path / "bench.json"
    only_base.write_text(json.dumps(bench))
    t = C.make_traffic(input_len=32, output_len=64, tokens_per_day=10e6)
    plan = _plan(DEMO_SPEC, traffic=t, bench=only_base, profile=profile, price_per_gpu_hour=1.0)
    k = plan.k  # the spec's K (examples/demo/draft_target.yaml)
    s = theory.speedup(theory.tokens_per_pass_chain([0.8] * 6, k), k, 0.1)
    assert plan.labels["speculative"] == "profile"
    assert plan.sizings["speculative"].tokens_per_s_per_replica == pytest.approx(
        plan.sizings["baseline"].tokens_per_s_per_replica * s
    )
    with pytest.raises(PlanError, match="profile and measured"):
        _plan(DEMO_SPEC, traffic=t, bench=DEMO_BENCH, profile=profile, price_per_gpu_hour=1.0)


def test_cli_writes_table_json_and_png(tmp_path):
    from typer.testing import CliRunner

    from specbuild.cli import app

    out = tmp_path / "plan"
    r = CliRunner().invoke(
        app,
        [
            "plan",
            str(SEED),
            "--tokens-per-day",
            "100M",
            "--stated",
            "45,105",
            "--gpu",
            "h100",
            "--claim",
            "16,8",
            "--out",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    assert "25.7 GPUs" in r.output and "11.0 GPUs" in r.output and "does NOT hold" in r.output
    data = json.loads((out / "plan.json").read_text())
    assert data["sizings"]["baseline"]["gpus"] == 28 and data["sizings"]["speculative"]["gpus"] == 12
    assert (out / "plan.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = CliRunner().invoke(app, ["plan", str(SEED), "--tokens-per-day", "lots"])
    assert bad.exit_code != 0 and "not a number" in bad.output


# ---- n-gram: no draft model, no draft passes ------------------------------------------------------


def _ngram_seed(tmp_path: Path) -> Path:
    """The seed's target alone, drafting n-grams at the seed's K."""
    import yaml

    raw = yaml.safe_load(SEED.read_text())
    raw.update(mode="ngram", ngram={"max_matching_ngram_size": 2})
    del raw["draft"]
    raw["target"]["model"] = str(SEED.parent / raw["target"]["model"])
    path = tmp_path / "ngram.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_ngram_plan_has_no_draft_memory_and_no_draft_passes(tmp_path):
    from specbuild.builder.memory_plan import plan_memory
    from specbuild.core.spec import load_spec

    ngram = _ngram_seed(tmp_path)
    dt_memory, ng_memory = plan_memory(load_spec(SEED)), plan_memory(load_spec(ngram))
    assert ng_memory.engine("draft") is None and dt_memory.engine("draft") is not None
    assert ng_memory.kv_tokens > dt_memory.kv_tokens  # the draft's weights and KV are free for the target
    t = C.make_traffic(input_len=512, output_len=256, tokens_per_day=100e6)
    dt, ng = (_plan(p, traffic=t, gpu="h200", alpha=0.6) for p in (SEED, ngram))
    assert ng.k == dt.k == 5 and ng.curves[1].gpus_per_replica == 4  # TP 4, nothing beside it
    # the same E (alpha 0.6, K 5): the n-gram round is one verify pass, the d/t round adds K draft steps
    assert ng.curves[1].points[0].itl_p99_ms < dt.curves[1].points[0].itl_p99_ms
    assert ng.curves[0].points[0] == dt.curves[0].points[0]  # the same target alone at concurrency 1
    assert ng.break_even.alpha is None and dt.break_even.alpha is not None  # c = 0: no break-even alpha
    assert any("rough stand-in" in n for n in ng.notes) and not any("rough stand-in" in n for n in dt.notes)


def _ngram_tune_report(path: Path) -> Path:
    def setting(label, k, n, e, s):
        value = {"speculation.max_draft_len": k, "ngram.max_matching_ngram_size": n}
        return {"label": label, "value": value, "tokens_per_pass": e, "speedup": s, "size": k}

    report = {
        "mode": "ngram",
        "tunes": "ngram",
        "chosen": setting("chosen", 4, 2, 2.0, 1.6),
        "current": setting("current", 5, 3, 1.5, 1.2),
        "details": {
            "chosen_profile": {"acceptance_per_position": [0.5, 0.4, 0.3, 0.2]},
            "current_profile": {"acceptance_per_position": [0.4, 0.3, 0.2, 0.1, 0.1]},
        },
    }
    path.write_text(json.dumps(report))
    return path


def test_ngram_profile_is_the_setting_the_spec_has(tmp_path):
    """`tune --json` of an n-gram spec: E and the mean verify cost (E / speedup) of chosen or current."""
    from specbuild.core.spec import load_spec
    from specbuild.planning.plan import _tuned_value
    from specbuild.planning.profile import read_profile

    report = _ngram_tune_report(tmp_path / "tune.json")
    demo = ROOT / "examples" / "demo" / "ngram.yaml"  # K 4, N 2: the report's chosen setting
    chosen = read_profile(report, setting_value=_tuned_value(load_spec(demo)))
    assert chosen.tokens_per_pass(4) == 2.0 and chosen.speedup(4) == pytest.approx(1.6)
    assert "chosen" in chosen.source and chosen.alpha == pytest.approx(0.35)
    current = read_profile(report, setting_value={"speculation.max_draft_len": 5})
    assert current.tokens_per_pass(5) == 1.5 and current.speedup(5) == pytest.approx(1.2)

    bench = json.loads(DEMO_BENCH.read_text())
    bench["runs"] = [r for r in bench["runs"] if r["mode"] == "baseline"]
    only_base = tmp_path / "bench.json"
    only_base.write_text(json.dumps(bench))
    t = C.make_traffic(input_len=32, output_len=64, tokens_per_day=10e6)
    plan = _plan(demo, traffic=t, bench=only_base, profile=report, price_per_gpu_hour=1.0)
    assert plan.labels["speculative"] == "profile"
    assert plan.sizings["speculative"].tokens_per_s_per_replica == pytest.approx(
        plan.sizings["baseline"].tokens_per_s_per_replica * 1.6
    )
