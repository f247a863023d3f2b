"""The records others read: AIPerf-named metrics and acceptance records, vLLM's per-request spec-decode
object, ModelOpt's speculation_profile.json (write, read back, refuse), the Prometheus counters."""

from __future__ import annotations

import json

import numpy as np
import pytest

from specbuild.bench.aiperf_export import metric_result, record_lines, run_export
from specbuild.bench.metrics import RequestRecord
from specbuild.bench.prometheus import SpecCounters, cross_check, parse_counters
from specbuild.core.formats.safe_io import InputFileError
from specbuild.core.formats.spec_records import aiperf_acceptance_record, vllm_spec_metrics
from specbuild.core.formats.speculation_profile import build_profile, read_speculation_profile, write_profile

# three rounds of K = 3 accepting 3, 0, 2, then a last pass with no drafts (1 token left): not a step
STEPS = ((3, 3), (0, 3), (2, 3), (0, 0))


def _record(**kw):
    base = dict(
        ttft_s=0.1,
        latency_s=0.5,
        output_tokens=9,
        target_passes=4,
        drafted=9,
        accepted=5,
        accepted_per_step=(3, 0, 2, 0),
        rounds=STEPS,
        ttst_s=0.15,
        first_chunk_tokens=4,
        prompt_tokens=20,
    )
    return RequestRecord(**{**base, **kw})


def test_vllm_spec_metrics_shape_and_values():
    m = vllm_spec_metrics(STEPS, 3)
    assert m == {
        "mean_acceptance_length": pytest.approx(1 + 5 / 3),  # float64 of a few terms: default rel 1e-6
        "draft_acceptance_rate": pytest.approx(5 / 9),  # float64, as above
        "acceptance_histogram": [1, 0, 1, 1],  # dense, length K + 1, bonus excluded
        "num_spec_steps": 3,
        "num_accepted_draft_tokens": 5,
        "num_draft_tokens": 9,
        "num_spec_tokens": 3,
        "per_step_accepted": [3, 0, 2],
        "per_step_drafted": [3, 3, 3],
    }
    none = vllm_spec_metrics([], 3, detailed=True)
    assert none["mean_acceptance_length"] == 1.0 and none["per_step_accepted"] is None


def test_aiperf_record_passes_aiperfs_validators():
    rec = aiperf_acceptance_record(STEPS, 3, engine="specbuild", completion_tokens=9)
    hist = {int(j): n for j, n in rec["acceptance_histogram"].items()}
    # SpecDecodeAcceptanceRecord's validators (aiperf 0.13.0)
    assert sum(hist.values()) == rec["num_spec_steps"] == len(rec["per_step_accepted"])
    assert (
        sum(j * n for j, n in hist.items())
        == rec["num_accepted_draft_tokens"]
        == sum(rec["per_step_accepted"])
    )
    assert rec["num_accepted_draft_tokens"] <= rec["num_draft_tokens"] == sum(rec["per_step_drafted"])
    assert all(a <= d for a, d in zip(rec["per_step_accepted"], rec["per_step_drafted"], strict=True))
    assert 0 not in [n for n in hist.values()] and rec["draft_acceptance_rate"] == pytest.approx(5 / 9)
    assert aiperf_acceptance_record([(0, 0)], 3, engine="x", completion_tokens=1) is None


def test_metric_result_is_aiperfs_json_metric_result():
    xs = [3.0, 1.0, 7.0, 2.0, 9.0]
    r = metric_result(xs, "ms")
    for q in (1, 5, 10, 25, 50, 75, 90, 95, 99):
        assert r[f"p{q}"] == pytest.approx(np.percentile(xs, q))  # linear, as numpy: float64 a few terms
    assert r["std"] == pytest.approx(np.std(xs)) and r["count"] == 5 and r["sum"] == 22.0  # ddof 0
    assert metric_result([], "ms") == {"unit": "ms"}


def test_run_export_uses_aiperfs_definitions():
    records = [_record(), _record(latency_s=0.9)]
    out = run_export(records, duration_s=2.0, num_spec_tokens=3)
    # ITL with per-chunk usage: (latency - TTFT) / (OSL - first chunk tokens)
    assert out["inter_token_latency"]["avg"] == pytest.approx(((0.4 / 5) + (0.8 / 5)) / 2 * 1000)  # float64
    assert out["inter_token_latency"]["unit"] == "ms" and out["time_to_second_token"]["avg"] == pytest.approx(
        150
    )
    assert out["output_token_throughput"] == {"unit": "tokens/sec", "avg": 9.0}
    assert out["output_token_throughput_per_user"]["unit"] == "tokens/sec/user"
    assert out["spec_decode_token_weighted_acceptance_length"]["avg"] == pytest.approx(1 + 10 / 6)
    assert out["spec_decode_overall_draft_acceptance_rate"]["avg"] == pytest.approx(100 * 10 / 18)
    assert out["pooled_spec_decode_acceptance_histogram"] == {"0": 2, "2": 2, "3": 2}
    line = record_lines(records[:1], run={"mode": "speculative"}, num_spec_tokens=3)[0]
    assert line["metrics"]["request_latency"] == {"value": pytest.approx(500.0), "unit": "ms"}
    assert line["spec_decode_acceptance"]["num_spec_steps"] == 3 and line["metadata"]["mode"] == "speculative"
    json.dumps(line)


def test_profile_matches_modelopts_example_and_round_trips(tmp_path):
    # ModelOpt's own test example (tests/test_speculation_profile.py): lengths {1:40, 2:30, 3:30} at K = 3
    steps = [(0, 3)] * 40 + [(1, 3)] * 30 + [(2, 3)] * 30
    p = build_profile([steps], num_speculative_tokens=3, method="draft_model")
    assert p["marginal_accept_rates"] == pytest.approx([0.6, 0.3, 0.0])  # rounded to 6 dp
    assert p["conditional_accept_rates"] == pytest.approx([0.6, 0.5, 0.0])
    assert p["mean_accept_length"] == pytest.approx(1.9) and p["accept_length_model"] == "chain_analytic"
    assert p["acceptance_length_histogram"] == {"1": 40, "2": 30, "3": 30}
    assert (
        p["validation"]["mean_consistency"]["passed"] and p["validation"]["marginal_monotonicity"]["passed"]
    )
    assert list(p)[:3] == ["schema_version", "measured", "method"] and p["schema_version"] == "1.0"
    back = read_speculation_profile(write_profile(p, tmp_path / "speculation_profile.json"))
    assert back.acceptance == pytest.approx([0.6, 0.5, 0.0]) and back.num_speculative_tokens == 3
    assert build_profile([steps], num_speculative_tokens=3, method="medusa")["accept_length_model"] == (
        "measured_per_k"
    )


def test_profile_reader_refuses_bad_files(tmp_path):
    good = build_profile([[(1, 2), (2, 2)]], num_speculative_tokens=2, method="draft_model")
    cases = {
        "stub": {**good, "measured": False},
        "version": {**good, "schema_version": "2.0"},
        "length": {**good, "conditional_accept_rates": [0.5]},
        "range": {**good, "conditional_accept_rates": [0.5, 1.5]},
        "k": {**good, "num_speculative_tokens": 0},
    }
    for name, data in cases.items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(data))
        with pytest.raises(InputFileError):
            read_speculation_profile(path)
    only_marginal = {k: v for k, v in good.items() if k != "conditional_accept_rates"}
    (tmp_path / "m.json").write_text(
        json.dumps({**only_marginal, "measurement_conditions": {"cost_ratio": 0.2}})
    )
    back = read_speculation_profile(tmp_path / "m.json")
    assert back.acceptance == pytest.approx(good["conditional_accept_rates"]) and back.cost_ratio == 0.2


PAGE = """# HELP trtllm_spec_decode_num_draft_tokens_total Draft tokens verified
# TYPE trtllm_spec_decode_num_draft_tokens_total counter
trtllm_spec_decode_num_draft_tokens_total{model="tensorrt_llm"} 12
trtllm_spec_decode_num_draft_tokens_total{model="other"} 99
# TYPE trtllm_spec_decode_num_accepted_tokens_total counter
trtllm_spec_decode_num_accepted_tokens_total{model="tensorrt_llm"} 7
# TYPE specbuild_spec_decode_num_steps_total counter
specbuild_spec_decode_num_steps_total{model="tensorrt_llm"} 4
# TYPE trtllm_spec_decode_drafted_tokens_total counter
trtllm_spec_decode_drafted_tokens_total{model="tensorrt_llm",token_position="0"} 4
trtllm_spec_decode_drafted_tokens_total{model="tensorrt_llm",token_position="1"} 4
# TYPE nv_inference_count counter
nv_inference_count{model="tensorrt_llm",version="1"} 10
"""


def test_prometheus_counters_and_cross_check():
    c = parse_counters(PAGE)
    assert (c.drafted, c.accepted, c.steps, c.drafted_per_position) == (12, 7, 4, {0: 4, 1: 4})
    delta = c.minus(SpecCounters(drafted=2, accepted=1, steps=1))
    assert cross_check(delta, drafted=10, accepted=6, steps=3)["agree"]
    assert not cross_check(delta, drafted=11, accepted=6, steps=3)["agree"]
