"""`specbuild compile`: spec -> checkpoints -> engines (TensorRT-LLM or reference), one atomic folder.

Layout of DIR: target/{checkpoint,engine}, draft/{checkpoint,engine} (draft/target only), plan.json,
build.sh, specbuild.json (kind "build": the spec, the engine kind, the tokenizer folder, the roles).
engine="trtllm" runs the plan when `trtllm-build` is on PATH (GPU hosts), logging to <role>/build.log;
otherwise, or with dry_run, the engines are left to build.sh. engine="reference" writes the
reference engine folders (engines/trtllm/engine_dir.py).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specbuild.errors import BuildError

ENGINES = ("reference", "trtllm")
LOG_TAIL_LINES = 40
LOG_KEEP_BYTES = 16 << 20  # the last 16 MiB of a failed trtllm-build log are kept beside DIR
Progress = Callable[[str, int, int], None]  # (task label, done, total)


def compile_spec(
    spec,
    out: str | Path,
    *,
    engine: str = "reference",
    dry_run: bool = False,
    force: bool = False,
    on_progress: Progress | None = None,
    on_message: Callable[[str], None] | None = None,
) -> Path:
    """Convert every model of `spec` and build its engines into `out`; returns `out`."""
    from specbuild.builder.resolve import resolve_model
    from specbuild.engines.trtllm.convert import convert_checkpoint
    from specbuild.engines.trtllm.engine_dir import write_reference_engine
    from specbuild.engines.trtllm.medusa import MedusaHeadsSource
    from specbuild.engines.trtllm.plan import build_plan, build_script, plan_json, speculation
    from specbuild.manifest import atomic_output_dir, write_manifest

    if engine not in ENGINES:
        raise BuildError(f"unknown engine {engine!r}", expected=" | ".join(ENGINES), found=engine, fix="use --engine reference or --engine trtllm")
    say = on_message or (lambda _msg: None)
    out = Path(out)
    _preflight(spec)
    plans = build_plan(spec)  # pure; fails before any conversion if a flag were wrong
    models = {role: resolve_model(_section(spec, role).model, base=spec.base_dir, what=role) for role in (p.role for p in plans)}
    heads = resolve_model(spec.medusa.heads, base=spec.base_dir, what="medusa.heads") if spec.mode == "medusa" else None
    trtllm_build = shutil.which("trtllm-build")
    run_trtllm = engine == "trtllm" and not dry_run and trtllm_build is not None
    inputs = {"build spec": spec.source, **{f"{role} model": folder for role, folder in models.items()}, "Medusa heads": heads}
    with atomic_output_dir(out, force=force, inputs=inputs) as tmp:
        for p in plans:
            section = _section(spec, p.role)
            medusa = None
            if heads is not None and p.role == "target":
                medusa = MedusaHeadsSource(heads, num_heads=spec.medusa.num_heads, num_layers=spec.medusa.num_layers, max_draft_len=speculation(spec, "target")[1])
            label = f"convert {p.role}"
            convert_checkpoint(
                models[p.role], tmp / p.checkpoint_dir, dtype=spec.dtype, tp_size=section.tp_size, pp_size=section.pp_size,
                medusa=medusa, weight_only=spec.build.weight_only,
                on_progress=(lambda done, total, _name, label=label: on_progress(label, done, total)) if on_progress else None,
            )
        (tmp / "plan.json").write_text(json.dumps(plan_json(spec, plans), indent=2) + "\n")
        script = tmp / "build.sh"
        script.write_text(build_script(spec, plans))
        script.chmod(0o755)
        built = False
        if engine == "reference":
            for p in plans:
                write_reference_engine(tmp / p.checkpoint_dir, tmp / p.output_dir, build_config=p.build_config, version=spec.trtllm_version)
            built = True
        elif run_trtllm:
            for i, p in enumerate(plans):
                if on_progress:
                    on_progress("trtllm-build", i, len(plans))
                _run_trtllm_build(p, tmp, out)
                write_manifest(tmp / p.output_dir, reuse_nested=True, kind="engine", engine="trtllm", checkpoint="../checkpoint", build_config=p.build_config, argv=list(p.argv))
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
        say(f"{why}: wrote the checkpoints, {out / 'plan.json'} and {out / 'build.sh'}. "
            f"On a GPU host with tensorrt_llm {spec.trtllm_version}, run: bash {out / 'build.sh'}")
    return out


def _section(spec, role: str):
    return spec.draft if role == "draft" else spec.target


def _role_record(spec, plan, hf_dir: Path, built: bool) -> dict[str, Any]:
    section = _section(spec, plan.role)
    return {
        "hf_dir": str(hf_dir),
        "checkpoint": plan.checkpoint_dir,
        "engine": plan.output_dir if built else None,
        "tp_size": section.tp_size,
        "pp_size": section.pp_size,
        "speculative_decoding_mode": plan.build_config["speculative_decoding_mode"],
        "max_draft_len": plan.build_config["max_draft_len"],
        "argv": list(plan.argv),
    }


def _preflight(spec) -> None:
    """Run `specbuild check`'s preflight (builder/preflight.py) when it exists; refuse to build on a fail."""
    try:
        from specbuild.builder.preflight import FAIL, run_checks
    except ModuleNotFoundError as exc:
        if exc.name == "specbuild.builder.preflight":
            return
        raise
    report = run_checks(spec)
    if not report.ok:
        failed = [r for r in report.results if r.status == FAIL]
        raise BuildError(
            f"preflight failed: {len(failed)} check(s)",
            expected="every check passing (warnings are allowed)",
            found="; ".join(f"{r.name}: {r.found}" for r in failed),
            fix="; ".join(r.fix for r in failed if r.fix) or "run `specbuild check SPEC` for details",
        )


def _run_trtllm_build(plan, tmp: Path, final: Path) -> None:
    """Run one role's argv in the build folder; the log stays in <role>/build.log (and beside DIR on failure)."""
    log_path = tmp / plan.role / "build.log"
    with open(log_path, "w") as log:
        proc = subprocess.run(list(plan.argv), cwd=tmp, stdout=log, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        from specbuild.safe_io import atomic_write_text

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
