"""lab/benchmarks/ab.py: two servers compared in interleaved rounds (A, B, A again; reversed every other
round), B / A read against the A/A of the same run, CPU seconds per run by model process."""

from __future__ import annotations

import pytest

from lab.benchmarks import ab


def test_every_round_runs_a_b_and_a_again_in_alternating_order():
    assert ab.plan(2, (8, 4)) == [
        (0, 8, "a"), (0, 8, "b"), (0, 8, "a_again"),
        (0, 4, "a"), (0, 4, "b"), (0, 4, "a_again"),
        (1, 8, "a_again"), (1, 8, "b"), (1, 8, "a"),
        (1, 4, "a_again"), (1, 4, "b"), (1, 4, "a"),
    ]  # fmt: skip


def test_b_over_a_is_read_against_the_a_a_of_the_same_run():
    rates = {"a": [100.0, 110.0, 90.0], "b": [95.0, 99.0, 90.0], "a_again": [90.0, 110.0, 99.0]}
    order = iter(ab.plan(3, (8,)))

    def run(arm, c):  # the servers' tokens/s, run by run in the plan's order
        r, cc, name = next(order)
        assert cc == c and arm.url == ("B" if name == "b" else "A")
        return rates[name][r]

    cpu_calls = iter(range(100))
    results = ab.run_ab(
        {"a": ab.Arm("A", "baseline-unary", pid=1), "b": ab.Arm("B", "schedule-unary")},
        rounds=3,
        concurrency=(8,),
        run=run,
        cpu=lambda pid: {"tensorrt_llm": float(next(cpu_calls))},  # 1 s of CPU between the two reads
    )
    row = ab.summarize(results, bar=0.97)["8"]
    # per round B / A: 0.95, 0.90, 1.00 -> median 0.95; A again / A: 0.90, 1.00, 1.10 -> down to 0.90
    assert row["b_over_a"]["median"] == pytest.approx(0.95)
    assert (row["b_over_a"]["min"], row["b_over_a"]["max"]) == pytest.approx((0.90, 1.00))
    assert row["a_a"]["median"] == pytest.approx(1.0)
    assert row["verdict"] == "within A/A"  # 0.95 < 0.97, but two runs of A differed by 10%
    assert ab.summarize(results, bar=0.95)["8"]["verdict"] == "met"
    assert row["cpu_s"] == {"a": {"tensorrt_llm": 1.0}, "a_again": {"tensorrt_llm": 1.0}}  # B had no pid
    assert row["tokens_per_s"]["b"] == pytest.approx((95 + 99 + 90) / 3)


def test_a_stub_process_is_named_by_its_model():
    stub = [
        "/tmp/specbuild-triton-x/backends/python/triton_python_backend_stub",
        "/work/build/repo/tensorrt_llm_bls/1/model.py",
        "specbuild_1_2",
        "1048576",
    ]
    assert ab._model_of(stub) == "tensorrt_llm_bls"
    assert ab._model_of(["tritonserver", "--model-repository", "/x"]) is None


def test_bad_options_get_expected_found_fix_and_no_traceback(tmp_path, capsys):
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    rc = ab.main(
        ["--a", "127.0.0.1:1", "--b", "127.0.0.1:2", "--prompts", str(prompts), "--concurrency", "8,x"]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "--concurrency" in err and "Traceback" not in err
    rc = ab.main(
        ["--a", "127.0.0.1:1", "--b", "127.0.0.1:2", "--prompts", str(prompts), "--concurrency", "999"]
    )
    assert rc == 2 and "999" in capsys.readouterr().err
