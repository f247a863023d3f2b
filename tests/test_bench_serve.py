"""bench-serve's checks and arithmetic without a server: what it compares must be equal (greedy tokens,
drafts or none), its ratios are medians of interleaved passes, the LLM-API target-alone repository is
the speculative one without speculative_config, the BLS timers add up, and the IPC floor repository
copies the real engine configs."""

from __future__ import annotations

import json

import pytest

from lab.benchmarks import ipc_floor
from lab.benchmarks.serve_arms import Arm, bls_breakdown, check_tokens, run_arm, summarize
from lab.benchmarks.serve_setup import BenchServeError, llmapi_speculation, without_speculation
from specbuild.core.generation import GenerationResult, SpecStats


def _result(tokens, drafted=0, passes=1):
    return GenerationResult(
        text="", token_ids=list(tokens), stats=SpecStats(drafted=drafted, target_passes=passes)
    )


def _arm(k=4, local=None, remote=None):
    local = local or (lambda p: _result([1, 2, 3], drafted=4 if k else 0))
    remote = remote or (lambda p: _result([1, 2, 3], drafted=4 if k else 0))
    return Arm("engine", "speculative" if k else "baseline", k, local, remote)


def test_check_tokens_keeps_the_first_answer_and_refuses_another():
    expected = {}
    arm = _arm()
    check_tokens(arm, "in_process", "p", _result([5, 6, 7]), expected)
    check_tokens(arm, "triton", "p", _result([5, 6, 7]), expected)
    assert expected["p"] == ([5, 6, 7], "engine speculative in_process")
    with pytest.raises(BenchServeError, match="other tokens") as err:
        check_tokens(_arm(0), "triton", "p", _result([5, 9, 7]), expected)
    assert "from position 1" in str(err.value)


def test_run_arm_interleaves_and_checks_both_sides():
    order = []
    arm = _arm(
        local=lambda p: order.append(("in", p)) or _result([1, 2], drafted=3, passes=2),
        remote=lambda p: order.append(("tr", p)) or _result([1, 2], drafted=3, passes=2),
    )
    got = run_arm(arm, ["a", "b"], repeats=2, expected={})
    # warm-up on both, then prompt by prompt, in-process then Triton
    assert order == [("in", "a"), ("tr", "a")] + [("in", "a"), ("tr", "a"), ("in", "b"), ("tr", "b")] * 2
    assert got["in_process"]["tokens"] == 8 and len(got["triton"]["passes"]) == 2
    assert got["triton"]["rounds"] == 8 and got["triton"]["drafted"] == 12


def test_run_arm_refuses_a_baseline_that_drafts_and_a_speculative_run_that_does_not():
    with pytest.raises(BenchServeError, match="drafted 4"):
        run_arm(_arm(0, remote=lambda p: _result([1, 2, 3], drafted=4)), ["a"], repeats=1, expected={})
    with pytest.raises(BenchServeError, match="drafted 0"):
        run_arm(_arm(4, local=lambda p: _result([1, 2, 3])), ["a"], repeats=1, expected={})


def test_summarize_takes_the_median_of_the_per_pass_ratios():
    measured = {
        "in_process": {"passes": [100.0, 200.0, 100.0], "seconds": 3.0, "rounds": 100, "tokens": 300},
        "triton": {"passes": [90.0, 100.0, 80.0], "seconds": 4.0, "rounds": 100, "tokens": 300},
    }
    row = summarize(measured)
    assert row["ratio_per_pass"] == [0.9, 0.5, 0.8] and row["ratio"] == 0.8
    assert row["in_process_tokens_per_s"] == 100.0 and row["triton_tokens_per_s"] == 90.0
    assert row["in_process_round_ms"] == 30.0 and row["triton_round_ms"] == 40.0


def _llmapi_repo(root):
    model = root / "tensorrt_llm"
    (model / "1").mkdir(parents=True)
    options = {
        "model": "/m",
        "max_batch_size": 8,
        "speculative_config": {
            "decoding_type": "Draft_Target",
            "max_draft_len": 4,
            "speculative_model": "/d",
        },
        "triton_config": {"max_batch_size": 0, "decoupled": True},
    }
    (model / "1" / "model.yaml").write_text(json.dumps(options))  # JSON is YAML
    (model / "config.pbtxt").write_text(
        'name: "tensorrt_llm"\nparameters {\n  key: "default_num_draft_tokens"\n  value {\n'
        '    string_value: "4"\n  }\n}\nparameters {\n  key: "speculation_method"\n  value {\n'
        '    string_value: "draft_target"\n  }\n}\n'
    )
    return root


def test_without_speculation_drops_speculative_config_and_reports_k_zero(tmp_path):
    repo = _llmapi_repo(tmp_path / "repo")
    plain = without_speculation(repo, tmp_path / "plain")
    assert llmapi_speculation(repo)["max_draft_len"] == 4  # the input is left as it was
    assert llmapi_speculation(plain) == {}
    config = (plain / "tensorrt_llm" / "config.pbtxt").read_text()
    assert 'string_value: "0"' in config and 'string_value: "draft_target"' in config
    assert "triton_config" in (plain / "tensorrt_llm" / "1" / "model.yaml").read_text()
    with pytest.raises(BenchServeError, match="no speculative_config"):
        without_speculation(plain, tmp_path / "again")


def test_bls_breakdown_leaves_the_bls_own_code():
    rows = [
        {
            "handle_ns": 100_000_000,
            "exec_ns": {"tensorrt_llm": 60_000_000, "tensorrt_llm_draft": 20_000_000},
            "calls": {"tensorrt_llm": 10, "tensorrt_llm_draft": 10},
            "send_ns": 5_000_000,
            "sends": 11,
            "ask_ns": 3_000_000,
            "asks": 12,
        }
    ]
    b = bls_breakdown(rows, rounds=10, engine_ms={"draft": 1.5, "target": 5.5})
    assert b["handle_ms"] == 10.0 and b["exec_ms"] == {"tensorrt_llm": 6.0, "tensorrt_llm_draft": 2.0}
    assert b["send_ms"] == 0.5 and b["ask_ms"] == 0.3 and b["own_code_ms"] == 1.2
    assert b["hop_ms"] == {"draft": 0.5, "target": 0.5} and b["statistics_time_the_calls"]
    # a callee answering from its own thread: Triton's statistics see ~nothing of the call
    late = bls_breakdown(rows, rounds=10, engine_ms={"draft": 0.1, "target": 0.1})
    assert not late["statistics_time_the_calls"]
    assert b["sends_per_round"] == 1.1 and b["asks_per_round"] == 1.2


def test_floor_repository_serves_the_real_engine_configs_with_a_noop_model(tmp_path):
    real = tmp_path / "real"
    for name in ("tensorrt_llm", "tensorrt_llm_draft"):
        (real / name).mkdir(parents=True)
        (real / name / "config.pbtxt").write_text(f'name: "{name}"\nmax_batch_size: 8\ninput {{\n}}\n')
    repo = ipc_floor.build_floor_repo(real, tmp_path / "floor")
    assert sorted(p.name for p in repo.iterdir()) == ["floor_caller", "floor_draft", "floor_target"]
    assert (
        (repo / "floor_draft" / "config.pbtxt")
        .read_text()
        .startswith('name: "floor_draft"\nmax_batch_size: 8')
    )
    assert "decoupled: true" in (repo / "floor_caller" / "config.pbtxt").read_text()
    assert "InferenceRequest" in (repo / "floor_caller" / "1" / "model.py").read_text()
    (real / "tensorrt_llm" / "config.pbtxt").write_text("max_batch_size: 8\n")
    with pytest.raises(ValueError, match="no name line"):
        ipc_floor.build_floor_repo(real, tmp_path / "floor")


def test_floor_summary_skips_the_warm_up_calls():
    times = {piece: [10_000_000] * 10 + [1_000_000, 2_000_000, 3_000_000] for piece in ipc_floor.PIECES}
    summary = ipc_floor.summarize(times)
    assert summary["draft"]["median_ms"] == 2.0 and summary["draft"]["mean_ms"] == 2.0
    assert ipc_floor.round_floor_ms(summary, cancel_asks=1, sends=1) == 2 * 2 + 2 + 2 + 2 + 2


def test_floor_repository_adds_the_engine_probe_for_a_build(tmp_path):
    real = tmp_path / "real"
    for name in ("tensorrt_llm", "tensorrt_llm_draft"):
        (real / name).mkdir(parents=True)
        (real / name / "config.pbtxt").write_text(f'name: "{name}"\n')
    build = tmp_path / "the build"
    repo = ipc_floor.build_floor_repo(real, tmp_path / "floor", engine_build=build)
    config = (repo / "probe_engine" / "config.pbtxt").read_text()
    assert f'string_value: "{build}"' in config and 'name: "probe_engine"' in config
    assert "time_engine_pieces" in (repo / "probe_engine" / "1" / "model.py").read_text()
    with pytest.raises(ValueError, match="quotes"):
        ipc_floor.build_floor_repo(real, tmp_path / "floor", engine_build=tmp_path / 'a"b')


@pytest.mark.numeric
def test_engine_probe_times_both_pieces_on_a_real_engine(tmp_path_factory, tiny_target, tiny_draft):
    import torch
    from repo_builds import cached_build

    from lab.benchmarks.floor_models_probe import PIECES, time_engine_pieces
    from specbuild.engines.reference.engine import ReferenceEngine

    threads = torch.get_num_threads()
    build = cached_build(tmp_path_factory, "dt", "draft_target", target=tiny_target, draft=tiny_draft)
    engine = ReferenceEngine.load(build)
    got = time_engine_pieces(engine, reps=2, prompt_len=6, draft_len=2, max_tokens=5)
    torch.set_num_threads(threads)
    assert set(got) == set(PIECES) == set(ipc_floor.PROBE_PIECES)
    assert all(len(v) == 2 and all(t > 0 for t in v) for v in got.values())
