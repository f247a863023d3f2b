"""The build spec: one YAML file describes one deployment.

`load_spec(path)` reads it with `yaml.safe_load` and validates every key; errors name the file, the
key path and the fix (a typo gets a "did you mean"). The resolved spec (`BuildSpec.to_dict()`) is
written into every artifact's specbuild.json and read back by later stages.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from specbuild.core.errors import SpecError
from specbuild.core.facts.llmapi import LLMAPI_VERSIONS, Flow, decoding_class, parse_flow
from specbuild.core.facts.trtllm import DEFAULT_TRTLLM_VERSION, known_versions
from specbuild.core.formats.hf_config import FLOAT_DTYPES
from specbuild.core.formats.medusa_choices import MedusaChoices
from specbuild.core.formats.safe_io import InputFileError, read_text, shorten
from specbuild.core.methods import METHODS, SECTIONS, Method, Tunable, method_of, parse_method
from specbuild.core.methods.base import MODEL_RANGES, ModelSection
from specbuild.core.methods.eagle3 import Eagle3Section
from specbuild.core.methods.matrix import support
from specbuild.core.methods.medusa import MedusaSection
from specbuild.core.methods.ngram import NGramSection
from specbuild.core.perf.schedule import DraftSchedule, ScheduleError

# The method sections live with their methods (core/methods/<method>.py); re-exported for readers of the spec.
__all__ = ["BuildSpec", "Eagle3Section", "MedusaSection", "ModelSection", "NGramSection", "load_spec"]

DTYPES = FLOAT_DTYPES
QUANT = ("none", "int8", "int4")  # weight-only; trtllm-build quantizes float weights (trtllm.md 2.2)
# The key of each section that names a model folder or hub id (relative paths: from the spec's folder):
# the target's, and each method's (its `model_key`).
PATH_KEYS = {"target": "model", **{m.section: m.model_key for m in METHODS.values() if m.model_key}}
MAX_STRING = 4096  # characters of any string value (paths, names)
INT32_MAX = 2**31 - 1  # TensorRT shapes and the backend's request fields are int32
MAX_BATCH_SIZE = 65536  # far above any served batch; TensorRT-LLM sizes per-slot buffers by it
MAX_GPU_MEMORY_GB = 1024.0  # per GPU, GiB; the largest GPUs have 288 GB
MAX_DRAFT_LEN = 256  # speculation.max_draft_len: far above any useful K (and every tree specbuild builds)


@dataclass(frozen=True)
class SpeculationSection:
    # K for draft/target and n-gram, the tree size bound for Medusa. Left out: the method's default
    # (draft/target 5, Medusa the tree's size, n-gram 5 or 3 by max_batch_size), filled in by the loader so
    # every later stage reads a number.
    max_draft_len: int | None = None
    use_logits: bool = (
        False  # draft/target: lossless rejection sampling on draft logits (needs generation logits)
    )
    # Load-aware K: requests in flight -> K, e.g. {1: 4, 3: 2, 6: 0} (core/perf/schedule.py has the semantics;
    # `tune --schedule` measures and writes it). None: every round drafts max_draft_len.
    schedule: Any = None
    guard: GuardSection | None = None  # the acceptance guard (core/perf/schedule.py); None: off


@dataclass(frozen=True)
class GuardSection:
    """Stop drafting for a request once its last `window` drafted rounds accepted less than
    `min_acceptance` of their drafts (core/perf/schedule.py AcceptanceGuard)."""

    window: int = 8  # drafted rounds the acceptance is measured over
    min_acceptance: float = 0.3  # accepted / drafted below which the request stops drafting


@dataclass(frozen=True)
class BuildSection:
    max_batch_size: int = 8  # requests an engine runs at once (trtllm-build --max_batch_size)
    max_input_len: int = 1024  # longest prompt in tokens
    max_seq_len: int = 2048  # longest prompt + answer in tokens
    max_num_tokens: int | None = None  # None: trtllm-build's default (8192, raised for speculation)
    weight_only: str = "none"  # none | int8 | int4 (quant_algo W8A16 / W4A16)


@dataclass(frozen=True)
class ServingSection:
    gpu_memory_gb: float = 80.0  # per GPU
    kv_cache_free_gpu_mem_fraction: float = 0.9  # of memory left after weights, split between engines
    num_gpus: int | None = None  # None: the larger world size of target and draft
    max_queue_delay_microseconds: int = 0  # how long Triton waits to fill a batch (dynamic batching)
    bls_instance_count: int = 4  # BLS concurrency (~ max batch size advised upstream)
    # The backend's enable_chunked_context parameter. Off: the longest prompt is min(engine max_seq_len - 1,
    # max_num_tokens); on: max_seq_len - 1, run max_num_tokens at a time (needs paged context FMHA, always
    # built).
    enable_chunked_context: bool = False
    # The repository entry model's transaction policy (the BLS, or the LLM-API model): true streams, false
    # answers unary gRPC / HTTP infer. None: the flow's default (engine true; llmapi false, as upstream's
    # model.yaml); `repo --decoupled / --no-decoupled` overrides it (model_repo/transaction.py).
    decoupled: bool | None = None
    # Nodes one replica spans (the engine flow's `deploy --nodes`): the engines record
    # mapping.gpus_per_node = num_gpus / nodes and the repository the devices of one node (gpu_device_ids).
    nodes: int = 1


@dataclass(frozen=True)
class BuildSpec:
    name: str  # the deployment's name (build folders, manifests, Kubernetes names)
    mode: Method  # the speculation method (core/methods)
    target: ModelSection  # the model whose output is served
    trtllm_version: str = DEFAULT_TRTLLM_VERSION  # the TensorRT-LLM release generated for (quote it)
    # engine: convert + trtllm-build + the C++ backend (up to 1.2.x); llmapi: the LLM API on the PyTorch
    # backend (trtllm-serve, Triton's LLM-API model). core/methods/matrix.py has the method x flow matrix.
    flow: Flow = Flow.ENGINE
    dtype: str = "bfloat16"  # weights and activations (float16 on pre-Ampere GPUs)
    draft: ModelSection | None = None  # mode draft_target: the draft model
    medusa: MedusaSection | None = None  # mode medusa: the heads and the tree
    ngram: NGramSection | None = None  # mode ngram: the n-gram pool (optional: defaults)
    eagle3: Eagle3Section | None = None  # mode eagle3: the EAGLE-3 draft
    speculation: SpeculationSection = field(default_factory=SpeculationSection)  # K, sampling, schedule
    build: BuildSection = field(default_factory=BuildSection)  # the engines' limits
    serving: ServingSection = field(default_factory=ServingSection)  # the GPUs and the Triton repository
    source: Path | None = None  # the YAML file; relative model paths are resolved against its folder

    @property
    def base_dir(self) -> Path:
        return self.source.parent if self.source else Path.cwd()

    def inputs(self) -> dict[str, Path]:
        """What a command reading this spec reads, label -> path: the spec file, the target's folder and
        the method's other folders (`extra_models`); model references that name no path here (a hub id)
        are left out. Commands never write over them (cli/paths.py)."""
        out: dict[str, Path] = {"build spec": self.source} if self.source else {}
        for label, ref in {"target model": self.target.model, **method_of(self).extra_models(self)}.items():
            path = Path(ref).expanduser()
            path = path if path.is_absolute() else self.base_dir / path
            if path.exists() or path.is_symlink():
                out[label] = path
        return out

    def engine_sections(self) -> dict[str, ModelSection]:
        """The model sections that are engines of their own, role -> section: the target, and the draft
        when the method has a separate draft engine (core/methods `draft_engine`)."""
        draft = method_of(self).draft_engine(self)
        return {"target": self.target, **({"draft": draft} if draft is not None else {})}

    @property
    def num_gpus(self) -> int:
        if self.serving.num_gpus:
            return self.serving.num_gpus
        return max(s.world_size for s in self.engine_sections().values())

    @property
    def gpus_per_node(self) -> int:
        """GPUs of one node of the deployment (TensorRT-LLM's mapping.gpus_per_node)."""
        return self.num_gpus // self.serving.nodes

    def medusa_choices(self) -> MedusaChoices:
        """The tree as a MedusaChoices (specs with a medusa section only)."""
        assert self.medusa is not None
        return MedusaChoices.parse(self.medusa.choices)

    def medusa_tree(self) -> list[list[int]] | None:
        """The Medusa tree as lists (None: the method has no tree)."""
        return self.medusa_choices().to_lists() if self.medusa is not None else None

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["mode"] = self.mode.value
        d["flow"] = self.flow.value
        d["source"] = str(self.source) if self.source else None
        if self.medusa is not None:
            d["medusa"]["choices"] = self.medusa_choices().to_lists()
        return d


def load_spec(
    path: str | Path, *, validate_tree: bool = True, overrides: dict[str, Any] | None = None
) -> BuildSpec:
    """Read and validate a YAML build spec.

    `overrides` replace top-level keys before validation (`compile --flow / --trtllm-version`), so the
    method x flow x version matrix judges the combination that will be built.

    `validate_tree=False` still parses `medusa.choices` but leaves its consistency (prefix closure,
    depth, size) to the caller: `specbuild check` reports it as a row of its table.
    """
    path = Path(path)
    if path.is_dir():
        raise SpecError(
            f"build spec {path} is a directory",
            expected="a YAML file",
            found="a directory",
            fix="point at the spec file inside it "
            f"({', '.join(sorted(p.name for p in path.glob('*.y*ml'))[:3]) or 'e.g. examples/*.yaml'})",
        )
    if not path.exists():
        raise SpecError(
            f"build spec {path} not found",
            expected="a YAML file",
            found="no such file",
            fix="check the path; examples/ has specs to start from",
        )
    raw = parse_spec_yaml(read_spec_text(path), where=str(path))
    if overrides and isinstance(raw, dict):
        raw = {**raw, **{k: v for k, v in overrides.items() if v is not None}}
    return spec_from_dict(raw, source=path, validate_tree=validate_tree)


def read_spec_text(path: Path) -> str:
    try:
        return read_text(path, kind="spec", what="build spec")
    except InputFileError as exc:
        raise SpecError(exc.what, expected=exc.expected, found=exc.found, fix=exc.fix) from None


def parse_spec_yaml(text: str, *, where: str) -> Any:
    """yaml.safe_load, refusing aliases (`*name`: a few lines can expand to gigabytes) and repeated keys."""
    try:
        return yaml.load(text, Loader=_spec_loader())  # noqa: S506 - a SafeLoader subclass
    except SpecError:
        raise
    except yaml.YAMLError as exc:
        raise SpecError(
            f"{where}: not valid YAML",
            expected="a YAML mapping",
            found=shorten(str(exc).splitlines()[0]),
            fix="fix the YAML syntax",
        ) from None


def _spec_loader():
    class SpecLoader(yaml.SafeLoader):
        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise SpecError(
                    f"line {event.start_mark.line + 1}: YAML alias *{shorten(event.anchor, 40)} in a build "
                    "spec",
                    expected="plain values (aliases and merge keys are not allowed in specs)",
                    found=f"*{shorten(event.anchor, 40)}",
                    fix="write the value out in full",
                )
            return super().compose_node(parent, index)

        def construct_mapping(self, node, deep=False):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: the generic loader reports it
                    continue
                if first is None:
                    seen[key] = key_node.start_mark.line + 1
                else:
                    raise SpecError(
                        f"line {key_node.start_mark.line + 1}: key {shorten(key, 60)} appears twice",
                        expected="each key once per mapping",
                        found=f"{shorten(key, 60)} on lines {first} and {key_node.start_mark.line + 1}",
                        fix="remove one of them (YAML keeps only the last, silently)",
                    )
            return super().construct_mapping(node, deep=deep)

    return SpecLoader


def spec_from_dict(raw: Any, *, source: Path | None = None, validate_tree: bool = True) -> BuildSpec:
    where = str(source) if source else "<spec>"
    if not isinstance(raw, dict):
        raise SpecError(
            f"{where}: the spec must be a mapping",
            expected="keys name, mode, target, ...",
            found=type(raw).__name__,
            fix="start from examples/*.yaml",
        )
    values = _build(BuildSpec, raw, where, "", skip={"source"})
    spec = BuildSpec(**values, source=source.resolve() if source else None)
    spec = _fill_optional_section(spec)
    _check_sections(spec, where)
    if spec.speculation.max_draft_len is None:  # the method's default, so every stage reads a number
        k = method_of(spec).default_max_draft_len(spec)
        spec = dataclasses.replace(spec, speculation=dataclasses.replace(spec.speculation, max_draft_len=k))
    _check_values(spec, where, validate_tree=validate_tree)
    return _with_schedule(spec, where)


def _with_schedule(spec: BuildSpec, where: str) -> BuildSpec:
    """Validate speculation.schedule / guard; the schedule is kept as a sorted {int: int} mapping."""
    sp = spec.speculation
    if sp.guard is not None:
        if not 1 <= sp.guard.window <= 4096:
            _fail(where, "speculation.guard.window", "drafted rounds in 1..4096", sp.guard.window, "use 8")
        if not 0.0 <= sp.guard.min_acceptance <= 1.0:
            _fail(
                where,
                "speculation.guard.min_acceptance",
                "an acceptance rate (accepted / drafted) in [0, 1]",
                sp.guard.min_acceptance,
                "use 0.3",
            )
    if sp.schedule is None:
        return spec
    try:
        schedule = DraftSchedule.parse(sp.schedule, max_draft_len=sp.max_draft_len)
    except ScheduleError as exc:
        _fail(
            where,
            "speculation.schedule",
            f"requests in flight -> K, from 1 (= max_draft_len), e.g. {{1: {sp.max_draft_len}, 4: 0}}: {exc}",
            sp.schedule,
            "fix the schedule, or run `specbuild tune SPEC --schedule --write` to measure one",
        )
    method = method_of(spec)
    if method.tunes is Tunable.TREE and any(
        k not in (0, sp.max_draft_len) for k in schedule.to_dict().values()
    ):
        _fail(
            where,
            "speculation.schedule",
            f"K = 0 or the whole tree ({sp.max_draft_len}) for {method.title}: the tree is fixed when built",
            sp.schedule,
            f"use only 0 and {sp.max_draft_len} as K",
        )
    return dataclasses.replace(spec, speculation=dataclasses.replace(sp, schedule=schedule.to_dict()))


# ---- generic schema walk --------------------------------------------------------------------------


def _build(
    cls: type, raw: dict[str, Any], where: str, prefix: str, skip: set[str] = frozenset()
) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in skip}
    for key in raw:
        if key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=1)
            hint = (
                f"did you mean {(prefix + close[0])!r}?" if close else f"valid keys here: {', '.join(fields)}"
            )
            raise SpecError(
                f"{where}: unknown key {prefix}{shorten(str(key), 60)}",
                expected=f"one of {', '.join(fields)}",
                found=shorten(str(key)),
                fix=hint,
            )
    out: dict[str, Any] = {}
    for name, f in fields.items():
        keypath = f"{prefix}{name}"
        if name not in raw:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:  # type: ignore[misc]
                raise SpecError(
                    f"{where}: missing required key {keypath}",
                    expected=f"{keypath}: <{_type_name(hints[name])}>",
                    found="nothing",
                    fix=f"add {keypath} to the spec",
                )
            continue
        out[name] = _coerce(hints[name], raw[name], where, keypath)
    return out


def _coerce(tp: Any, value: Any, where: str, keypath: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _coerce(args[0], value, where, keypath)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise SpecError(
                f"{where}: {keypath} must be a mapping",
                expected=f"{keypath}: {{...}}",
                found=shorten(value),
                fix=f"write {keypath} as a mapping of its keys",
            )
        return tp(**_build(tp, value, where, keypath + "."))
    if tp is Any:
        return value
    if tp is Method:
        return parse_method(value, where=where)
    if tp is Flow:
        try:
            return parse_flow(value)
        except ValueError as exc:
            raise SpecError(
                f"{where}: impossible value for flow",
                expected=" | ".join(f.value for f in Flow),
                found=shorten(value, quote=True),
                fix=str(exc).split("; ", 1)[-1]
                if "did you mean" in str(exc)
                else "use flow: engine or llmapi",
            ) from None
    ok = (
        (tp is bool and isinstance(value, bool))
        or (tp is int and isinstance(value, int) and not isinstance(value, bool))
        or (tp is float and isinstance(value, (int, float)) and not isinstance(value, bool))
        or (tp is str and isinstance(value, (str, int, float)) and not isinstance(value, bool))
    )
    if not ok:
        raise SpecError(
            f"{where}: {keypath} has the wrong type",
            expected=_type_name(tp),
            found=f"{shorten(value, quote=True)} ({type(value).__name__})",
            fix=f"set {keypath} to a {_type_name(tp)}",
        )
    if tp is float and not math.isfinite(value):
        raise SpecError(
            f"{where}: {keypath} is not a finite number",
            expected="a finite number",
            found=repr(value),
            fix=f"set {keypath} to a number",
        )
    if tp is str and len(str(value)) > MAX_STRING:
        raise SpecError(
            f"{where}: {keypath} is too long",
            expected=f"at most {MAX_STRING} characters",
            found=shorten(str(value)),
            fix=f"shorten {keypath}",
        )
    return tp(value)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp)).replace("typing.", "")


def _fail(where: str, key: str, expected: str, found: Any, fix: str) -> None:
    raise SpecError(
        f"{where}: impossible value for {key}", expected=expected, found=shorten(found, quote=True), fix=fix
    )


def _fill_optional_section(spec: BuildSpec) -> BuildSpec:
    """A method whose section may be left out gets it with its defaults, so later stages read one."""
    method = method_of(spec)
    if method.section is None or method.section_required or getattr(spec, method.section) is not None:
        return spec
    return dataclasses.replace(spec, **{method.section: method.section_type()})


def _check_sections(spec: BuildSpec, where: str) -> None:
    """The method's own section must be there; another method's section must not."""
    method = method_of(spec)
    for section in SECTIONS:
        present = getattr(spec, section) is not None
        if section == method.section and not present:
            _fail(
                where,
                section,
                f"a {section} section for mode {spec.mode}",
                None,
                f"add {method.section_example}",
            )
        if section != method.section and present:
            _fail(
                where,
                section,
                f"no {section} section for mode {spec.mode}",
                f"{section}: {{...}}",
                f"remove {section}, or set the mode that uses it",
            )


def _check_values(spec: BuildSpec, where: str, *, validate_tree: bool = True) -> None:
    if spec.dtype not in DTYPES:
        _fail(where, "dtype", " | ".join(DTYPES), spec.dtype, "use bfloat16 (or float16 on pre-Ampere GPUs)")
    _check_combination(spec, where)
    _check_ranges(spec, where)
    method_of(spec).validate(spec, where, validate_tree=validate_tree)
    b = spec.build
    if b.max_batch_size * b.max_seq_len > INT32_MAX:
        _fail(
            where,
            "build.max_batch_size x build.max_seq_len",
            f"at most {INT32_MAX} (trtllm-build caps max_num_tokens at this product; TensorRT shapes are "
            "int32)",
            b.max_batch_size * b.max_seq_len,
            "lower max_batch_size or max_seq_len",
        )
    if b.max_input_len >= b.max_seq_len:
        _fail(
            where,
            "build.max_input_len",
            f"less than build.max_seq_len ({b.max_seq_len})",
            b.max_input_len,
            "raise max_seq_len or lower max_input_len",
        )
    if b.weight_only not in QUANT:
        _fail(where, "build.weight_only", " | ".join(QUANT), b.weight_only, "use none, int8 or int4")
    s = spec.serving
    if not 0.0 < s.kv_cache_free_gpu_mem_fraction <= 1.0:
        _fail(
            where,
            "serving.kv_cache_free_gpu_mem_fraction",
            "a fraction in (0, 1]",
            s.kv_cache_free_gpu_mem_fraction,
            "use 0.9",
        )
    if not 0.0 < s.gpu_memory_gb <= MAX_GPU_MEMORY_GB:
        _fail(
            where,
            "serving.gpu_memory_gb",
            f"GPU memory per GPU in GiB, in (0, {MAX_GPU_MEMORY_GB:g}]",
            s.gpu_memory_gb,
            "use 80 (H100) or 141 (H200)",
        )
    draft = spec.engine_sections().get("draft")
    if s.num_gpus is not None and s.num_gpus < max(spec.target.world_size, draft.world_size if draft else 1):
        _fail(
            where,
            "serving.num_gpus",
            f"at least the target's tp*pp ({spec.target.world_size})",
            s.num_gpus,
            "raise num_gpus or lower tp_size",
        )
    worlds = [spec.num_gpus, spec.target.world_size] + ([draft.world_size] if draft else [])
    if any(w % s.nodes for w in worlds):
        _fail(
            where,
            "serving.nodes",
            f"a divisor of the GPUs ({spec.num_gpus}) and of every engine's tp*pp (target "
            f"{spec.target.world_size}" + (f", draft {draft.world_size}" if draft else "") + "): "
            "every node holds the same number of each engine's ranks",
            s.nodes,
            "set serving.nodes: 1 (a draft/target spec runs on one node), or a tp_size / pp_size that splits "
            "over the nodes",
        )


# (section, key) -> (lowest, highest, example fix): every integer of a spec has a range; the methods'
# sections' ranges are their methods' (`ranges`).
_RANGES: dict[tuple[str, str], tuple[int, int, str]] = {
    **{("target", key): r for key, r in MODEL_RANGES.items()},
    **{(m.section, key): r for m in METHODS.values() for key, r in m.ranges.items()},
    ("speculation", "max_draft_len"): (
        1,
        MAX_DRAFT_LEN,
        "4-8 for draft/target, 3-5 for n-gram, the tree size for Medusa",
    ),
    ("build", "max_batch_size"): (1, MAX_BATCH_SIZE, "8"),
    ("build", "max_input_len"): (1, INT32_MAX, "1024"),
    ("build", "max_seq_len"): (2, INT32_MAX, "2048"),
    ("build", "max_num_tokens"): (1, INT32_MAX, "8192 (or leave it unset)"),
    ("serving", "num_gpus"): (1, 4096, "the GPUs of the host"),
    ("serving", "max_queue_delay_microseconds"): (0, 3_600_000_000, "0"),
    ("serving", "bls_instance_count"): (1, 1024, "4"),
    ("serving", "nodes"): (1, 512, "1"),
}


def _check_ranges(spec: BuildSpec, where: str) -> None:
    for (section, key), (low, high, example) in _RANGES.items():
        part = getattr(spec, section)
        value = getattr(part, key) if part is not None else None
        if value is not None and not low <= value <= high:
            _fail(
                where,
                f"{section}.{key}",
                f"an integer in {low}..{high}",
                value,
                f"set {section}.{key}: {example}",
            )


def _check_combination(spec: BuildSpec, where: str) -> None:
    """The method x flow x version matrix (core/methods/matrix.py): refuse what the version cannot serve,
    with the reason and the nearest supported alternative; then what the LLM-API flow has no key for."""
    version = spec.trtllm_version
    if version not in known_versions() and version not in LLMAPI_VERSIONS:  # a typo, not a combination
        engine = spec.flow is Flow.ENGINE
        known = known_versions() if engine else tuple(LLMAPI_VERSIONS)
        close = difflib.get_close_matches(str(version), known, n=1)
        _fail(
            where,
            "trtllm_version",
            f"a released TensorRT-LLM version the {spec.flow} flow is generated for: " + ", ".join(known),
            version,
            (f"did you mean {close[0]!r}? " if close else "")
            + f'quote it: trtllm_version: "{DEFAULT_TRTLLM_VERSION if engine else known[0]}"',
        )
    found = support(spec.mode.value, spec.flow, spec.trtllm_version)
    if not found.ok:
        raise SpecError(
            f"{where}: mode {spec.mode} on flow {spec.flow} is not available for TensorRT-LLM "
            f"{spec.trtllm_version}",
            expected=found.reason,
            found=f"mode: {spec.mode}, flow: {spec.flow}, trtllm_version: {spec.trtllm_version!r}",
            fix=f"use {found.alternative}",
        )
    if spec.flow is not Flow.LLMAPI:
        return
    if spec.build.weight_only != "none":
        _fail(
            where,
            "build.weight_only",
            "none on flow llmapi (weight-only int8/int4 is a trtllm-build option; the LLM API loads "
            "checkpoints quantized beforehand, e.g. by ModelOpt)",
            spec.build.weight_only,
            "set build.weight_only: none and point target.model at a quantized checkpoint",
        )
    if spec.speculation.use_logits:
        cls = decoding_class(spec.mode.value, spec.trtllm_version)
        if cls is None or "use_rejection_sampling" not in cls.keys:
            name = cls.name if cls else "speculative config"
            offering = [
                v
                for v, rel in LLMAPI_VERSIONS.items()
                if "use_rejection_sampling" in getattr(rel.method_class(spec.mode.value), "keys", {})
            ]
            _fail(
                where,
                "speculation.use_logits",
                f"false for {spec.mode} on TensorRT-LLM {spec.trtllm_version}: its {name} has no "
                "use_rejection_sampling key (lossless sampling with draft probabilities)",
                True,
                "set use_logits: false"
                + (
                    ", or "
                    + " or ".join(f'trtllm_version: "{v}"' for v in offering)
                    + " (use_rejection_sampling)"
                    if offering
                    else f" (no LLM-API release samples {spec.mode} with draft probabilities)"
                ),
            )
