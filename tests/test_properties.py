"""Hypothesis properties of the readers that take outside input: any input gives a value or a typed error
(SpecbuildError; OpenAIError for the frontend's request validators), never another exception, within a
time and a memory bound. The spec loader (YAML text and mutated example specs), the Medusa-choices
parser (objects and text), the safetensors header reader (bytes and garbled headers), the manifest
readers (garbled specbuild.json), the JSON reader, and the OpenAI request validators (bytes and JSON
values), plus the stop-string property of the frontend's text stream.

Seeded and bounded in `make test` (FUZZ_PROPERTY_EXAMPLES per property); `make fuzz` runs more.
"""

from __future__ import annotations

import json
import os
import struct
import time
import tracemalloc
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import seed as fixed_seed
from hypothesis import strategies as st

from specbuild.core.artifacts import read_artifact, read_repo_manifest
from specbuild.core.errors import SpecbuildError
from specbuild.core.formats.manifest import MANIFEST, read_manifest
from specbuild.core.formats.medusa_choices import MedusaChoices
from specbuild.core.formats.safe_io import parse_json
from specbuild.core.formats.weights import safetensors_header, safetensors_shapes
from specbuild.core.spec import load_spec, spec_from_dict
from specbuild.frontend.protocol import OpenAIError, StopText, parse_chat, parse_completion

EXAMPLES = int(os.environ.get("FUZZ_PROPERTY_EXAMPLES", "150"))
SEED = int(os.environ.get("FUZZ_SEED", "20261204"))
TIME_BOUND_S = 5.0  # one call on a generated input of a few KB: milliseconds; 5 s is a hang, not noise
MEMORY_BOUND = 64 * 2**20  # bytes allocated at peak by one call (tracemalloc) on a few KB of input
EXAMPLES_DIR = Path(__file__).parents[1] / "examples" / "tiny"
COUNTS: dict[str, int] = {}

PROPERTY = settings(
    max_examples=EXAMPLES,
    deadline=None,  # the bound is checked below, with its own margin, not hypothesis' 200 ms
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=30,
)


def bounded(name: str, call, *typed: type[BaseException]):
    """call() -> its value, or None when it raised one of `typed`; anything else fails. Time and memory
    are bounded."""
    COUNTS[name] = COUNTS.get(name, 0) + 1
    tracemalloc.start()
    started = time.perf_counter()
    try:
        return call()
    except typed:
        return None
    finally:
        elapsed = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert elapsed < TIME_BOUND_S, f"{name}: {elapsed:.1f} s"
        assert peak < MEMORY_BOUND, f"{name}: {peak / 2**20:.0f} MiB"


@pytest.fixture(scope="module", autouse=True)
def report_counts():
    yield
    print(f"\nhypothesis examples: {dict(sorted(COUNTS.items()))}")


# ---- the spec loader ------------------------------------------------------------------------------


def _example_specs() -> list[dict]:
    return [yaml.safe_load(p.read_text()) for p in sorted(EXAMPLES_DIR.glob("*.yaml"))]


@st.composite
def mutated_specs(draw) -> dict:
    """An example spec with one key of one section replaced, removed or added."""
    spec = json.loads(json.dumps(draw(st.sampled_from(_example_specs()))))
    section = draw(st.sampled_from(sorted(spec)))
    value = draw(json_values)
    if isinstance(spec[section], dict) and spec[section] and draw(st.booleans()):
        key = draw(st.sampled_from(sorted(spec[section])) | st.text(max_size=10))
        if draw(st.booleans()):
            spec[section][key] = value
        else:
            spec[section].pop(key, None)
    else:
        spec[section] = value
    return spec


@fixed_seed(SEED)
@PROPERTY
@given(text=st.text(max_size=400) | json_values.map(lambda v: yaml.safe_dump(v, allow_unicode=True)))
def test_the_spec_loader_takes_any_text(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("spec") / "spec.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    bounded("load_spec(text)", lambda: load_spec(path), SpecbuildError)


@fixed_seed(SEED)
@PROPERTY
@given(raw=mutated_specs())
def test_the_spec_loader_takes_any_mutation_of_an_example(tmp_path_factory, raw):
    folder = tmp_path_factory.mktemp("spec")
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(raw, allow_unicode=True))
    bounded("load_spec(mutated example)", lambda: load_spec(path), SpecbuildError)
    bounded("spec_from_dict(mutated example)", lambda: spec_from_dict(raw), SpecbuildError)


# ---- Medusa choices ------------------------------------------------------------------------------

choice_paths = st.lists(st.lists(st.integers(-2, 12) | st.booleans() | st.none(), max_size=6), max_size=12)


@fixed_seed(SEED)
@PROPERTY
@given(
    value=choice_paths
    | json_values
    | choice_paths.map(str)
    | choice_paths.map(lambda p: ", ".join("{" + ", ".join(map(str, q)) + "}" for q in p))
    | st.text(alphabet="{}[](),0123456789 -", max_size=60)
    | st.text(max_size=40),
    heads=st.integers(0, 8),
    max_draft_len=st.integers(0, 64),
)
def test_medusa_choices_parse_any_value(value, heads, max_draft_len):
    def parse_and_check():
        tree = MedusaChoices.parse(value)
        tree.validate(num_heads=heads, max_draft_len=max_draft_len)
        assert MedusaChoices.parse(tree.to_triton()) == tree  # the Triton form reads back
        return tree

    bounded("MedusaChoices.parse", parse_and_check, SpecbuildError)


# ---- safetensors and manifests ---------------------------------------------------------------------


@st.composite
def safetensors_files(draw) -> bytes:
    """Random bytes, or an 8-byte length followed by a (garbled) JSON header and some data."""
    if draw(st.booleans()):
        return draw(st.binary(max_size=200))
    header = draw(
        json_values
        | st.dictionaries(
            st.text(max_size=8),
            st.fixed_dictionaries({"dtype": json_values, "shape": json_values, "data_offsets": json_values})
            | json_values,
            max_size=4,
        )
    )
    text = json.dumps(header).encode()
    length = draw(
        st.sampled_from([len(text), len(text) + 1, max(0, len(text) - 1), 2**64 - 1, 0, 90 * 2**20])
    )
    return struct.pack("<Q", length) + text + draw(st.binary(max_size=16))


@fixed_seed(SEED)
@PROPERTY
@given(data=safetensors_files())
def test_the_safetensors_header_reader_takes_any_file(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("st") / "model.safetensors"
    path.write_bytes(data)
    bounded("safetensors_header", lambda: safetensors_header(path), SpecbuildError)
    bounded("safetensors_shapes", lambda: safetensors_shapes(path), SpecbuildError)


MANIFEST_KEYS = ["kind", "files", "backend", "mode", "trtllm_version", "build_dir", "engine_root"]
MANIFEST_KEYS += ["tokenizer_dir_host", "models", "layout", "spec", "engine", "checkpoint", "build_config"]


@st.composite
def manifests(draw) -> str:
    if draw(st.booleans()):
        return draw(st.text(max_size=200))
    kind = st.sampled_from(["repo", "build", "engine", "checkpoint", "medusa_heads"]) | json_values
    fields = {
        "kind": kind,
        "files": st.dictionaries(st.text(max_size=10), json_values, max_size=3) | json_values,
    }
    fields.update({k: json_values for k in MANIFEST_KEYS[2:]})
    chosen = draw(st.lists(st.sampled_from(MANIFEST_KEYS), unique=True))
    return json.dumps({k: draw(fields[k]) for k in chosen})


@fixed_seed(SEED)
@PROPERTY
@given(text=manifests())
def test_the_manifest_readers_take_any_manifest(tmp_path_factory, text):
    folder = tmp_path_factory.mktemp("artifact")
    (folder / MANIFEST).write_text(text, encoding="utf-8", errors="surrogatepass")
    bounded("read_manifest", lambda: read_manifest(folder), SpecbuildError)
    bounded("read_repo_manifest", lambda: read_repo_manifest(folder), SpecbuildError)
    bounded("read_artifact", lambda: read_artifact(folder), SpecbuildError)


@fixed_seed(SEED)
@PROPERTY
@given(text=st.text(max_size=200) | json_values.map(json.dumps), expect=st.sampled_from([dict, list, None]))
def test_the_json_reader_takes_any_text(text, expect):
    bounded("parse_json", lambda: parse_json(text, where="x.json", expect=expect), SpecbuildError)


# ---- the frontend's request validators ----------------------------------------------------------


def _completion_bodies():
    fields = {
        "model": st.just("m") | json_values,
        "prompt": st.text(max_size=20) | json_values,
        "max_tokens": st.integers(-5, 2**40) | json_values,
        "stop": st.text(max_size=5) | st.lists(st.text(max_size=5)) | json_values,
        "stream": st.booleans() | json_values,
        "stream_options": st.fixed_dictionaries({}, optional={"include_usage": json_values}) | json_values,
        "n": st.just(1) | json_values,
        "temperature": st.floats() | json_values,
        "logit_bias": json_values,
        "messages": st.lists(
            st.fixed_dictionaries(
                {"role": st.sampled_from(["user", "robot"]) | json_values, "content": json_values}
            )
        )
        | json_values,
    }
    return st.fixed_dictionaries({}, optional=fields) | st.dictionaries(st.text(max_size=10), json_values)


@fixed_seed(SEED)
@PROPERTY
@given(body=_completion_bodies() | json_values, as_bytes=st.booleans())
def test_the_request_validators_take_any_body(body, as_bytes):
    data = json.dumps(body).encode() if as_bytes else body
    bounded("parse_completion", lambda: parse_completion(data, "m", 512), OpenAIError)
    bounded("parse_chat", lambda: parse_chat(data, "m", 512, lambda m: str(m)), OpenAIError)


@fixed_seed(SEED)
@PROPERTY
@given(data=st.binary(max_size=300))
def test_the_request_validators_take_any_bytes(data):
    bounded("parse_completion(bytes)", lambda: parse_completion(data, "m", None), OpenAIError)


@fixed_seed(SEED)
@PROPERTY
@given(
    pieces=st.lists(st.text(alphabet="abxy", max_size=6), max_size=12),
    stops=st.lists(st.text(alphabet="abxy", min_size=1, max_size=4), max_size=4),
)
def test_stop_text_ends_the_stream_before_the_first_stop_string(pieces, stops):
    """Whatever the chunking, the text streamed is the text up to the earliest stop string, and
    `matched` names a stop string found there."""
    stopper = StopText(tuple(stops))
    out = "".join(stopper.push(p) for p in pieces) + stopper.flush()
    whole = "".join(pieces)
    found = [(whole.find(s), s) for s in stops if s in whole]
    COUNTS["StopText"] = COUNTS.get("StopText", 0) + 1
    if not found:
        assert out == whole and stopper.matched is None
        return
    cut = min(i for i, _ in found)
    assert out == whole[:cut]
    assert stopper.matched in stops and whole[cut:].startswith(stopper.matched)
