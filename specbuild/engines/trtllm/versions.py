"""Released TensorRT-LLM versions and the NGC Triton containers that ship each one.

One home for the fact (specbuild/data/trtllm_containers.json, with its sources): the spec loader
accepts only these versions, and `serve --print-launch` picks the container from them. An engine
only loads in a container whose TensorRT-LLM built it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class Containers:
    version: str  # TensorRT-LLM version, e.g. "1.2.1"
    tags: tuple[str, ...]  # NGC tritonserver tags (yy.mm), oldest first
    default: str  # the tag used unless --container-tag says otherwise


@lru_cache(maxsize=1)
def _table() -> dict[str, Containers]:
    from importlib import resources

    raw = json.loads(resources.files("specbuild.data").joinpath("trtllm_containers.json").read_text())["versions"]
    return {v: Containers(v, tuple(d["tags"]), d.get("default", d["tags"][-1])) for v, d in raw.items()}


def known_versions() -> tuple[str, ...]:
    return tuple(_table())


def containers(version: str) -> Containers | None:
    return _table().get(str(version))
