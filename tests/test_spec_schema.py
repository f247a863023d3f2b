"""The spec's JSON Schema (specbuild/data/spec.schema.json) against the loader (core/spec.py).

Editors validate specs with the schema; `specbuild check` validates them with the loader. They must give
the same verdict: every example validates under both, every key's default is accepted by both, and each
spec of the table below is rejected by both. Rules that span keys (a JSON Schema cannot compare two
values) are the loader's alone: the last table lists them, so the gap is known and bounded.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from specbuild.core.errors import SpecbuildError
from specbuild.core.spec import load_spec, spec_from_dict
from specbuild.core.spec_schema import SCHEMA_FILE, json_schema, keys

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").rglob("*.yaml"))

BASE = {
    "draft_target": {
        "name": "t",
        "mode": "draft_target",
        "target": {"model": "target"},
        "draft": {"model": "draft"},
    },
    "medusa": {
        "name": "t",
        "mode": "medusa",
        "target": {"model": "target"},
        "medusa": {"heads": "heads", "choices": [[0], [0, 0], [1]]},
    },
    "ngram": {"name": "t", "mode": "ngram", "target": {"model": "target"}},
    "eagle3": {
        "name": "t",
        "mode": "eagle3",
        "flow": "llmapi",
        "target": {"model": "target"},
        "eagle3": {"model": "eagle"},
    },
}


def _validator():
    schema = json.loads((ROOT / "specbuild" / "data" / SCHEMA_FILE).read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _as_json(raw):
    """What an editor's YAML language server validates: JSON data (mapping keys become strings)."""
    return json.loads(json.dumps(raw))


def _schema_ok(raw) -> bool:
    return not list(_validator().iter_errors(_as_json(raw)))


def _loader_ok(raw) -> bool:
    try:
        spec_from_dict(copy.deepcopy(raw))
    except SpecbuildError:  # SpecError, or a format's own error (a Medusa tree that does not parse)
        return False
    return True


def _with(mode: str, path: str, value):
    """BASE[mode] with the key at dotted `path` set (sections created as needed); value DELETE removes it."""
    raw = copy.deepcopy(BASE[mode])
    *parents, last = path.split(".")
    node = raw
    for p in parents:
        node = node.setdefault(p, {})
    if value is DELETE:
        node.pop(last, None)
    else:
        node[last] = value
    return raw


DELETE = object()


def test_the_shipped_schema_is_a_valid_draft_2020_12_schema_and_package_data():
    _validator()
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert '"data/*.json"' in pyproject  # ships in the wheel with the package


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_example_names_the_schema_and_validates(path):
    first = path.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith("# yaml-language-server: $schema=")
    target = (path.parent / first.split("$schema=", 1)[1].strip()).resolve()
    assert target == (ROOT / "specbuild" / "data" / SCHEMA_FILE).resolve()
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    errors = [e.message for e in _validator().iter_errors(_as_json(raw))]
    assert not errors
    load_spec(path)  # and the loader agrees


@pytest.mark.parametrize("mode", sorted(BASE))
def test_each_method_base_spec_passes_both(mode):
    assert _schema_ok(BASE[mode]) and _loader_ok(BASE[mode])


def test_every_key_at_its_default_passes_both():
    """Each leaf key written out at its documented default, one spec per method section."""
    for mode in BASE:
        raw = copy.deepcopy(BASE[mode])
        for key in keys():
            top = key.path.split(".")[0]
            if key.default in ("", "-", "its keys' defaults") or key.type.startswith("section"):
                continue
            if top in ("draft", "medusa", "ngram", "eagle3") and top != mode.replace("draft_target", "draft"):
                continue
            if key.path in ("flow", "trtllm_version") and mode == "eagle3":
                continue  # EAGLE-3 runs only on flow llmapi: the defaults are the engine flow's
            default = json.loads(json.dumps(_schema_default(key.path)))
            node = raw
            for p in key.path.split(".")[:-1]:
                node = node.setdefault(p, {})
            node.setdefault(key.path.split(".")[-1], default)
        assert _schema_ok(raw), mode
        assert _loader_ok(raw), mode


def _schema_default(path: str):
    node = json_schema()
    for p in path.split("."):
        node = node["properties"][p]
    return node["default"]


# (mode, key path, value): every row is refused by the loader and by the schema.
REFUSED = [
    ("ngram", "name", DELETE),
    ("ngram", "target", DELETE),
    ("ngram", "target.model", DELETE),
    ("ngram", "modle", "ngram"),
    ("ngram", "build.max_batch", 8),
    ("ngram", "mode", "medusaa"),
    ("ngram", "flow", "engin"),
    ("ngram", "dtype", "fp16"),
    ("ngram", "trtllm_version", "1.2"),
    ("ngram", "trtllm_version", 1.2),
    ("ngram", "build.weight_only", "int3"),
    ("ngram", "target.tp_size", 0),
    ("ngram", "target.tp_size", 513),
    ("ngram", "target.tp_size", "2"),
    ("ngram", "target.tp_size", True),
    ("ngram", "target.model", ["a"]),
    ("ngram", "target.model", "x" * 4097),
    ("ngram", "speculation.max_draft_len", 0),
    ("ngram", "speculation.max_draft_len", 257),
    ("ngram", "speculation.use_logits", "yes"),
    ("ngram", "serving.kv_cache_free_gpu_mem_fraction", 0),
    ("ngram", "serving.kv_cache_free_gpu_mem_fraction", 1.5),
    ("ngram", "serving.gpu_memory_gb", 0),
    ("ngram", "serving.gpu_memory_gb", 2000),
    ("ngram", "serving.nodes", 0),
    ("ngram", "serving.bls_instance_count", 0),
    ("ngram", "serving.max_queue_delay_microseconds", -1),
    ("ngram", "serving.num_gpus", 0),
    ("ngram", "serving.decoupled", "yes"),
    ("ngram", "build.max_num_tokens", 0),
    ("ngram", "build.max_seq_len", 1),
    ("ngram", "speculation.guard.window", 0),
    ("ngram", "speculation.guard.min_acceptance", 1.5),
    ("ngram", "speculation.guard.windw", 8),
    ("ngram", "speculation.schedule", {}),
    ("ngram", "speculation.schedule", {2: 4}),
    ("ngram", "speculation.schedule", {0: 4}),
    ("ngram", "speculation.schedule", {1: 5, 2: 300}),
    ("ngram", "speculation.schedule", {1: 5, 2: -1}),
    ("ngram", "speculation.schedule", [1, 2]),
    ("ngram", "ngram.max_matching_ngram_size", 0),
    ("ngram", "ngram.max_matching_ngram_size", 65),
    ("ngram", "ngram.is_keep_all", 1),
    ("ngram", "draft", {"model": "d"}),
    ("ngram", "medusa", {"heads": "h"}),
    ("draft_target", "draft", DELETE),
    ("draft_target", "draft.tp_size", 0),
    ("draft_target", "ngram", {}),
    ("medusa", "medusa", DELETE),
    ("medusa", "medusa.heads", DELETE),
    ("medusa", "medusa.choices", "no_such_tree"),
    ("medusa", "medusa.choices", [[0], ["a"]]),
    ("medusa", "medusa.num_heads", 0),
    ("medusa", "medusa.num_layers", 65),
    ("medusa", "draft", {"model": "d"}),
    ("eagle3", "eagle3", DELETE),
    ("eagle3", "eagle3.model", DELETE),
    ("eagle3", "eagle3.layers_to_capture", []),
    ("eagle3", "eagle3.layers_to_capture", [1, 1]),
    ("eagle3", "eagle3.layers_to_capture", [-2]),
    ("eagle3", "eagle3.layers_to_capture", [1.5]),
    ("eagle3", "ngram", {}),
]


@pytest.mark.parametrize("mode,path,value", REFUSED, ids=[f"{m}:{p}={v!r:.20}" for m, p, v in REFUSED])
def test_schema_and_loader_refuse_alike(mode, path, value):
    raw = _with(mode, path, value)
    assert not _loader_ok(raw), "the loader accepts it: drop the row or fix the loader"
    assert not _schema_ok(raw), "the loader refuses it but the schema accepts it"


# Values at the edges of each range: accepted by both.
ACCEPTED = [
    ("ngram", "target.tp_size", 512),
    ("ngram", "speculation.max_draft_len", 256),
    ("ngram", "serving.kv_cache_free_gpu_mem_fraction", 1.0),
    ("ngram", "serving.gpu_memory_gb", 1024),
    ("ngram", "serving.num_gpus", 4096),
    ("ngram", "serving.decoupled", None),
    ("ngram", "speculation.guard", {"window": 4096, "min_acceptance": 0}),
    ("ngram", "speculation", {"max_draft_len": 5, "schedule": {1: 5, 4: 0}}),
    ("ngram", "speculation.schedule", {1: 0}),
    ("ngram", "ngram.max_matching_ngram_size", 64),
    ("ngram", "name", 7),  # a number is kept as its text
    ("eagle3", "trtllm_version", "1.4.0rc4"),
    ("medusa", "medusa.choices", "mc_sim_7b_63"),
    ("medusa", "speculation.max_draft_len", 63),
    ("eagle3", "eagle3.layers_to_capture", [-1, 0, 4095]),
]


@pytest.mark.parametrize("mode,path,value", ACCEPTED, ids=[f"{m}:{p}={v!r:.20}" for m, p, v in ACCEPTED])
def test_schema_and_loader_accept_alike(mode, path, value):
    raw = _with(mode, path, value)
    if path == "medusa.choices" and value == "mc_sim_7b_63":
        raw["speculation"] = {"max_draft_len": 63}
    assert _loader_ok(raw)
    assert _schema_ok(raw)


# Rules between keys or against upstream's matrix: the loader refuses, a JSON Schema cannot say it.
LOADER_ONLY = [
    ("ngram", {"build": {"max_input_len": 2048, "max_seq_len": 2048}}),  # prompt longer than the sequence
    ("draft_target", {"target": {"model": "t", "tp_size": 4}, "serving": {"num_gpus": 2}}),  # fewer GPUs
    ("ngram", {"target": {"model": "t", "tp_size": 3}, "serving": {"nodes": 2}}),  # ranks over nodes
    ("medusa", {"flow": "llmapi"}),  # the method x flow x version matrix
    ("ngram", {"speculation": {"use_logits": True}}),  # a method's own rule
    ("ngram", {"speculation": {"max_draft_len": 4, "schedule": {1: 3}}}),  # threshold 1 must be K
    ("medusa", {"medusa": {"heads": "h", "choices": [[0, 0]]}}),  # tree not prefix-closed
]


@pytest.mark.parametrize("mode,patch", LOADER_ONLY)
def test_rules_across_keys_are_the_loaders(mode, patch):
    raw = {**copy.deepcopy(BASE[mode]), **patch}
    assert not _loader_ok(raw)
    assert _schema_ok(raw), "the schema now refuses it too: move the row to REFUSED"
