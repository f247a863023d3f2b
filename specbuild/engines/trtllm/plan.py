"""The exact `trtllm-build` (TensorRT-LLM 1.2.x) argv of each engine of a spec: pure functions.

Draft/target (trtllm.md §4.1): only the target gets `--speculative_decoding_mode draft_tokens_external
--max_draft_len K`; both get paged context FMHA (KV-cache reuse needs it) and, only with `use_logits`,
`--gather_generation_logits`. Medusa (§3.4): one engine with `--speculative_decoding_mode medusa` and a
`--max_draft_len` that holds the tree. Every flag and value is checked against
`specbuild/data/trtllm_build_flags.json` (read from TensorRT-LLM's build.py / plugin.py).

`effective_build_config` mirrors what `trtllm-build` records in the engine's config.json
(build_config.py: the limits, and speculative_decoding_mode as its IntFlag integer); the reference
engine folder and plan.json carry the same values.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from specbuild.engines.trtllm.build_config import TOKENS_PER_BLOCK, SpeculativeDecodingMode, engine_limits
from specbuild.errors import BuildError

TRTLLM_BUILD = "trtllm-build"


@dataclass(frozen=True)
class RolePlan:
    role: str  # target | draft
    checkpoint_dir: str  # relative to the build folder
    output_dir: str  # relative to the build folder
    argv: tuple[str, ...]
    build_config: dict[str, Any]  # what the built engine's config.json "build_config" holds

    def to_dict(self) -> dict[str, Any]:
        return {"role": self.role, "checkpoint_dir": self.checkpoint_dir, "output_dir": self.output_dir, "argv": list(self.argv), "command": shlex.join(self.argv), "build_config": self.build_config}


def roles(spec) -> tuple[str, ...]:
    """Engines of a spec: draft/target builds two, Medusa one (the heads live in the target)."""
    return ("target", "draft") if spec.mode == "draft_target" else ("target",)


def speculation(spec, role: str) -> tuple[str | None, int]:
    """(speculative_decoding_mode, max_draft_len) of a role's engine."""
    if spec.mode == "medusa":
        # The tree must fit: the spec validates choices.size <= max_draft_len.
        return "medusa", max(spec.speculation.max_draft_len, spec.medusa_choices().size)
    if role == "target":
        return "draft_tokens_external", spec.speculation.max_draft_len
    return None, 0  # the draft is an ordinary engine


def role_argv(spec, role: str, *, checkpoint_dir: str, output_dir: str) -> list[str]:
    section = spec.draft if role == "draft" else spec.target
    b = spec.build
    mode, max_draft_len = speculation(spec, role)
    argv = [
        TRTLLM_BUILD,
        "--checkpoint_dir", checkpoint_dir,
        "--output_dir", output_dir,
        "--gemm_plugin", "auto",  # GEMM plugin at the checkpoint dtype (off by default in 1.x)
        "--gpt_attention_plugin", "auto",
        "--max_batch_size", str(b.max_batch_size),
        "--max_input_len", str(b.max_input_len),
        "--max_seq_len", str(b.max_seq_len),
        "--max_beam_width", "1",  # speculative decoding is beam-free in TRT-LLM
        "--kv_cache_type", "paged",
        "--use_paged_context_fmha", "enable",  # KV-cache reuse (draft/target README) and chunked context
        "--remove_input_padding", "enable",
        "--context_fmha", "enable",
        "--workers", str(section.world_size),
    ]
    if b.max_num_tokens is not None:
        argv += ["--max_num_tokens", str(b.max_num_tokens)]
    if mode is not None:
        argv += ["--speculative_decoding_mode", mode, "--max_draft_len", str(max_draft_len)]
    if spec.mode == "draft_target" and spec.speculation.use_logits:
        argv += ["--gather_generation_logits"]  # both engines: rejection sampling needs both logits
    validate_argv(argv)
    return argv


def effective_build_config(spec, role: str) -> dict[str, Any]:
    """The engine config.json `build_config` trtllm-build would write for this role (build_config.py).

    A subset of BuildConfig.to_dict(): the fields later stages read, each with trtllm-build's value.
    """
    b = spec.build
    mode, k = speculation(spec, role)
    limits = engine_limits(max_batch_size=b.max_batch_size, max_input_len=b.max_input_len, max_seq_len=b.max_seq_len,
                           max_num_tokens=b.max_num_tokens, max_draft_len=k, speculative=mode is not None)
    gather = spec.mode == "draft_target" and spec.speculation.use_logits
    return {
        "max_batch_size": b.max_batch_size,
        **limits,
        "max_beam_width": 1,
        "kv_cache_type": "PAGED",
        "gather_context_logits": False,
        "gather_generation_logits": gather,
        "speculative_decoding_mode": int(SpeculativeDecodingMode.from_cli(mode)),
        "max_draft_len": k,
        "plugin_config": {
            "gemm_plugin": "auto",
            "gpt_attention_plugin": "auto",
            "use_paged_context_fmha": True,
            "context_fmha": True,
            "remove_input_padding": True,
            "paged_kv_cache": True,
            "tokens_per_block": TOKENS_PER_BLOCK,
        },
    }


def build_plan(spec) -> tuple[RolePlan, ...]:
    out = []
    for role in roles(spec):
        ckpt, eng = f"{role}/checkpoint", f"{role}/engine"
        argv = role_argv(spec, role, checkpoint_dir=ckpt, output_dir=eng)
        out.append(RolePlan(role, ckpt, eng, tuple(argv), effective_build_config(spec, role)))
    return tuple(out)


def plan_json(spec, plans: tuple[RolePlan, ...]) -> dict[str, Any]:
    return {"trtllm_version": spec.trtllm_version, "mode": spec.mode, "gpu_host_only": True, "roles": [p.to_dict() for p in plans]}


def build_script(spec, plans: tuple[RolePlan, ...]) -> str:
    """build.sh: runs the plan from the build folder (relative paths); needs a GPU host."""
    lines = [
        "#!/usr/bin/env bash",
        f"# Written by `specbuild compile` for spec {spec.name!r} ({spec.mode}).",
        "# Builds the TensorRT-LLM engines from the checkpoints beside this file. Needs a GPU host with",
        f"# tensorrt_llm {spec.trtllm_version} (trtllm-build on PATH), e.g. a tritonserver:<yy.mm>-trtllm-python-py3 container.",
        "set -euo pipefail",
        'cd "$(dirname "$0")"',
        f'command -v {TRTLLM_BUILD} >/dev/null || {{ echo "{TRTLLM_BUILD} not found: run this on a GPU host with tensorrt_llm {spec.trtllm_version}" >&2; exit 1; }}',
    ]
    for p in plans:
        eng = shlex.quote(p.output_dir)
        lines += [
            "",
            f"# {p.role} engine",
            f'if [ -f {eng}/config.json ] && grep -q \'"specbuild_engine": "reference"\' {eng}/config.json; then',
            f"  rm -rf {eng}.reference && mv {eng} {eng}.reference  # keep the CPU reference engine aside",
            "fi",
            f"{shlex.join(p.argv)} 2>&1 | tee {shlex.quote(p.role + '/build.log')}",
        ]
    return "\n".join(lines) + "\n"


# ---- validation against the accepted flags -------------------------------------------------------

@lru_cache(maxsize=1)
def accepted_flags() -> dict[str, Any]:
    from importlib import resources

    return json.loads(resources.files("specbuild.data").joinpath("trtllm_build_flags.json").read_text())["flags"]


def validate_argv(argv: list[str] | tuple[str, ...], flags: dict[str, Any] | None = None) -> None:
    """Every flag must be one trtllm-build 1.2.x accepts, with a value of the right kind."""
    flags = flags or accepted_flags()
    if not argv or argv[0] != TRTLLM_BUILD:
        raise BuildError("not a trtllm-build command", expected=TRTLLM_BUILD, found=str(argv[:1]), fix="report this bug")
    i = 1
    while i < len(argv):
        flag = argv[i]
        if flag not in flags:
            raise BuildError(f"trtllm-build does not accept {flag}", expected="a flag of TensorRT-LLM 1.2.x build.py", found=flag, fix="report this bug")
        kind = flags[flag]
        if kind == "bool":
            i += 1
            continue
        if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
            raise BuildError(f"{flag} needs a value", expected=str(kind), found="nothing", fix="report this bug")
        value = argv[i + 1]
        ok = value in kind if isinstance(kind, list) else (value.isdigit() if kind == "int" else bool(value))
        if not ok:
            raise BuildError(f"trtllm-build {flag} does not accept {value!r}", expected=" | ".join(kind) if isinstance(kind, list) else kind, found=value, fix="report this bug")
        i += 2
