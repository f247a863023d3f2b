"""Write specbuild/data/sglang_<version>.json: the `python -m sglang.launch_server` flags of one SGLang
release and the speculative-decoding rules specbuild writes against, read from its wheel's sources
(no SGLang import: it needs CUDA).

Usage (once per SGLang release the project targets):

    pip download sglang==0.5.23 --no-deps --only-binary :all: -d /tmp/w
    mkdir /tmp/w/x && cd /tmp/w/x && unzip -q ../sglang-0.5.23-*.whl
    python tools/sglang_facts.py /tmp/w/x /tmp/w/sglang-0.5.23-*.whl > specbuild/data/sglang_0.5.23.json

What it reads (python `ast` over the sources, nothing is executed; a rule whose code is not found stops
the tool, so a release that changed it cannot be recorded silently):
* sglang/srt/arg_groups/fields/*.py: every field of the namespace classes ServerArgs is assembled from;
  `add_cli_args_from_dataclass` (arg_groups/arg_utils.py) registers `--<field-with-dashes>` (or the
  field's `Arg(cli_name=...)`) plus its `aliases` for each field annotated `A[T, "help"]` or
  `A[T, Arg(...)]` unless `Arg(no_cli=True)`; the literal defaults of the fields specbuild writes;
* sglang/srt/server_args.py: the flags `ServerArgs.add_cli_args` registers by hand (`parser.add_argument`);
* sglang/srt/speculative/spec_info.py + spec_registry.py: the `SpeculativeAlgorithm` members and aliases;
* sglang/srt/arg_groups/speculative_hook.py: the EAGLE-family rules (steps / topk / draft tokens given
  together, topk 1 => draft tokens = steps + 1, max_running_requests reset when unset) and the adaptive
  rule (--speculative-num-steps must be a candidate);
* sglang/srt/speculative/adaptive_spec_params.py: which algorithms and topk adaptive runs with, the
  default ladder, and how a batch size picks its slot;
* sglang/srt/models/llama.py, llama_eagle3.py and model_executor/model_runner_components/
  spec_aux_hidden_state.py: where an EAGLE-3 draft's aux-layer ids are read and how they are shifted;
* sglang/kernels/jit/csrc/ngram_corpus/result.cpp (`fillResult`) and speculative_hook.py `_handle_ngram`:
  what NGRAM's draft-token count holds and what sets its topk;
* sglang/launch_server.py: the module entry point.
The wheel's sha256 and the RECORD hash of each file read go into the `source` note.
"""

from __future__ import annotations

import ast
import csv
import hashlib
import json
import sys
from pathlib import Path

FIELDS_DIR = "sglang/srt/arg_groups/fields"
FILES = {
    "server_args": "sglang/srt/server_args.py",
    "spec_info": "sglang/srt/speculative/spec_info.py",
    "spec_registry": "sglang/srt/speculative/spec_registry.py",
    "hook": "sglang/srt/arg_groups/speculative_hook.py",
    "adaptive": "sglang/srt/speculative/adaptive_spec_params.py",
    "llama": "sglang/srt/models/llama.py",
    "llama_eagle3": "sglang/srt/models/llama_eagle3.py",
    "aux": "sglang/srt/model_executor/model_runner_components/spec_aux_hidden_state.py",
    "launch": "sglang/launch_server.py",
    "ngram_result": "sglang/kernels/jit/csrc/ngram_corpus/result.cpp",
}
# The fields whose defaults are recorded: what specbuild writes, and what it leaves to SGLang.
DEFAULT_FIELDS = (
    "host",
    "port",
    "tp_size",
    "pp_size",
    "nnodes",
    "node_rank",
    "dtype",
    "context_length",
    "max_running_requests",
    "speculative_algorithm",
    "speculative_draft_model_path",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "speculative_adaptive",
    "speculative_adaptive_config",
    "speculative_accept_threshold_single",
    "speculative_accept_threshold_acc",
    "speculative_use_rejection_sampling",
    "speculative_ngram_min_bfs_breadth",
    "speculative_ngram_max_bfs_breadth",
    "speculative_ngram_match_type",
    "speculative_ngram_max_trie_depth",
)


def _fail(what: str) -> SystemExit:
    return SystemExit(f"not found: {what} (the release changed it: read the source and update the tool)")


def _text(root: Path, key: str) -> str:
    return (root / FILES[key]).read_text()


def _function(tree: ast.AST, name: str) -> ast.FunctionDef:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise _fail(f"function {name}")


def _arg_meta(annotation: ast.AST) -> dict | None:
    """{"no_cli", "cli_name", "aliases"} of an `A[T, "help"]` / `A[T, Arg(...)]` annotation; None for a
    field without CLI metadata (add_cli_args_from_dataclass skips it)."""
    if not (isinstance(annotation, ast.Subscript) and getattr(annotation.value, "id", None) == "A"):
        return None
    elts = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else []
    if len(elts) < 2:
        return None
    meta = elts[1]
    if isinstance(meta, ast.Constant | ast.JoinedStr | ast.BinOp):  # a bare help string
        return {"no_cli": False, "cli_name": None, "aliases": []}
    if isinstance(meta, ast.Call) and getattr(meta.func, "id", None) == "Arg":
        kw = {k.arg: k.value for k in meta.keywords}
        return {
            "no_cli": bool(kw.get("no_cli") and ast.literal_eval(kw["no_cli"])),
            "cli_name": ast.literal_eval(kw["cli_name"]) if "cli_name" in kw else None,
            "aliases": ast.literal_eval(kw["aliases"]) if "aliases" in kw else [],
        }
    return None


def field_flags(root: Path) -> tuple[set[str], dict[str, object], dict[str, str]]:
    """(flags, {field: literal default} of DEFAULT_FIELDS, {field: its --flag})."""
    flags: set[str] = set()
    defaults: dict[str, object] = {}
    names: dict[str, str] = {}
    for path in sorted((root / FIELDS_DIR).glob("*.py")):
        for cls in ast.walk(ast.parse(path.read_text())):
            if not isinstance(cls, ast.ClassDef):
                continue
            for item in cls.body:
                if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
                    continue
                meta = _arg_meta(item.annotation)
                if meta is None or meta["no_cli"]:
                    continue
                name = item.target.id
                cli = meta["cli_name"] or "--" + name.replace("_", "-")
                names[name] = cli
                flags.update([cli, *meta["aliases"]])
                if name in DEFAULT_FIELDS and item.value is not None:
                    defaults[name] = ast.literal_eval(item.value)
    missing = [f for f in DEFAULT_FIELDS if f not in defaults]
    if missing:
        raise _fail(f"fields {missing}")
    return flags, defaults, names


def manual_flags(tree: ast.Module) -> set[str]:
    out = set()
    for node in ast.walk(_function(tree, "add_cli_args")):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            out.update(
                a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("-")
            )
    return out


def algorithms(spec_info: ast.Module, registry: ast.Module) -> dict:
    members = next(
        [t.targets[0].id for t in n.body if isinstance(t, ast.Assign)]
        for n in ast.walk(spec_info)
        if isinstance(n, ast.ClassDef) and n.name == "SpeculativeAlgorithm"
    )
    aliases = next(
        (
            sorted(ast.literal_eval(n.value.args[0]))
            for n in ast.walk(registry)
            if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "_RESERVED_ALIASES"
        ),
        None,
    )
    if not members or aliases is None:
        raise _fail("SpeculativeAlgorithm members / _RESERVED_ALIASES")
    return {
        "members": members,
        "aliases_of_EAGLE": aliases,
        "read_from": [FILES["spec_info"], FILES["spec_registry"]],
    }


def eagle_family(hook_text: str) -> dict:
    rules = {
        "steps_topk_draft_tokens_together": "assert (\n            cfg.speculative_eagle_topk is None\n"
        "            and cfg.speculative_num_draft_tokens is None\n        )",
        "topk_1_draft_tokens": "cfg.speculative_eagle_topk == 1\n"
        "        and cfg.speculative_num_draft_tokens != cfg.speculative_num_steps + 1",
        "max_running_requests_reset": "max_running_requests=48",
    }
    for name, snippet in rules.items():
        if snippet not in hook_text:
            raise _fail(f"speculative_hook.py: {name}")
    return {
        "steps_topk_draft_tokens": "give all three or none (none: chosen per target architecture)",
        "topk_1": "speculative_num_draft_tokens = speculative_num_steps + 1",
        "max_running_requests_when_unset": 48,
        "read_from": FILES["hook"],
    }


def adaptive(adaptive_tree: ast.Module, hook_text: str) -> dict:
    reason = ast.unparse(_function(adaptive_tree, "adaptive_unsupported_reason"))
    if "not in ('EAGLE', 'EAGLE3')" not in reason or "speculative_eagle_topk != 1" not in reason:
        raise _fail("adaptive_unsupported_reason's algorithm / topk rules")
    default = next(
        (
            ast.literal_eval(n.value)
            for n in adaptive_tree.body
            if isinstance(n, ast.AnnAssign) and getattr(n.target, "id", None) == "DEFAULT_ADAPTIVE_CONFIG"
        ),
        None,
    )
    route = ast.unparse(_function(adaptive_tree, "_find_closest_bs"))
    pad = ast.unparse(_function(adaptive_tree, "_route"))
    if default is None or "bisect_right" not in route or "_pad_to_cuda_graph_bs" not in pad:
        raise _fail("DEFAULT_ADAPTIVE_CONFIG / the slot routing")
    if "is not in the adaptive config candidate_steps" not in hook_text:
        raise _fail("the --speculative-num-steps candidate check")
    loader = ast.unparse(_function(adaptive_tree, "_load_adaptive_config"))
    if "json.load" not in loader or "candidate_steps" not in loader:
        raise _fail("_load_adaptive_config reading a JSON file")
    return {
        "algorithms": ["EAGLE", "EAGLE3"],
        "topk": 1,
        "otherwise": "switched off with a warning, static parameters",
        "config": '--speculative-adaptive-config: a path to a JSON file {"<batch size>": '
        '{"candidate_steps": [non-negative ints], ...}}; 0 steps = no drafting',
        "routing": "the batch size, padded up to a CUDA-graph batch size, uses the largest key <= it "
        "(below the smallest key: the smallest)",
        "num_steps": "--speculative-num-steps must be one of the candidate steps of some key",
        "default_config": default,
        "read_from": [FILES["adaptive"], FILES["hook"]],
    }


def eagle3_layer_ids(llama_text: str, aux_text: str, eagle3_text: str) -> dict:
    if "[val + 1 for val in layer_ids]" not in llama_text or "[2, num_layers // 2, num_layers - 3]" not in (
        llama_text
    ):
        raise _fail("llama.py's +1 on the draft's aux-layer ids / its default")
    if 'eagle_config[\n                "eagle_aux_hidden_state_layer_ids"\n            ]' not in aux_text:
        raise _fail("spec_aux_hidden_state.py reading eagle_config.eagle_aux_hidden_state_layer_ids")
    if "EntryClass = [LlamaForCausalLMEagle3]" not in eagle3_text:
        raise _fail("llama_eagle3.py's EntryClass")
    return {
        "key": "eagle_config.eagle_aux_hidden_state_layer_ids",
        "top_level_key_read": False,
        "llama_shift": "+1: id i = the output of decoder layer i (TensorRT-LLM's eagle3_layers_to_capture)",
        "default": "internal [2, num_layers // 2, num_layers - 3] (no ids in the draft)",
        "draft_architecture": "LlamaForCausalLMEagle3",
        "read_from": [FILES["llama"], FILES["aux"], FILES["llama_eagle3"]],
    }


def ngram(result_text: str, hook_text: str) -> dict:
    if "info.token.emplace_back(last_token);" not in result_text:
        raise _fail("fillResult putting the last token first")
    if "speculative_num_draft_tokens=12" not in hook_text:
        raise _fail("_handle_ngram's default of 12 draft tokens")
    if "speculative_eagle_topk=cfg.speculative_ngram_max_bfs_breadth" not in hook_text:
        raise _fail("_handle_ngram setting topk from --speculative-ngram-max-bfs-breadth")
    return {
        "num_draft_tokens": "the verify width: the request's last token, then the drafted tokens "
        "(K drafted = K + 1)",
        "topk": "--speculative-ngram-max-bfs-breadth (1: one chain of drafted tokens)",
        "num_draft_tokens_default": 12,
        "read_from": [FILES["ngram_result"], FILES["hook"]],
    }


def record_hashes(root: Path, files: list[str]) -> dict[str, str]:
    record = next(root.glob("sglang-*.dist-info/RECORD"))
    with open(record, newline="") as f:
        rows = {row[0]: row[1] for row in csv.reader(f) if len(row) >= 2}
    return {path: rows[path] for path in files}


def main(root: str, wheel: str) -> None:
    root_p = Path(root)
    version = next(root_p.glob("sglang-*.dist-info")).name.removeprefix("sglang-").removesuffix(".dist-info")
    flags, defaults, names = field_flags(root_p)
    flags |= manual_flags(ast.parse(_text(root_p, "server_args")))
    if "is still supported" not in _text(root_p, "launch"):
        raise _fail("sglang/launch_server.py's module entry point")
    hook = _text(root_p, "hook")
    fields = sorted(p.relative_to(root_p).as_posix() for p in (root_p / FIELDS_DIR).glob("*.py"))
    data = {
        "source": {
            "package": f"sglang=={version}",
            "wheel": Path(wheel).name,
            "wheel_sha256": hashlib.sha256(Path(wheel).read_bytes()).hexdigest(),
            "files": record_hashes(root_p, [*fields, *FILES.values()]),
            "tool": "tools/sglang_facts.py (ast over the wheel's sources)",
        },
        "version": version,
        "launch": ["python", "-m", "sglang.launch_server"],
        "server_flags": sorted(flags),
        "flag_of": {f: names[f] for f in DEFAULT_FIELDS},
        "defaults": {f: defaults[f] for f in DEFAULT_FIELDS},
        "algorithms": algorithms(
            ast.parse(_text(root_p, "spec_info")), ast.parse(_text(root_p, "spec_registry"))
        ),
        "eagle_family": eagle_family(hook),
        "adaptive": adaptive(ast.parse(_text(root_p, "adaptive")), hook),
        "ngram": ngram(_text(root_p, "ngram_result"), hook),
        "eagle3_layer_ids": eagle3_layer_ids(
            _text(root_p, "llama"), _text(root_p, "aux"), _text(root_p, "llama_eagle3")
        ),
    }
    json.dump(data, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(*sys.argv[1:3])
