"""`specbuild compile`: spec -> checkpoints -> engines (TensorRT-LLM or reference), one atomic folder.

Layout of DIR: target/{checkpoint,engine}, draft/{checkpoint,engine} (draft/target only), plan.json,
build.sh, specbuild.json (kind "build": the spec, the engine kind, the tokenizer folder, the roles).
engine="trtllm" runs the plan when `trtllm-build` is on PATH (GPU hosts), logging to <role>/build.log;
otherwise, or with dry_run, the engines are left to build.sh. engine="reference" writes the
reference engine folders (engines/trtllm/engine_dir.py).
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from specbuild.builder.llmapi import OPTIONS_FILE, SERVE_SCRIPT, check_installed, llmapi_options
from specbuild.builder.preflight import FAIL, CheckReport, run_checks
from specbuild.builder.resolve import resolve_model
from specbuild.core.artifacts import RoleRecord
from specbuild.core.errors import BuildError
from specbuild.core.facts.llmapi import release
from specbuild.core.facts.trtllm import SpeculativeDecodingMode
from specbuild.core.formats.manifest import atomic_output_dir, write_manifest
from specbuild.core.formats.safe_io import atomic_write_text
from specbuild.core.launch import (
    PREFLIGHT_FILE,
    ServeLimits,
    preflight_argv,
    preflight_source,
    trtllm_serve_argv,
)
from specbuild.core.methods import method_of
from specbuild.core.pdeathsig import die_with_parent
from specbuild.engines.trtllm.convert import convert_checkpoint
from specbuild.engines.trtllm.engine_dir import write_reference_engine
from specbuild.engines.trtllm.medusa import MedusaHeadsSource
from specbuild.engines.trtllm.plan import build_plan, build_script, plan_json, role_of

ENGINES = ("reference", "trtllm")
LLMAPI_ENGINES = ("none", "reference")  # llmapi flow: options only, or also reference engines (local runs)
LOG_TAIL_LINES = 40
LOG_KEEP_BYTES = 16 << 20  # the last 16 MiB of a failed trtllm-build log are kept beside DIR
Progress = Callable[[str, int, int], None]  # (task label, done, total)


def compile_spec(
    spec,
    out: str | Path,
    *,
    engine: str | None = None,
    dry_run: bool = False,
    force: bool = False,
    on_progress: Progress | None = None,
    on_message: Callable[[str], None] | None = None,
) -> Path:
    """Convert every model of `spec` and build its engines into `out`; returns `out`.

    engine None: "reference" on the engine flow, "none" on the LLM-API flow (compile_llmapi)."""
    if not spec.flow.builds_engines:
        return compile_llmapi(spec, out, engine=engine or "none", force=force, on_progress=on_progress)
    engine = engine or "reference"
    if engine not in ENGINES:
        raise BuildError(
            f"unknown engine {engine!r}",
            expected=" | ".join(ENGINES),
            found=engine,
            fix="use --engine reference or --engine trtllm",
        )
    say = on_message or (lambda _msg: None)
    out = Path(out)
    _preflight(spec)
    plans = build_plan(spec)  # pure; fails before any conversion if a flag were wrong
    models = {
        role: resolve_model(_section(spec, role).model, base=spec.base_dir, what=role)
        for role in (p.role for p in plans)
    }
    target_heads = role_of(spec, "target").heads  # Medusa heads converted into the target's checkpoint
    heads = (
        resolve_model(target_heads.heads, base=spec.base_dir, what="medusa.heads") if target_heads else None
    )
    trtllm_build = shutil.which("trtllm-build")
    run_trtllm = engine == "trtllm" and not dry_run and trtllm_build is not None
    inputs = {
        "build spec": spec.source,
        **{f"{role} model": folder for role, folder in models.items()},
        "Medusa heads": heads,
    }
    with atomic_output_dir(out, force=force, inputs=inputs) as tmp:
        _convert(spec, plans, models, heads, tmp, on_progress)
        (tmp / "plan.json").write_text(json.dumps(plan_json(spec, plans), indent=2) + "\n")
        script = tmp / "build.sh"
        script.write_text(build_script(spec, plans))
        script.chmod(0o755)
        built = False
        if engine == "reference":
            _write_reference(spec, plans, tmp)
            built = True
        elif run_trtllm:
            for i, p in enumerate(plans):
                if on_progress:
                    on_progress("trtllm-build", i, len(plans))
                _run_trtllm_build(p, tmp, out)
                write_manifest(
                    tmp / p.output_dir,
                    reuse_nested=True,
                    kind="engine",
                    engine="trtllm",
                    checkpoint="../checkpoint",
                    build_config=p.build_config,
                    argv=list(p.argv),
                )
            if on_progress:
                on_progress("trtllm-build", len(plans), len(plans))
            built = True
        write_manifest(  # reuses the digests of the checkpoint and engine manifests just written
            tmp,
            reuse_nested=True,
            kind="build",
            spec=spec.to_dict(),
            engine=engine,
            engine_built=built,
            tokenizer_dir=str(models["target"]),
            roles={p.role: _role_record(spec, p, models[p.role], built) for p in plans},
        )
    if engine == "trtllm" and not built:
        why = "--dry-run" if dry_run else "trtllm-build is not installed here"
        say(
            f"{why}: wrote the checkpoints, {out / 'plan.json'} and {out / 'build.sh'}. "
            f"On a GPU host with tensorrt_llm {spec.trtllm_version}, run: bash {out / 'build.sh'}"
        )
    return out


def _convert(spec, plans, models: dict[str, Path], heads: Path | None, tmp: Path, on_progress) -> None:
    """Convert each role's HF folder into <role>/checkpoint (Medusa heads into the target's)."""
    for p in plans:
        section = _section(spec, p.role)
        medusa = None
        role = role_of(spec, p.role)
        if role.heads is not None:  # heads converted into this engine's checkpoint
            medusa = MedusaHeadsSource(
                heads,
                num_heads=role.heads.num_heads,
                num_layers=role.heads.num_layers,
                max_draft_len=role.max_draft_len,
            )
        label = f"convert {p.role}"
        convert_checkpoint(
            models[p.role],
            tmp / p.checkpoint_dir,
            dtype=spec.dtype,
            tp_size=section.tp_size,
            pp_size=section.pp_size,
            gpus_per_node=spec.gpus_per_node,  # the deployment's node (serving.nodes), not upstream's 8
            medusa=medusa,
            weight_only=spec.build.weight_only,
            on_progress=(lambda done, total, _name, label=label: on_progress(label, done, total))
            if on_progress
            else None,
        )


def _write_reference(spec, plans, tmp: Path) -> None:
    for p in plans:
        write_reference_engine(
            tmp / p.checkpoint_dir,
            tmp / p.output_dir,
            build_config=p.build_config,
            version=spec.trtllm_version,
        )


def _section(spec, role: str):
    return spec.engine_sections()[role]


def _role_record(spec, plan, hf_dir: Path, built: bool) -> dict[str, Any]:
    section = _section(spec, plan.role)
    return RoleRecord(
        role=plan.role,
        hf_dir=hf_dir,
        checkpoint=plan.checkpoint_dir,
        engine=plan.output_dir if built else None,
        tp_size=section.tp_size,
        pp_size=section.pp_size,
        mode=SpeculativeDecodingMode.from_recorded(plan.build_config["speculative_decoding_mode"]),
        max_draft_len=plan.build_config["max_draft_len"],
        argv=tuple(plan.argv),
    ).to_dict()


def _preflight(spec) -> CheckReport:
    """Run `specbuild check`'s preflight (builder/preflight.py); refuse to build on a fail."""
    report = run_checks(spec)
    if not report.ok:
        failed = [r for r in report.results if r.status == FAIL]
        raise BuildError(
            f"preflight failed: {len(failed)} check(s)",
            expected="every check passing (warnings are allowed)",
            found="; ".join(f"{r.name}: {r.found}" for r in failed),
            fix="; ".join(r.fix for r in failed if r.fix) or "run `specbuild check SPEC` for details",
        )
    return report


def _run_trtllm_build(plan, tmp: Path, final: Path) -> None:
    """Run one role's argv in the build folder; the log stays in <role>/build.log (and beside DIR on
    failure)."""
    log_path = tmp / plan.role / "build.log"
    with open(log_path, "w") as log:
        proc = subprocess.run(
            list(plan.argv),
            cwd=tmp,
            stdout=log,
            stderr=subprocess.STDOUT,
            check=False,
            preexec_fn=die_with_parent(),  # a killed `compile` does not leave trtllm-build running
        )
    if proc.returncode != 0:
        kept = final.parent / f"{final.name}.{plan.role}-build.log"
        # the temporary folder is removed on failure; keep the log (bounded: its tail is what matters)
        with open(log_path, "rb") as log:
            log.seek(max(0, log_path.stat().st_size - LOG_KEEP_BYTES))
            atomic_write_text(kept, log.read(LOG_KEEP_BYTES).decode(errors="replace"))
        tail = "\n".join(kept.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:])
        raise BuildError(
            f"trtllm-build failed for the {plan.role} engine (exit {proc.returncode})",
            expected="a built engine",
            found=f"log tail ({kept}):\n{tail}",
            fix="read the log; check GPU memory, tensorrt_llm version (1.2.x) and the spec's limits",
        )


# ---- the LLM-API flow ----------------------------------------------------------------------------


def llmapi_models(spec) -> dict[str, Path]:
    """section -> HF folder of every model the LLM API loads (target, and the draft / EAGLE-3 folder)."""
    models = {"target": resolve_model(spec.target.model, base=spec.base_dir, what="target model")}
    method = method_of(spec)
    ref = method.speculative_model(spec)
    if ref is not None:
        section = method.llmapi.model_section
        models[section] = resolve_model(ref, base=spec.base_dir, what=f"{section} model")
    return models


def compile_llmapi(
    spec, out: str | Path, *, engine: str = "none", force: bool = False, on_progress: Progress | None = None
) -> Path:
    """The LLM-API flow: the same preflight, then the options file, the exact trtllm-serve command
    (serve.sh) and plan.json; the PyTorch backend reads the HF folders, so nothing is converted.
    engine "reference" also writes reference engine folders (<role>/{checkpoint,engine}) so that the
    build can be served on this CPU behind the LLM-API interface (`repo --backend llmapi-local`)."""
    if engine not in LLMAPI_ENGINES:
        raise BuildError(
            f"--engine {engine} does not apply to the LLM-API flow",
            expected=" | ".join(LLMAPI_ENGINES),
            found=engine,
            fix="drop --engine (the PyTorch backend builds no engines), or --engine reference to also write "
            "reference engines for local serving",
        )
    method = method_of(spec)
    if engine == "reference" and method.reference_decoder is None:
        raise BuildError(
            f"the reference engine does not run {method.title}",
            expected="a method the reference engine implements (draft/target, n-gram, EAGLE-3)",
            found=str(spec.mode),
            fix="drop --engine reference: the options and the trtllm-serve command are for a GPU host",
        )
    out = Path(out).resolve()
    report = _preflight(spec)
    models = llmapi_models(spec)
    options = llmapi_options(spec, report.plan, models={k: str(v) for k, v in models.items()})
    installed = check_installed(options, spec.trtllm_version, model=str(models["target"]))
    argv = trtllm_serve_argv(
        str(models["target"]),
        str(out / OPTIONS_FILE),
        ServeLimits.from_options(options),
        version=spec.trtllm_version,
    )
    plans = build_plan(spec) if engine == "reference" else ()
    inputs = {"build spec": spec.source, **{f"{role} model": folder for role, folder in models.items()}}
    with atomic_output_dir(out, force=force, inputs=inputs) as tmp:
        header = (
            f"# LLM-API options written by `specbuild compile --flow llmapi` for spec {spec.name!r} "
            f"({spec.mode}),\n"
            f"# TensorRT-LLM {spec.trtllm_version} (keys: core/facts/llmapi.py). trtllm-serve --config, or "
            "Dynamo --extra-engine-args.\n"
        )
        (tmp / OPTIONS_FILE).write_text(header + yaml.safe_dump(options, sort_keys=False))
        (tmp / PREFLIGHT_FILE).write_text(preflight_source())
        preflight = preflight_argv(
            str(out / PREFLIGHT_FILE), str(out / OPTIONS_FILE), version=spec.trtllm_version, model=argv[2]
        )
        script = tmp / SERVE_SCRIPT
        script.write_text(_serve_script(spec, argv, preflight))
        script.chmod(0o755)
        rel = release(spec.trtllm_version)
        (tmp / "plan.json").write_text(
            json.dumps(
                {
                    "flow": spec.flow.value,
                    "trtllm_version": spec.trtllm_version,
                    "mode": spec.mode.value,
                    "gpu_host_only": True,
                    "decoding_type": (options.get("speculative_config") or {}).get("decoding_type"),
                    "options_file": OPTIONS_FILE,
                    "options": options,
                    "trtllm_serve": {"argv": argv, "command": shlex.join(argv)},
                    "preflight": preflight,
                    "image": rel.image,
                    "memory": {
                        "kv_cache_free_gpu_memory_fraction": report.plan.kv_fraction_total,
                        "kv_tokens": report.plan.kv_tokens,
                        "engines": [e.role for e in report.plan.engines],
                    },
                    "checked_against": f"tensorrt_llm {installed} (installed)"
                    if installed
                    else [fact.cite() for fact in rel.sources],
                },
                indent=2,
            )
            + "\n"
        )
        roles: dict[str, Any] = {}
        if plans:
            _convert(spec, plans, {p.role: models[p.role] for p in plans}, None, tmp, on_progress)
            _write_reference(spec, plans, tmp)
            roles = {p.role: _role_record(spec, p, models[p.role], True) for p in plans}
        else:
            roles = {
                "target": RoleRecord(
                    role="target",
                    hf_dir=models["target"],
                    checkpoint="",
                    engine=None,
                    tp_size=spec.target.tp_size,
                    pp_size=spec.target.pp_size,
                    mode=SpeculativeDecodingMode.NONE,
                    max_draft_len=spec.speculation.max_draft_len,
                    argv=(),
                ).to_dict()
            }
        write_manifest(
            tmp,
            reuse_nested=True,
            kind="build",
            spec=spec.to_dict(),
            engine=engine,
            engine_built=bool(plans),
            tokenizer_dir=str(models["target"]),
            roles=roles,
            flow=spec.flow.value,
            llmapi={
                "options_file": OPTIONS_FILE,
                "models": {k: str(v) for k, v in models.items()},
                "trtllm_serve": argv,
                "preflight": preflight,
                "installed_check": installed,
            },
        )
    return out


def _serve_script(spec, argv: list[str], preflight: list[str]) -> str:
    return "\n".join(
        [
            "#!/usr/bin/env bash",
            f"# Written by `specbuild compile --flow llmapi` for spec {spec.name!r} ({spec.mode}).",
            "# Serves the HF folders with the LLM API (PyTorch backend) of TensorRT-LLM "
            f"{spec.trtllm_version}: run",
            f"# it on a GPU host inside {release(spec.trtllm_version).image} (see `specbuild serve BUILD "
            "--print-launch`).",
            "set -euo pipefail",
            'cd "$(dirname "$0")"',
            'command -v trtllm-serve >/dev/null || { echo "trtllm-serve not found: run this on a GPU host '
            "with "
            f'tensorrt_llm {spec.trtllm_version}" >&2; exit 1; }}',
            "# the installed release's own parser on the options first: stops in seconds, naming the key",
            shlex.join(preflight),
            f"exec {shlex.join(argv)}",
            "",
        ]
    )
