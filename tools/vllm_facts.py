"""Write specbuild/data/vllm_<version>.json: the `vllm serve` flags, the `--speculative-config` keys with
their value lists, defaults and constraints, and the speculation rules specbuild writes against, of one
vLLM release, read from its wheel's sources (no vLLM import: it needs a CUDA torch).

Usage (once per vLLM release the project targets):

    pip download vllm==0.33.0 --no-deps --only-binary :all: -d /tmp/w
    mkdir /tmp/w/x && cd /tmp/w/x && unzip -q ../vllm-0.33.0-*.whl
    python tools/vllm_facts.py /tmp/w/x /tmp/w/vllm-0.33.0-*.whl > specbuild/data/vllm_0.33.0.json

What it reads (python `ast` over the sources, nothing is executed; a rule whose code is not found stops
the tool, so a release that changed it cannot be recorded silently):
* vllm/engine/arg_utils.py: every "--flag" / "-x" string literal given to an `add_argument(...)` call
  (EngineArgs.add_cli_args spells each engine flag out);
* vllm/entrypoints/common/cli_args.py: the fields of `BaseFrontendArgs` and `FrontendArgs` (their
  `add_cli_args` registers `--<field-with-dashes>` for each);
* vllm/config/speculative.py: the fields of `SpeculativeConfig` (the `--speculative-config` JSON keys;
  fields typed `SkipValidation[...]` are filled by vLLM itself and left out), each field's literal
  default and `ge`/`gt` bound, the Literal aliases (`SpeculativeMethod`, `RejectionSampleMethod`,
  `DraftSampleMethod`, `MTPModelTypes`), the keys `_verify_args` refuses outright, the method the `*_mtp`
  names are replaced with, and the draft-TP rule of `_verify_and_get_draft_tp`;
* vllm/v1/spec_decode/dynamic/utils.py and vllm/config/vllm.py: the rules of
  `num_speculative_tokens_per_batch_size` (first range start, lowest K, clamping, when it is switched off);
* vllm/v1/worker/gpu_model_runner.py and vllm/model_executor/models/interfaces.py: where an EAGLE-3 draft's
  aux-layer ids are read and their default;
* vllm/config/cache.py: the default of `gpu_memory_utilization`.
The wheel's sha256 and the RECORD hash of each file read go into the `source` note; each rule names the
file it was read from (`read_from`).
"""

from __future__ import annotations

import ast
import csv
import hashlib
import json
import re
import sys
from pathlib import Path

FILES = {
    "arg_utils": "vllm/engine/arg_utils.py",
    "cli_args": "vllm/entrypoints/common/cli_args.py",
    "speculative": "vllm/config/speculative.py",
    "cache": "vllm/config/cache.py",
    "dynamic": "vllm/v1/spec_decode/dynamic/utils.py",
    "vllm_config": "vllm/config/vllm.py",
    "runner": "vllm/v1/worker/gpu_model_runner.py",
    "interfaces": "vllm/model_executor/models/interfaces.py",
}
LITERALS = ("SpeculativeMethod", "RejectionSampleMethod", "DraftSampleMethod", "MTPModelTypes")


def _tree(root: Path, key: str) -> ast.Module:
    return ast.parse((root / FILES[key]).read_text())


def _fail(what: str) -> SystemExit:
    return SystemExit(f"not found: {what} (the release changed it: read the source and update the tool)")


def engine_flags(tree: ast.Module) -> set[str]:
    flags = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            for arg in node.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("-"):
                    flags.add(arg.value)
    return flags


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise _fail(f"class {name}")


def _function(tree: ast.AST, name: str) -> ast.FunctionDef:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise _fail(f"function {name}")


def class_fields(tree: ast.Module, name: str, *, skip_annotation: str | None = None) -> list[str]:
    out = []
    for item in _class(tree, name).body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            if skip_annotation and skip_annotation in ast.unparse(item.annotation):
                continue
            out.append(item.target.id)
    return out


def literal_values(tree: ast.Module, name: str) -> list[str]:
    """The strings of a `Name = Literal[...]` alias, following aliases it names."""
    aliases = {
        n.targets[0].id: n.value
        for n in tree.body
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)
    }

    def walk(node: ast.AST) -> list[str]:
        if isinstance(node, ast.Subscript):  # Literal[...]
            elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            return [v for e in elts for v in walk(e)]
        if isinstance(node, ast.Constant):
            return [node.value]
        if isinstance(node, ast.Name):
            return walk(aliases[node.id])
        raise SystemExit(f"unexpected node in {name}: {ast.unparse(node)}")

    if name not in aliases:
        raise _fail(f"Literal alias {name}")
    return walk(aliases[name])


def field_default(tree: ast.Module, cls: str, field: str) -> object:
    for item in _class(tree, cls).body:
        if isinstance(item, ast.AnnAssign) and getattr(item.target, "id", None) == field:
            value = item.value
            if isinstance(value, ast.Call):  # Field(default=...)
                value = next(k.value for k in value.keywords if k.arg == "default")
            return ast.literal_eval(value)
    raise _fail(f"{cls}.{field}")


def field_details(tree: ast.Module, cls: str) -> dict[str, dict]:
    """{field: {"annotation", "default" (when a literal), "ge"/"gt" (when set)}} of the JSON-settable
    fields (not SkipValidation)."""
    out: dict[str, dict] = {}
    for item in _class(tree, cls).body:
        if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
            continue
        annotation = ast.unparse(item.annotation)
        if "SkipValidation" in annotation:
            continue
        info: dict = {"annotation": annotation}
        value = item.value
        if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "Field":
            for k in value.keywords:
                if k.arg in ("ge", "gt", "le", "lt"):
                    info[k.arg] = ast.literal_eval(k.value)
            value = next((k.value for k in value.keywords if k.arg == "default"), None)
        if value is not None:
            try:
                info["default"] = ast.literal_eval(value)
            except ValueError:
                info["default_expr"] = ast.unparse(value)
        out[item.target.id] = info
    return out


def _string(node: ast.AST) -> str:
    """The text of a (possibly implicitly concatenated or f-) string literal."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{...}" for v in node.values)
    return ""


def rejected_keys(tree: ast.Module) -> dict[str, str]:
    """Keys `_verify_args` refuses whenever they are set: `if self.<key> is not None: raise ValueError(...)`
    with a message saying it is not a valid argument."""
    out = {}
    for node in ast.walk(_function(tree, "_verify_args")):
        if not (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)):
            continue
        test = node.test
        if not (isinstance(test.ops[0], ast.IsNot) and isinstance(test.left, ast.Attribute)):
            continue
        raise_ = node.body[0] if node.body else None
        if isinstance(raise_, ast.Raise) and isinstance(raise_.exc, ast.Call) and raise_.exc.args:
            message = _string(raise_.exc.args[0])
            if "not a valid argument" in message:
                out[test.left.attr] = message
    if not out:
        raise _fail("_verify_args refusing a key ('not a valid argument')")
    return out


def mtp_canonical(text: str) -> str:
    m = re.search(r"method `%s` is deprecated and replaced with (\w+)", text)
    if not m:
        raise _fail("the *_mtp deprecation warning")
    return m.group(1)


def draft_tp_rule(tree: ast.Module) -> list:
    """The values `_verify_and_get_draft_tp` allows: `not in (1, <target tp>)`."""
    for node in ast.walk(_function(tree, "_verify_and_get_draft_tp")):
        if isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.NotIn):
            values = node.comparators[0]
            if isinstance(values, ast.Tuple):
                return [
                    e.value if isinstance(e, ast.Constant) else "target tensor_parallel_size"
                    for e in values.elts
                ]
    raise _fail("_verify_and_get_draft_tp's allowed values")


def _compare_constant(tree: ast.AST, name: str, op: type) -> object:
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Compare)
            and isinstance(node.left, ast.Name)
            and node.left.id == name
            and isinstance(node.ops[0], op)
            and isinstance(node.comparators[0], ast.Constant)
        ):
            return node.comparators[0].value
    raise _fail(f"`{name} {op.__name__} <constant>`")


def dynamic_rules(dynamic: ast.Module, dynamic_text: str, vllm_config: ast.Module) -> dict:
    validate = _function(dynamic, "validate_and_normalize_dynamic_sd_schedule")
    lookup = _function(dynamic, "build_dynamic_sd_schedule_lookup")
    if "inclusive" not in (ast.get_docstring(validate) or ""):
        raise _fail("'inclusive' ranges in validate_and_normalize_dynamic_sd_schedule's docstring")
    clamps = any(
        isinstance(n, ast.Call)
        and getattr(n.func, "id", None) == "min"
        and any(getattr(a, "id", None) == "vllm_num_speculative_tokens" for a in n.args)
        for n in ast.walk(lookup)
    )
    if not clamps:
        raise _fail("min(vllm_num_speculative_tokens, K) in build_dynamic_sd_schedule_lookup")
    v1 = _function(vllm_config, "_maybe_disable_dynamic_sd_for_v1")
    methods = next(
        (
            [e.value for e in n.comparators[0].elts]
            for n in ast.walk(v1)
            if isinstance(n, ast.Compare)
            and isinstance(n.ops[0], ast.In)
            and isinstance(n.comparators[0], ast.Tuple)
        ),
        None,
    )
    if methods is None:
        raise _fail("the methods _maybe_disable_dynamic_sd_for_v1 keeps")
    dp = ast.unparse(_function(vllm_config, "_maybe_disable_dynamic_sd_for_data_parallel"))
    if "data_parallel_size <= 1" not in dp or "num_speculative_tokens_per_batch_size = None" not in dp:
        raise _fail("the data-parallel switch-off of num_speculative_tokens_per_batch_size")
    return {
        "key": "num_speculative_tokens_per_batch_size",
        "entry": "[range_start, range_end, num_speculative_tokens], inclusive batch-size range",
        "first_start": _compare_constant(validate, "first_range_start", ast.NotEq),
        "k_min": _compare_constant(validate, "num_speculative_tokens", ast.Lt),
        "sorted_non_overlapping": "must be non-overlapping and sorted" in dynamic_text,
        "k_above_num_speculative_tokens": "clamped to num_speculative_tokens",
        "gaps_and_tail": "carry the previous K forward",
        "off_with_data_parallel": True,
        "v1_runner_methods": methods,
        "read_from": [FILES["dynamic"], FILES["vllm_config"]],
    }


def eagle3_layer_ids(runner_text: str, interfaces_text: str) -> dict:
    top = runner_text.find('getattr(hf_config, "eagle_aux_hidden_state_layer_ids", None)')
    nested = runner_text.find('eagle_config.get("eagle_aux_hidden_state_layer_ids")')
    if top < 0 or nested < 0:
        raise _fail("the draft config's eagle_aux_hidden_state_layer_ids reads in gpu_model_runner.py")
    default = "return (2, num_layers // 2, num_layers - 3)"
    if default not in interfaces_text:
        raise _fail("the default aux layers (2, num_layers // 2, num_layers - 3)")
    return {
        "keys_in_order": (
            ["eagle_aux_hidden_state_layer_ids", "eagle_config.eagle_aux_hidden_state_layer_ids"]
            if top < nested
            else ["eagle_config.eagle_aux_hidden_state_layer_ids", "eagle_aux_hidden_state_layer_ids"]
        ),
        "default": "(2, num_layers // 2, num_layers - 3)",
        "meaning": "id j = the residual stream after j decoder layers (0 = the embedding output)",
        "read_from": [FILES["runner"], FILES["interfaces"]],
    }


def record_hashes(root: Path) -> dict[str, str]:
    record = next(root.glob("vllm-*.dist-info/RECORD"))
    with open(record, newline="") as f:
        rows = {row[0]: row[1] for row in csv.reader(f) if len(row) >= 2}
    return {path: rows[path] for path in FILES.values()}


def main(root: str, wheel: str) -> None:
    root_p = Path(root)
    version = next(root_p.glob("vllm-*.dist-info")).name.removeprefix("vllm-").removesuffix(".dist-info")
    cli = _tree(root_p, "cli_args")
    frontend = class_fields(cli, "BaseFrontendArgs") + class_fields(cli, "FrontendArgs")
    flags = engine_flags(_tree(root_p, "arg_utils")) | {"--" + f.replace("_", "-") for f in frontend}
    spec = _tree(root_p, "speculative")
    spec_text = (root_p / FILES["speculative"]).read_text()
    digest = hashlib.sha256(Path(wheel).read_bytes()).digest()
    literals = {name: literal_values(spec, name) for name in LITERALS}
    mtp = mtp_canonical(spec_text)
    data = {
        "source": {
            "package": f"vllm=={version}",
            "wheel": Path(wheel).name,
            "wheel_sha256": digest.hex(),
            "files": record_hashes(root_p),
            "tool": "tools/vllm_facts.py (ast over the wheel's sources)",
            "note": "vllm serve MODEL: the model is the positional model_tag (vllm/entrypoints/cli/serve.py)",
        },
        "version": version,
        "serve_flags": sorted(flags),
        "speculative_config_keys": class_fields(spec, "SpeculativeConfig", skip_annotation="SkipValidation"),
        "speculative_methods": literals["SpeculativeMethod"],
        "speculative_fields": field_details(spec, "SpeculativeConfig"),
        "speculative_literals": {k: v for k, v in literals.items() if k != "SpeculativeMethod"},
        "speculative_rejected_keys": rejected_keys(spec),
        "mtp": {
            "method": mtp,
            "deprecated": [m for m in literals["MTPModelTypes"] if m != mtp],
            "read_from": FILES["speculative"],
        },
        "draft_tensor_parallel_size": {"allowed": draft_tp_rule(spec), "read_from": FILES["speculative"]},
        "dynamic_speculation": dynamic_rules(
            _tree(root_p, "dynamic"), (root_p / FILES["dynamic"]).read_text(), _tree(root_p, "vllm_config")
        ),
        "eagle3_layer_ids": eagle3_layer_ids(
            (root_p / FILES["runner"]).read_text(), (root_p / FILES["interfaces"]).read_text()
        ),
        "defaults": {
            "gpu_memory_utilization": field_default(
                _tree(root_p, "cache"), "CacheConfig", "gpu_memory_utilization"
            ),
            "host": field_default(cli, "FrontendArgs", "host"),
            "port": field_default(cli, "FrontendArgs", "port"),
        },
    }
    json.dump(data, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(*sys.argv[1:3])
