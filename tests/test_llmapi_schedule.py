"""The LLM-API emission of `speculation.schedule` / `speculation.guard`: `draft_len_schedule` and the
kill-switch keys as each targeted TensorRT-LLM version spells and validates them (core/facts/llmapi.py
ScheduleRule), every written key one of upstream's llm_args.py fields (tests/data/llmapi_fields.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from specbuild.cli import app
from specbuild.core.facts.llmapi import check_options, release

DATA = Path(__file__).parent / "data"
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "llama33-70b-1b.yaml"
FIELDS = json.loads((DATA / "llmapi_fields.json").read_text())["versions"]
MBS = yaml.safe_load(EXAMPLE.read_text())["build"]["max_batch_size"]


def _compile(tmp_path, version, speculation):
    raw = yaml.safe_load(EXAMPLE.read_text())
    raw.update(flow="llmapi", trtllm_version=version)
    for section in ("target", "draft"):  # the example's models, from the copy's folder
        raw[section]["model"] = str(EXAMPLE.parent / raw[section]["model"])
    raw["speculation"] = {**raw.get("speculation", {}), **speculation}
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(raw))
    out = tmp_path / "build"
    result = CliRunner().invoke(app, ["compile", str(spec), "--out", str(out)])
    assert result.exit_code == 0, result.output
    return yaml.safe_load((out / "llmapi_options.yaml").read_text())["speculative_config"]


@pytest.mark.parametrize(
    ("version", "schedule", "guard_keys"),
    [
        ("1.2.1", {1: 5, 3: 2, 6: 0}, {"acceptance_window": 8, "acceptance_length_threshold": 2.5}),
        # 1.4 floors draft/target at K=1 (min_runtime_draft_len): the options say the K=1 that will run
        (
            "1.4.0rc4",
            {2: 5, 5: 2, MBS: 1},
            {"acceptance_rate_window_size": 8, "acceptance_rate_threshold": 0.3},
        ),
    ],
)
def test_schedule_and_guard_spelled_per_version(tmp_path, version, schedule, guard_keys):
    cfg = _compile(
        tmp_path,
        version,
        {"max_draft_len": 5, "schedule": {1: 5, 3: 2, 6: 0}, "guard": {"window": 8, "min_acceptance": 0.3}},
    )
    assert cfg["draft_len_schedule"] == schedule
    assert {k: cfg[k] for k in guard_keys} == guard_keys
    assert "max_concurrency" not in cfg  # 1.3+: exclusive with the schedule; 1.2: the schedule says it all
    for key in cfg:  # upstream declares every written key for this version (1.2.1: decoding_type a ClassVar)
        if not (key == "decoding_type" and FIELDS[version]["classvar_decoding_type"]):
            assert key in FIELDS[version]["DraftTargetDecodingConfig"], (version, key)
    assert check_options({"speculative_config": cfg}, version) == []
    # the same schedule read back the version's way gives the K the release runs at every batch size
    rule = release(version).schedule
    for n in range(1, 9):
        spec_k = rule.runtime_k("draft_target", 5 if n < 3 else 2 if n < 6 else 0)
        if release(version).schedule.style == "from":
            got = cfg["draft_len_schedule"][max(k for k in cfg["draft_len_schedule"] if k <= n)]
        else:
            keys = [k for k in cfg["draft_len_schedule"] if k >= n]
            got = cfg["draft_len_schedule"][min(keys)] if keys else rule.runtime_k("draft_target", 0)
        assert got == spec_k, (version, n)


def test_no_schedule_no_keys(tmp_path):
    cfg = _compile(tmp_path, "1.4.0rc4", {"max_draft_len": 5})
    assert not {"draft_len_schedule", "max_concurrency", "acceptance_rate_threshold"} & set(cfg)


@pytest.mark.parametrize(
    ("version", "cfg", "problem"),
    [
        ("1.2.1", {"draft_len_schedule": {2: 4}}, "batch_size=1"),
        ("1.2.1", {"draft_len_schedule": {1: 3, 4: 0}}, "must be equal"),
        ("1.4.0rc4", {"draft_len_schedule": {2: 3, 4: 1}}, "must be equal"),
        ("1.4.0rc4", {"draft_len_schedule": {2: 4, 4: 5}}, "above max_draft_len"),
        ("1.4.0rc4", {"draft_len_schedule": {2: 4}, "max_concurrency": 2}, "exclusive"),
        ("1.4.0rc4", {"max_concurrency": 0}, "0 <= 0"),
        ("1.4.0rc4", {"acceptance_rate_threshold": 1.5}, "1.5 > 1"),
        ("1.4.0rc4", {"acceptance_window": 8}, "not a DraftTargetDecodingConfig key"),
        ("1.2.1", {"acceptance_rate_window_size": 8}, "not a DraftTargetDecodingConfig key"),
        ("1.2.1", {"draft_len_schedule": {0: 4}}, "batch size >= 1"),
    ],
)
def test_check_options_applies_the_versions_validators(version, cfg, problem):
    options = {
        "speculative_config": {
            "decoding_type": release(version).method_class("draft_target").decoding_type,
            "max_draft_len": 4,
            "speculative_model": "/d",
            **cfg,
        }
    }
    problems = check_options(options, version)
    assert any(problem in p for p in problems), problems


def test_1_2_allows_max_concurrency_beside_the_schedule():
    options = {
        "speculative_config": {
            "decoding_type": "DraftTarget",
            "max_draft_len": 4,
            "speculative_model": "/d",
            "draft_len_schedule": {1: 4, 4: 0},
            "max_concurrency": 3,
        }
    }
    assert check_options(options, "1.2.1") == []


def _spec_with(tmp_path, version, speculation, mode="draft_target"):
    from specbuild.core.spec import load_spec

    raw = yaml.safe_load(EXAMPLE.read_text())
    raw.update(flow="llmapi", trtllm_version=version, speculation=speculation)
    for section in ("target", "draft"):
        raw[section]["model"] = str(EXAMPLE.parent / raw[section]["model"])
    if mode != "draft_target":
        del raw["draft"]
        raw["mode"] = mode
    path = tmp_path / f"{version}-{mode}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_spec(path)


@pytest.mark.parametrize(
    ("version", "mode", "status", "text"),
    [
        ("1.4.0rc4", "draft_target", "warn", "floors draft_target at K=1"),  # K=0 runs as K=1
        ("1.2.1", "draft_target", "warn", "no min_runtime_draft_len floor"),  # the pre-fix collapse
        ("1.2.1", "ngram", "pass", "runs 1:5,3:2,6:0"),  # no drafter state to go stale
        ("1.4.0rc4", "ngram", "pass", "runs 1:5,3:2,6:0"),  # floor 0
    ],
)
def test_check_says_what_the_release_runs_of_the_schedule(tmp_path, version, mode, status, text):
    from specbuild.builder.schedule_checks import schedule_row

    spec = _spec_with(tmp_path, version, {"max_draft_len": 5, "schedule": {1: 5, 3: 2, 6: 0}}, mode)
    row = schedule_row(spec)
    assert row.status == status and text in row.found, row


def test_plan_curve_follows_the_runtime_k(tmp_path):
    """`plan`'s schedule curve uses the K the release runs: on 1.4 draft/target's K=0 tier runs K=1, a K
    the curves do not hold (left out, said); on 1.2.1 it runs K=0, the baseline's point."""
    from specbuild.core.perf import capacity as C
    from specbuild.planning.plan import schedule_curves

    base = C.Curve("baseline", "predicted", 4, tuple(C.Point(c, 100.0 * c) for c in (1, 2, 4, 8)))
    spec_c = C.Curve("speculative", "predicted", 4, tuple(C.Point(c, 150.0 * c) for c in (1, 2, 4, 8)))
    speculation = {"max_draft_len": 5, "schedule": {1: 5, 3: 0}}
    [old] = schedule_curves(_spec_with(tmp_path, "1.2.1", speculation), base, spec_c)
    assert [p.tokens_per_s for p in old.points] == [150.0, 300.0, 400.0, 800.0]
    [new] = schedule_curves(_spec_with(tmp_path, "1.4.0rc4", speculation), base, spec_c)
    assert [p.concurrency for p in new.points] == [1, 2] and "c=4 (K=1)" in new.detail
