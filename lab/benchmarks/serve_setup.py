"""bench-serve's setup (lab/benchmarks/serve.py): the demo family's draft/target repository on each flow, the
LLM-API repository without speculation, and the check that both sides of an arm run the same thing."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from specbuild.bench.options import default_prompts_file
from specbuild.client.remote import Session
from specbuild.core.deployment import RepoKind
from specbuild.core.errors import SpecbuildError
from specbuild.core.facts.llmapi import LLMAPI_VERSIONS, decoding_class
from specbuild.core.methods import Method
from specbuild.demo.models import DEFAULT_CACHE, DemoSettings, build_family
from specbuild.demo.pipeline import ServedBuild, compile_in_process, repo_in_process
from specbuild.demo.synthetic import make_model, train_tokenizer
from specbuild.engines.reference.engine import ReferenceEngine


class BenchServeError(SpecbuildError):
    """The two sides of bench-serve did not run the same thing (tokens, K, method, sampling)."""


def _random_pair(out: Path) -> tuple[Path, Path, Path]:
    """Untrained target and draft with the demo family's shapes (no training: minutes saved, but the
    draft's acceptance is near zero, so only the Triton/in-process ratio means something)."""
    settings = DemoSettings()
    tok = train_tokenizer(out / "models" / "tokenizer")
    paths = []
    for name, shape, seed in (("target", settings.target, 1), ("draft", settings.draft, 2)):
        folder = out / "models" / name
        if not (folder / "config.json").exists():
            make_model(
                folder,
                tok,
                hidden_size=shape.hidden_size,
                num_layers=shape.num_layers,
                num_heads=shape.num_heads,
                num_kv_heads=shape.num_kv_heads,
                intermediate_size=shape.intermediate_size,
                seed=seed,
            )
        paths.append(folder)
    return paths[0], paths[1], default_prompts_file()


def build_repo(
    out: Path,
    *,
    num_draft_tokens: int,
    random_models: bool = False,
    demo_cache: Path | None = None,
    log=print,
    flow: str = "engine",
) -> tuple[Path, Path, Path]:
    """(compile folder, repository, prompts.jsonl) for the demo family's draft/target pair on `flow`:
    engine -> the Python-backend BLS repository in OUT; llmapi -> `compile --flow llmapi --engine
    reference` and the local LLM-API model (`repo --backend llmapi-local`) in OUT/llmapi."""
    if random_models:
        target, draft, prompts = _random_pair(out)
    else:
        family = build_family(cache=demo_cache or DEFAULT_CACHE, log=log)
        target, draft, prompts = family.target, family.draft, family.prompts
    root = out if flow == "engine" else out / flow
    root.mkdir(parents=True, exist_ok=True)
    raw = {
        "name": "bench-serve",
        "mode": Method.DRAFT_TARGET.value,
        "dtype": "float32",
        "target": {"model": str(target)},
        "draft": {"model": str(draft)},
        "speculation": {"max_draft_len": num_draft_tokens},
        "build": {"max_batch_size": 8, "max_input_len": 256, "max_seq_len": 512},
        "serving": {"gpu_memory_gb": 4},
    }
    if flow != "engine":
        raw["flow"] = flow
    (root / "spec.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    kind = RepoKind.ENGINE_LOCAL if flow == "engine" else RepoKind.LLMAPI_LOCAL
    served = ServedBuild(spec=root / "spec.yaml", out=root, kind=kind, decoupled=True)  # it streams
    return compile_in_process(served), repo_in_process(served), prompts


LLMAPI_OPTIONS_FILE = Path("tensorrt_llm") / "1" / "model.yaml"  # = model_repo/tensors.py LLMAPI_OPTIONS
LLMAPI_CONFIG_FILE = Path("tensorrt_llm") / "config.pbtxt"


# draft/target's decoding_type on every LLM-API release specbuild writes (DraftTarget 1.2.1, Draft_Target 1.4)
DRAFT_TARGET_SPELLINGS = {decoding_class("draft_target", v).decoding_type for v in LLMAPI_VERSIONS}


def llmapi_speculation(repo: Path) -> dict:
    """The LLM-API repository's speculative_config ({} when it has none)."""
    options = yaml.safe_load((repo / LLMAPI_OPTIONS_FILE).read_text(encoding="utf-8"))
    return dict(options.get("speculative_config") or {})


def without_speculation(repo: Path, out: Path) -> Path:
    """A copy of the LLM-API repository REPO in OUT (replaced) that serves the target alone: model.yaml
    without speculative_config (an LLM-API deployment without speculation; the local model then decodes
    plainly) and the specbuild parameter default_num_draft_tokens 0 (what the client reports as K)."""
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(repo, out, ignore=shutil.ignore_patterns("__pycache__"))
    path = out / LLMAPI_OPTIONS_FILE
    options = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not options.pop("speculative_config", None):
        raise BenchServeError(
            f"{repo / LLMAPI_OPTIONS_FILE} has no speculative_config",
            expected="the speculative LLM-API repository of bench-serve",
            found="no speculative_config",
            fix="pass the repository `build_repo(..., flow='llmapi')` wrote",
        )
    path.write_text(yaml.safe_dump(options, sort_keys=False), encoding="utf-8")
    config = out / LLMAPI_CONFIG_FILE
    text = config.read_text(encoding="utf-8")
    key = 'key: "default_num_draft_tokens"'
    at = text.find(key)
    if at >= 0:
        value = text.index("string_value:", at)
        end = text.index("\n", value)
        text = text[:value] + 'string_value: "0"' + text[end:]
        config.write_text(text, encoding="utf-8")
    return out


def check_setup(
    flow: str, mode: str, *, engine: ReferenceEngine, session: Session, repo: Path, k: int
) -> dict:
    """What this arm runs, checked equal on both sides: the method, K, and (LLM-API) the repository's
    speculative_config; returns the facts checked."""
    info = session.info.repo
    problems = []
    if engine.method is not Method.DRAFT_TARGET or engine.num_draft_tokens < k:
        problems.append(f"in-process engine {engine.method} with K <= {engine.num_draft_tokens}")
    if flow == "llmapi":
        spec = llmapi_speculation(repo)
        want_k = k if mode == "speculative" else 0
        if mode == "speculative" and (
            spec.get("decoding_type") not in DRAFT_TARGET_SPELLINGS or spec.get("max_draft_len") != k
        ):
            problems.append(f"model.yaml speculative_config {spec}")
        if mode == "baseline" and spec:
            problems.append(f"model.yaml of the target-alone repository has speculative_config {spec}")
        if info.num_draft_tokens != want_k:
            problems.append(f"the server reports K={info.num_draft_tokens}")
        checked = {"speculative_config": spec, "server_k": info.num_draft_tokens}
    else:
        if info.method is not Method.DRAFT_TARGET or not info.has_baseline:
            problems.append(f"the BLS repository is {info.method} (baseline: {info.has_baseline})")
        checked = {
            "bls_method": str(info.method),
            "num_draft_tokens_per_request": k if mode == "speculative" else 0,
        }
    if problems:
        raise BenchServeError(
            f"bench-serve {flow} {mode}: the two sides do not run the same speculation",
            expected=f"draft/target with K={k} on both sides (or none, baseline)",
            found="; ".join(problems),
            fix="rebuild OUT (delete it) and rerun",
        )
    return {"method": Method.DRAFT_TARGET.value, "k": k if mode == "speculative" else 0, **checked}
