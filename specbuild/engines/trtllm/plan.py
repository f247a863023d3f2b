"""The exact `trtllm-build` (TensorRT-LLM 1.2.x) argv of each engine of a spec: pure functions.

The engines and their speculative settings come from the spec's method (`method_of(spec).roles`):
draft/target builds the target with `--speculative_decoding_mode draft_tokens_external --max_draft_len
K` and the draft as an ordinary engine (trtllm.md §4.1), Medusa one engine with `--speculative_decoding_mode
medusa` and a `--max_draft_len` that holds the tree (§3.4). Every engine gets paged context FMHA
(KV-cache reuse needs it) and, with draft logits, `--gather_generation_logits`.

`role_values` is the one list of (flag, value) pairs of an engine; `build_argv` turns it into argv
(checked against `specbuild/data/trtllm_build_flags.json`) and `recorded_build_config` into the
`build_config` trtllm-build records in the engine's config.json (with the limits trtllm-build derives,
`engine_limits`);
the reference engine folder carries the same values (core/facts/trtllm.py).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from specbuild.core.facts.trtllm import TRTLLM_BUILD, build_argv, facts_for, recorded_build_config
from specbuild.core.methods import EngineRole, method_of
from specbuild.core.spec import BuildSpec


@dataclass(frozen=True)
class RolePlan:
    role: str  # target | draft
    checkpoint_dir: str  # relative to the build folder
    output_dir: str  # relative to the build folder
    argv: tuple[str, ...]
    build_config: dict[str, Any]  # what the built engine's config.json "build_config" holds

    def to_dict(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "checkpoint_dir": self.checkpoint_dir,
            "output_dir": self.output_dir,
            "argv": list(self.argv),
            "command": shlex.join(self.argv),
            "build_config": self.build_config,
        }


def role_values(
    spec: BuildSpec, role: EngineRole, *, checkpoint_dir: str, output_dir: str
) -> list[tuple[str, Any]]:
    """(flag, value) of one engine, in argv order; None leaves a flag out (its default applies)."""
    section = spec.engine_sections()[role.role]
    b = spec.build
    return [
        ("--checkpoint_dir", checkpoint_dir),
        ("--output_dir", output_dir),
        ("--gemm_plugin", "auto"),  # GEMM plugin at the checkpoint dtype (off by default in 1.x)
        ("--gpt_attention_plugin", "auto"),
        ("--max_batch_size", b.max_batch_size),
        ("--max_input_len", b.max_input_len),
        ("--max_seq_len", b.max_seq_len),
        ("--max_beam_width", 1),  # speculative decoding is beam-free in TRT-LLM
        ("--kv_cache_type", "paged"),
        ("--use_paged_context_fmha", True),  # KV-cache reuse (draft/target README) and chunked context
        ("--remove_input_padding", True),
        ("--context_fmha", True),
        ("--workers", section.world_size),
        ("--max_num_tokens", b.max_num_tokens),
        ("--speculative_decoding_mode", role.mode),
        ("--max_draft_len", role.max_draft_len if role.mode.speculative else None),
        (
            "--gather_generation_logits",
            role.gather_generation_logits or None,
        ),  # rejection sampling needs both logits
    ]


def role_argv(spec: BuildSpec, role: EngineRole, *, checkpoint_dir: str, output_dir: str) -> list[str]:
    values = role_values(spec, role, checkpoint_dir=checkpoint_dir, output_dir=output_dir)
    return build_argv(values, facts_for(spec.trtllm_version))


def role_of(spec: BuildSpec, name: str) -> EngineRole:
    """The engine role called `name` ("target" | "draft") of the spec's method."""
    return next(r for r in method_of(spec).roles(spec) if r.role == name)


def effective_build_config(spec: BuildSpec, role: EngineRole | str) -> dict[str, Any]:
    """The engine config.json `build_config` trtllm-build would write for this role (§1.2)."""
    role = role_of(spec, role) if isinstance(role, str) else role
    values = role_values(spec, role, checkpoint_dir="", output_dir="")
    return recorded_build_config(values, facts_for(spec.trtllm_version))


def build_plan(spec: BuildSpec) -> tuple[RolePlan, ...]:
    out = []
    for role in method_of(spec).roles(spec):
        ckpt, eng = f"{role.role}/checkpoint", f"{role.role}/engine"
        values = role_values(spec, role, checkpoint_dir=ckpt, output_dir=eng)
        facts = facts_for(spec.trtllm_version)
        out.append(
            RolePlan(
                role.role, ckpt, eng, tuple(build_argv(values, facts)), recorded_build_config(values, facts)
            )
        )
    return tuple(out)


def plan_json(spec: BuildSpec, plans: tuple[RolePlan, ...]) -> dict[str, Any]:
    """`nodes` / `gpus_per_node`: the deployment the engines are built for (serving.nodes); every
    checkpoint's mapping.gpus_per_node, which trtllm-build 1.x keeps in the engine, says the same."""
    return {
        "trtllm_version": spec.trtllm_version,
        "mode": spec.mode.value,
        "gpu_host_only": True,
        "nodes": spec.serving.nodes,
        "gpus_per_node": spec.gpus_per_node,
        "roles": [p.to_dict() for p in plans],
    }


def build_script(spec: BuildSpec, plans: tuple[RolePlan, ...]) -> str:
    """build.sh: runs the plan from the build folder (relative paths); needs a GPU host."""
    lines = [
        "#!/usr/bin/env bash",
        f"# Written by `specbuild compile` for spec {spec.name!r} ({spec.mode}).",
        "# Builds the TensorRT-LLM engines from the checkpoints beside this file. Needs a GPU host with",
        f"# tensorrt_llm {spec.trtllm_version} (trtllm-build on PATH), e.g. a "
        "tritonserver:<yy.mm>-trtllm-python-py3 container.",
        "set -euo pipefail",
        'cd "$(dirname "$0")"',
        f'command -v {TRTLLM_BUILD} >/dev/null || {{ echo "{TRTLLM_BUILD} not found: run this on a GPU host '
        f'with tensorrt_llm {spec.trtllm_version}" >&2; exit 1; }}',
    ]
    for p in plans:
        eng = shlex.quote(p.output_dir)
        lines += [
            "",
            f"# {p.role} engine",
            f'if [ -f {eng}/config.json ] && grep -q \'"specbuild_engine": "reference"\' {eng}/config.json; '
            "then",
            f"  rm -rf {eng}.reference && mv {eng} {eng}.reference  # keep the CPU reference engine aside",
            "fi",
            f"{shlex.join(p.argv)} 2>&1 | tee {shlex.quote(p.role + '/build.log')}",
        ]
    return "\n".join(lines) + "\n"
