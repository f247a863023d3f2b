"""Golden trtllm-build argv per role and mode; every flag and value checked against the accepted list."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specbuild.core.errors import BuildError
from specbuild.core.facts.trtllm import validate_argv
from specbuild.core.spec import spec_from_dict
from specbuild.engines.trtllm.plan import build_plan, build_script, effective_build_config

# trtllm-build's arguments as read upstream (tests/data/trtllm_build_flags_upstream.json: build.py and
# plugin.py), not specbuild's own record (specbuild/data/trtllm_build_flags.json)
FLAGS = json.loads((Path(__file__).parent / "data" / "trtllm_build_flags_upstream.json").read_text())["flags"]

COMMON = [
    "--gemm_plugin",
    "auto",
    "--gpt_attention_plugin",
    "auto",
    "--max_batch_size",
    "4",
    "--max_input_len",
    "100",
    "--max_seq_len",
    "300",
    "--max_beam_width",
    "1",
    "--kv_cache_type",
    "paged",
    "--use_paged_context_fmha",
    "enable",
    "--remove_input_padding",
    "enable",
    "--context_fmha",
    "enable",
]


def spec(**over):
    raw = {
        "name": "t",
        "mode": "draft_target",
        "target": {"model": "tgt", "tp_size": 2},
        "draft": {"model": "drf"},
        "speculation": {"max_draft_len": 6},
        "build": {"max_batch_size": 4, "max_input_len": 100, "max_seq_len": 300},
    }
    raw.update(over)
    return spec_from_dict(raw)


def check_flags(argv: list[str]) -> None:
    """Independent of plan.validate_argv: each flag known, each value of the listed kind."""
    assert argv[0] == "trtllm-build"
    i = 1
    while i < len(argv):
        kind = FLAGS[argv[i]]
        if kind == "bool":
            i += 1
            continue
        value = argv[i + 1]
        if isinstance(kind, list):
            assert value in kind, (argv[i], value)
        elif kind == "int":
            assert int(value) >= 0
        i += 2


def by_role(s):
    return {p.role: p for p in build_plan(s)}


def test_draft_target_argv():
    plans = by_role(spec())
    assert list(plans["target"].argv) == [
        "trtllm-build",
        "--checkpoint_dir",
        "target/checkpoint",
        "--output_dir",
        "target/engine",
        *COMMON,
        "--workers",
        "2",
        "--speculative_decoding_mode",
        "draft_tokens_external",
        "--max_draft_len",
        "6",
    ]
    assert list(plans["draft"].argv) == [
        "trtllm-build",
        "--checkpoint_dir",
        "draft/checkpoint",
        "--output_dir",
        "draft/engine",
        *COMMON,
        "--workers",
        "1",
    ]
    for p in plans.values():
        check_flags(list(p.argv))


def test_draft_target_use_logits_on_both_and_max_num_tokens():
    plans = by_role(
        spec(
            speculation={"max_draft_len": 4, "use_logits": True},
            build={"max_batch_size": 4, "max_input_len": 100, "max_seq_len": 300, "max_num_tokens": 2048},
        )
    )
    for role in ("target", "draft"):
        argv = list(plans[role].argv)
        check_flags(argv)
        assert argv[-1] == "--gather_generation_logits" and argv.count("--gather_generation_logits") == 1
        assert argv[argv.index("--max_num_tokens") + 1] == "2048"
    assert "--speculative_decoding_mode" not in plans["draft"].argv


def test_medusa_argv_holds_the_tree():
    s = spec(
        mode="medusa",
        draft=None,
        target={"model": "tgt", "tp_size": 1, "pp_size": 2},
        medusa={"heads": "h", "num_heads": 4, "choices": "mc_sim_7b_63"},
        speculation={"max_draft_len": 63},
    )
    plans = build_plan(s)
    assert [p.role for p in plans] == ["target"]
    argv = list(plans[0].argv)
    check_flags(argv)
    assert argv == [
        "trtllm-build",
        "--checkpoint_dir",
        "target/checkpoint",
        "--output_dir",
        "target/engine",
        *COMMON,
        "--workers",
        "2",
        "--speculative_decoding_mode",
        "medusa",
        "--max_draft_len",
        "63",
    ]


def test_effective_build_config_mirrors_trtllm_build():
    s = spec(
        speculation={"max_draft_len": 5},
        build={"max_batch_size": 2000, "max_input_len": 100, "max_seq_len": 300},
    )
    target, draft = effective_build_config(s, "target"), effective_build_config(s, "draft")
    # SpeculativeDecodingMode is an IntFlag: DRAFT_TOKENS_EXTERNAL = 2, NONE = 1 (modeling_utils.py)
    assert (target["speculative_decoding_mode"], target["max_draft_len"]) == (2, 5)
    assert target["max_seq_len"] == 305 and target["max_num_tokens"] == 2000 * 6  # raised to batch*(K+1)
    assert (
        draft["speculative_decoding_mode"],
        draft["max_draft_len"],
        draft["max_seq_len"],
        draft["max_num_tokens"],
    ) == (1, 0, 300, 8192)
    assert (target["opt_num_tokens"], draft["opt_num_tokens"]) == (
        2000,
        2000,
    )  # min(batch x beam, max_num_tokens)
    assert (
        target["plugin_config"]["use_paged_context_fmha"] is True
        and target["gather_generation_logits"] is False
    )


def test_validate_argv_rejects_unknown_flags_and_values():
    with pytest.raises(BuildError, match="does not accept --max_draft_tokens"):
        validate_argv(["trtllm-build", "--max_draft_tokens", "4"])
    with pytest.raises(BuildError, match="does not accept 'draft_target'"):
        validate_argv(["trtllm-build", "--speculative_decoding_mode", "draft_target"])
    with pytest.raises(BuildError, match="needs a value"):
        validate_argv(["trtllm-build", "--max_batch_size"])
    with pytest.raises(BuildError):
        validate_argv(["trtllm-build", "--max_batch_size", "many"])


def test_build_script_runs_the_plan(tmp_path):
    """build.sh calls trtllm-build with exactly the planned argv, from its own folder."""
    import os
    import subprocess

    s = spec(speculation={"max_draft_len": 3, "use_logits": True})
    plans = build_plan(s)
    (tmp_path / "build.sh").write_text(build_script(s, plans))
    for p in plans:
        (tmp_path / p.role).mkdir()
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "trtllm-build").write_text('#!/usr/bin/env bash\necho "$@" >> "$PWD/calls.txt"\n')
    (fake / "trtllm-build").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    subprocess.run(["bash", str(tmp_path / "build.sh")], check=True, env=env, cwd="/", capture_output=True)
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    assert calls == [" ".join(p.argv[1:]) for p in plans]
    missing = subprocess.run(
        ["bash", str(tmp_path / "build.sh")],
        env={**os.environ, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 1 and "GPU host" in missing.stderr


def test_specbuilds_flag_record_agrees_with_upstream():
    """specbuild/data/trtllm_build_flags.json (what build_argv checks against) against the flags read
    upstream: every recorded flag exists, store_true flags are bool on both sides, and where upstream
    lists the choices, specbuild's are the same."""
    from specbuild.core.facts.trtllm import _accepted_flags

    ours = _accepted_flags()
    assert set(ours) <= set(FLAGS), set(ours) - set(FLAGS)
    for flag, kind in ours.items():
        up = FLAGS[flag]
        assert (kind == "bool") == (up == "bool"), (flag, kind, up)
        if isinstance(up, list):
            assert kind == up, (flag, kind, up)
        if up == "int":
            assert kind == "int", (flag, kind)
