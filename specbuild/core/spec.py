"""The build spec: one YAML file describes one deployment.

`load_spec(path)` reads it with `yaml.safe_load` and validates every key; errors name the file, the
key path and the fix (a typo gets a "did you mean"). The resolved spec (`BuildSpec.to_dict()`) is
written into every artifact's specbuild.json and read back by later stages.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from specbuild.core.errors import SpecError
from specbuild.core.hf_config import FLOAT_DTYPES
from specbuild.core.medusa_choices import DEFAULT_TREE, MedusaChoices
from specbuild.core.methods import SECTIONS, Method, method_of, parse_method
from specbuild.core.trtllm_facts import DEFAULT_TRTLLM_VERSION, parse_version

DTYPES = FLOAT_DTYPES
QUANT = ("none", "int8", "int4")  # weight-only; trtllm-build quantizes float weights (trtllm.md 2.2)
# The key of each section that names a model folder or hub id (relative paths: from the spec's folder).
PATH_KEYS = {"target": "model", "draft": "model", "medusa": "heads"}


@dataclass(frozen=True)
class ModelSection:
    model: str  # local folder (relative to the spec file) or hub id
    tp_size: int = 1
    pp_size: int = 1

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size


@dataclass(frozen=True)
class MedusaSection:
    heads: str  # folder with the HF Medusa heads (config.json + medusa_lm_head.safetensors|.pt)
    num_heads: int = 4
    num_layers: int = 1  # ResBlocks per head
    choices: Any = DEFAULT_TREE  # a named tree or a list of paths; see MedusaChoices


@dataclass(frozen=True)
class SpeculationSection:
    # K for draft/target, the tree size bound for Medusa. Left out: the method's default (draft/target 5,
    # Medusa the tree's size), filled in by the loader so every later stage reads a number.
    max_draft_len: int | None = None
    use_logits: bool = False  # draft/target: lossless rejection sampling on draft logits (needs generation logits)


@dataclass(frozen=True)
class BuildSection:
    max_batch_size: int = 8
    max_input_len: int = 1024
    max_seq_len: int = 2048
    max_num_tokens: int | None = None  # None: trtllm-build's default (8192, raised for speculation)
    weight_only: str = "none"  # none | int8 | int4 (quant_algo W8A16 / W4A16)


@dataclass(frozen=True)
class ServingSection:
    gpu_memory_gb: float = 80.0  # per GPU
    kv_cache_free_gpu_mem_fraction: float = 0.9  # of memory left after weights, split between engines
    num_gpus: int | None = None  # None: the larger world size of target and draft
    max_queue_delay_microseconds: int = 0
    bls_instance_count: int = 4  # BLS concurrency (~ max batch size advised upstream)


@dataclass(frozen=True)
class BuildSpec:
    name: str
    mode: Method  # the speculation method (core/methods)
    target: ModelSection
    trtllm_version: str = DEFAULT_TRTLLM_VERSION
    dtype: str = "bfloat16"
    draft: ModelSection | None = None
    medusa: MedusaSection | None = None
    speculation: SpeculationSection = field(default_factory=SpeculationSection)
    build: BuildSection = field(default_factory=BuildSection)
    serving: ServingSection = field(default_factory=ServingSection)
    source: Path | None = None  # the YAML file; relative model paths are resolved against its folder

    @property
    def base_dir(self) -> Path:
        return self.source.parent if self.source else Path.cwd()

    @property
    def num_gpus(self) -> int:
        if self.serving.num_gpus:
            return self.serving.num_gpus
        return max(self.target.world_size, self.draft.world_size if self.draft else 1)

    def medusa_choices(self) -> MedusaChoices:
        """The tree as a MedusaChoices (specs with a medusa section only)."""
        assert self.medusa is not None
        return MedusaChoices.parse(self.medusa.choices)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["mode"] = self.mode.value
        d["source"] = str(self.source) if self.source else None
        if self.medusa is not None:
            d["medusa"]["choices"] = self.medusa_choices().to_lists()
        return d


def load_spec(path: str | Path, *, validate_tree: bool = True) -> BuildSpec:
    """Read and validate a YAML build spec.

    `validate_tree=False` still parses `medusa.choices` but leaves its consistency (prefix closure,
    depth, size) to the caller: `specbuild check` reports it as a row of its table.
    """
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"build spec {path} not found", expected="a YAML file", found="no such file", fix="check the path; examples/ has specs to start from")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML", expected="a YAML mapping", found=str(exc).splitlines()[0], fix="fix the YAML syntax") from None
    return spec_from_dict(raw, source=path, validate_tree=validate_tree)


def spec_from_dict(raw: Any, *, source: Path | None = None, validate_tree: bool = True) -> BuildSpec:
    where = str(source) if source else "<spec>"
    if not isinstance(raw, dict):
        raise SpecError(f"{where}: the spec must be a mapping", expected="keys name, mode, target, ...", found=type(raw).__name__, fix="start from examples/*.yaml")
    values = _build(BuildSpec, raw, where, "", skip={"source"})
    spec = BuildSpec(**values, source=source.resolve() if source else None)
    _check_sections(spec, where)
    if spec.speculation.max_draft_len is None:  # the method's default, so every stage reads a number
        k = method_of(spec).default_max_draft_len(spec)
        spec = dataclasses.replace(spec, speculation=dataclasses.replace(spec.speculation, max_draft_len=k))
    _check_values(spec, where, validate_tree=validate_tree)
    return spec


def save_spec_yaml(spec: BuildSpec, path: Path) -> None:
    """Write a spec back (used by `tune --write`); keeps relative model paths as given."""
    d = spec.to_dict()
    d.pop("source", None)
    for key in SECTIONS:
        if d.get(key) is None:
            d.pop(key, None)
    path.write_text(yaml.safe_dump(d, sort_keys=False))


# ---- generic schema walk --------------------------------------------------------------------------

def _build(cls: type, raw: dict[str, Any], where: str, prefix: str, skip: set[str] = frozenset()) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in skip}
    for key in raw:
        if key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=1)
            hint = f"did you mean {(prefix + close[0])!r}?" if close else f"valid keys here: {', '.join(fields)}"
            raise SpecError(f"{where}: unknown key {prefix}{key}", expected=f"one of {', '.join(fields)}", found=str(key), fix=hint)
    out: dict[str, Any] = {}
    for name, f in fields.items():
        keypath = f"{prefix}{name}"
        if name not in raw:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:  # type: ignore[misc]
                raise SpecError(f"{where}: missing required key {keypath}", expected=f"{keypath}: <{_type_name(hints[name])}>", found="nothing", fix=f"add {keypath} to the spec")
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
            raise SpecError(f"{where}: {keypath} must be a mapping", expected=f"{keypath}: {{...}}", found=repr(value)[:80], fix=f"write {keypath} as a mapping of its keys")
        return tp(**_build(tp, value, where, keypath + "."))
    if tp is Any:
        return value
    if tp is Method:
        return parse_method(value, where=where)
    ok = (
        (tp is bool and isinstance(value, bool))
        or (tp is int and isinstance(value, int) and not isinstance(value, bool))
        or (tp is float and isinstance(value, (int, float)) and not isinstance(value, bool))
        or (tp is str and isinstance(value, (str, int, float)) and not isinstance(value, bool))
    )
    if not ok:
        raise SpecError(f"{where}: {keypath} has the wrong type", expected=_type_name(tp), found=f"{value!r} ({type(value).__name__})", fix=f"set {keypath} to a {_type_name(tp)}")
    return tp(value)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp)).replace("typing.", "")


def _fail(where: str, key: str, expected: str, found: Any, fix: str) -> None:
    raise SpecError(f"{where}: impossible value for {key}", expected=expected, found=repr(found), fix=fix)


def _check_sections(spec: BuildSpec, where: str) -> None:
    """The method's own section must be there; another method's section must not."""
    method = method_of(spec)
    for section in SECTIONS:
        present = getattr(spec, section) is not None
        if section == method.section and not present:
            _fail(where, section, f"a {section} section for mode {spec.mode}", None, f"add {method.section_example}")
        if section != method.section and present:
            _fail(where, section, f"no {section} section for mode {spec.mode}", f"{section}: {{...}}",
                  f"remove {section}, or set the mode that uses it")


def _check_values(spec: BuildSpec, where: str, *, validate_tree: bool = True) -> None:
    if spec.dtype not in DTYPES:
        _fail(where, "dtype", " | ".join(DTYPES), spec.dtype, "use bfloat16 (or float16 on pre-Ampere GPUs)")
    if not parse_version(spec.trtllm_version):
        _fail(where, "trtllm_version", "a version such as 1.2.1", spec.trtllm_version, 'quote it: trtllm_version: "1.2.1"')
    for key, section in (("target", spec.target), ("draft", spec.draft)):
        if section is None:
            continue
        for dim in ("tp_size", "pp_size"):
            if getattr(section, dim) < 1:
                _fail(where, f"{key}.{dim}", "an integer >= 1", getattr(section, dim), f"set {key}.{dim}: 1")
    method_of(spec).validate(spec, where, validate_tree=validate_tree)
    k = spec.speculation.max_draft_len
    if not 1 <= k <= 256:
        _fail(where, "speculation.max_draft_len", "an integer in 1..256", k, "use 4-8 for draft/target, the tree size for Medusa")
    b = spec.build
    if b.max_batch_size < 1 or b.max_input_len < 1 or b.max_seq_len < 2:
        _fail(where, "build", "positive batch and length limits", dataclasses.asdict(b), "use max_batch_size: 8, max_input_len: 1024, max_seq_len: 2048")
    if b.max_input_len >= b.max_seq_len:
        _fail(where, "build.max_input_len", f"less than build.max_seq_len ({b.max_seq_len})", b.max_input_len, "raise max_seq_len or lower max_input_len")
    if b.weight_only not in QUANT:
        _fail(where, "build.weight_only", " | ".join(QUANT), b.weight_only, "use none, int8 or int4")
    s = spec.serving
    if not 0.0 < s.kv_cache_free_gpu_mem_fraction <= 1.0:
        _fail(where, "serving.kv_cache_free_gpu_mem_fraction", "a fraction in (0, 1]", s.kv_cache_free_gpu_mem_fraction, "use 0.9")
    if s.gpu_memory_gb <= 0:
        _fail(where, "serving.gpu_memory_gb", "GPU memory in GB, > 0", s.gpu_memory_gb, "use 80 (H100) or 141 (H200)")
    if s.num_gpus is not None and s.num_gpus < max(spec.target.world_size, spec.draft.world_size if spec.draft else 1):
        _fail(where, "serving.num_gpus", f"at least the target's tp*pp ({spec.target.world_size})", s.num_gpus, "raise num_gpus or lower tp_size")
