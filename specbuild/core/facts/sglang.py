"""Versioned SGLang facts: the `python -m sglang.launch_server` flags and the speculative-decoding rules of
the SGLang release `specbuild deploy --engine sglang` writes commands for, read from that release's wheel
(specbuild/data/sglang_<version>.json, written by tools/sglang_facts.py; its `source` names the wheel,
its sha256 and the RECORD hash of every file read). `release_facts` lists each with a `Fact`
(core/facts/llmapi_sources.py) for `specbuild doctor --facts`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from specbuild.core.facts.llmapi_sources import INFERRED, Fact, wheel_fact

SGLANG_VERSION = "0.5.23"  # the SGLang release `specbuild deploy --engine sglang` writes commands for
IMAGE_TAG = Fact(
    "hub.docker.com",
    "lmsysorg/sglang",
    "v<version>",
    INFERRED,
    "the release image's tag convention (the image was not pulled or read here)",
)
LWS_SGLANG = Fact(
    "kubernetes-sigs/lws",
    "docs/examples/sglang/lws.yaml (leader and workers: --dist-init-addr $(LWS_LEADER_ADDRESS):20000, "
    "--nnodes $(LWS_GROUP_SIZE), --node-rank $(LWS_WORKER_INDEX))",
    "0377103b1aee88acf3f731392c4d2e139b790109",
    INFERRED,
    "the LeaderWorkerSet pattern for SGLang across nodes; read on main, not at the v0.10.0 tag",
)


@dataclass(frozen=True)
class SglangFacts:
    version: str
    launch: tuple[str, ...]
    server_flags: frozenset[str]
    flag_of: dict[str, str]  # ServerArgs field -> its flag
    defaults: dict[str, Any]
    algorithms: dict[str, Any]
    eagle_family: dict[str, Any]
    adaptive: dict[str, Any]
    ngram: dict[str, Any]
    eagle3_layer_ids: dict[str, Any]
    source: dict[str, Any]

    def fact(self, path: str | list[str], note: str = "") -> Fact:
        """Where a fact of this release was read: the wheel pins the release."""
        return wheel_fact(self.source, path, note)

    @property
    def algorithm_names(self) -> frozenset[str]:
        return frozenset(self.algorithms["members"]) | frozenset(self.algorithms["aliases_of_EAGLE"])


@cache
def sglang_facts(version: str = SGLANG_VERSION) -> SglangFacts:
    raw = json.loads(resources.files("specbuild.data").joinpath(f"sglang_{version}.json").read_text())
    return SglangFacts(
        version=raw["version"],
        launch=tuple(raw["launch"]),
        server_flags=frozenset(raw["server_flags"]),
        flag_of=dict(raw["flag_of"]),
        defaults=dict(raw["defaults"]),
        algorithms=dict(raw["algorithms"]),
        eagle_family=dict(raw["eagle_family"]),
        adaptive=dict(raw["adaptive"]),
        ngram=dict(raw["ngram"]),
        eagle3_layer_ids=dict(raw["eagle3_layer_ids"]),
        source=dict(raw["source"]),
    )


# The spec's method -> SGLang's --speculative-algorithm is each method's (core/methods: `sglang_algorithm`).
SGLANG_REFUSED: dict[str, str] = {
    "medusa": f"SGLang {SGLANG_VERSION} has no Medusa algorithm (SpeculativeAlgorithm: DFLASH, UNO, DSPARK, "
    "EAGLE, EAGLE3, FROZEN_KV_MTP, STANDALONE, NGRAM)"
}


def release_facts(
    version: str = SGLANG_VERSION, writes: Mapping[str, str] | None = None
) -> list[tuple[str, str, Fact]]:
    """(topic, value, source) for every SGLang fact `deploy --engine sglang` writes against; `writes`: the
    methods' algorithm names (core/methods SGLANG_ALGORITHMS), shown in the algorithm row."""
    f = sglang_facts(version)
    algos = f.algorithms
    fam = f.eagle_family
    ad = f.adaptive
    ids = f.eagle3_layer_ids
    fields = sorted(p for p in f.source["files"] if "/arg_groups/fields/" in p)
    return [
        ("release", f"sglang=={f.version}", f.fact("sglang/launch_server.py", "the wheel pins the release")),
        (
            "launch",
            " ".join(f.launch) + " (warns that `sglang serve` is recommended)",
            f.fact("sglang/launch_server.py"),
        ),
        (
            "server flags",
            f"{len(f.server_flags)} flags; host {f.defaults['host']}, port {f.defaults['port']}, "
            f"--tp-size default {f.defaults['tp_size']}",
            f.fact([*fields, "sglang/srt/server_args.py"]),
        ),
        (
            "--speculative-algorithm",
            ", ".join(algos["members"]) + f" (aliases of EAGLE: {', '.join(algos['aliases_of_EAGLE'])}); "
            "specbuild writes " + ", ".join(f"{m}: {a}" for m, a in (writes or {}).items()),
            f.fact(algos["read_from"]),
        ),
        (
            "steps / topk / draft tokens",
            f"{fam['steps_topk_draft_tokens']}; topk 1: {fam['topk_1']}; max_running_requests "
            f"{fam['max_running_requests_when_unset']} when unset",
            f.fact(fam["read_from"]),
        ),
        (
            "NGRAM draft tokens",
            f"{f.ngram['num_draft_tokens']}; topk = {f.ngram['topk']}; default "
            f"{f.ngram['num_draft_tokens_default']}",
            f.fact(f.ngram["read_from"]),
        ),
        (
            "--speculative-adaptive",
            f"{' / '.join(ad['algorithms'])} with topk {ad['topk']} only ({ad['otherwise']}); "
            f"{ad['config']}; {ad['routing']}; {ad['num_steps']}",
            f.fact(ad["read_from"]),
        ),
        (
            "EAGLE-3 aux-layer ids",
            f"{ids['key']} only (top-level key read: {ids['top_level_key_read']}); Llama "
            f"{ids['llama_shift']}; {ids['default']}; draft architecture {ids['draft_architecture']}",
            f.fact(ids["read_from"]),
        ),
        ("medusa", SGLANG_REFUSED["medusa"], f.fact(algos["read_from"])),
        ("multi-node", "--nnodes / --node-rank / --dist-init-addr on a LeaderWorkerSet", LWS_SGLANG),
        ("image", f"lmsysorg/sglang:v{f.version}", IMAGE_TAG),
    ]
