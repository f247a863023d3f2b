"""Session fixtures of the end-to-end tests (a pytest plugin, see conftest.py): tiny models -> reference
engines -> Python-backend repositories (draft/target, Medusa, n-gram) -> one real tritonserver each, shared
by every e2e module (starting them is the slow part; both load at the same time). The stages run in process
through the demo's pipeline API (specbuild/demo/pipeline.py: compile, repo, a server on free ports).

The builds allow long requests (max_seq_len 512) so that cancellation and limits can be watched on
requests that take a while. A test that destroys a server (kills it, or one of its model processes)
calls `e2e_servers.replace(mode)` afterwards: the next test that asks for that server gets a fresh one
(started only then; the destructive tests run last, so usually never).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from specbuild.demo.pipeline import ServedBuild

sys.path.insert(0, str(Path(__file__).parent))

MAX_SEQ_LEN = 512  # the tiny models' max_position_embeddings
MAX_INPUT_LEN = 256
K = 3  # draft tokens per round the tests ask for (the build's max_draft_len is 4)


def _compile(
    workdir: Path, mode: str, *, target: Path, draft: Path | None, bls_instances: int
) -> ServedBuild:
    import yaml
    from repo_builds import EXAMPLES, make_heads

    from specbuild.demo.pipeline import ServedBuild, compile_in_process

    workdir.mkdir(parents=True)
    name = f"{mode.replace('_', '-')}.yaml"  # examples/tiny/
    raw = yaml.safe_load((EXAMPLES / name).read_text())
    raw.setdefault("serving", {})["bls_instance_count"] = bls_instances
    raw["build"].update(max_seq_len=MAX_SEQ_LEN, max_input_len=MAX_INPUT_LEN)
    (workdir / name).write_text(yaml.safe_dump(raw))
    shutil.copytree(target, workdir / "target")
    if draft is not None:
        shutil.copytree(draft, workdir / "draft")
    if mode == "medusa":
        cfg = json.loads((target / "config.json").read_text())
        make_heads(workdir / "medusa_heads", hidden=cfg["hidden_size"], vocab=cfg["vocab_size"], heads=3)
    served = ServedBuild(spec=workdir / name, out=workdir)  # repo --backend python
    compile_in_process(served)
    return served


@pytest.fixture(scope="session")
def e2e_builds(tmp_path_factory, tiny_target, tiny_draft):
    """mode -> (build folder, repository) for draft_target, medusa and ngram."""
    from specbuild.demo.pipeline import repo_in_process

    root = tmp_path_factory.mktemp("e2e")
    out = {}
    for mode, draft, bls in (("draft_target", tiny_draft, 4), ("medusa", None, 2), ("ngram", None, 2)):
        served = _compile(root / mode, mode, target=tiny_target, draft=draft, bls_instances=bls)
        out[mode] = (served.build, repo_in_process(served))
    return out


class ServerPool:
    """One live TritonServer per repository; `replace(mode)` starts a fresh one after a destructive test."""

    def __init__(self, builds):
        self.builds = builds
        self.servers = {}

    def _new(self, mode):
        from specbuild.demo.pipeline import local_server

        return local_server(self.builds[mode][1]).launch()

    def start_all(self) -> None:
        for mode in self.builds:  # launch all, then wait: their model loading overlaps
            self.servers[mode] = self._new(mode)
        for server in self.servers.values():
            server.wait_ready()

    def __getitem__(self, mode):
        if self.servers.get(mode) is None:
            self.servers[mode] = self._new(mode).wait_ready()
        return self.servers[mode]

    def replace(self, mode) -> None:
        """Stop a server a test destroyed; a fresh one starts when the next test asks for it."""
        server, self.servers[mode] = self.servers.get(mode), None
        if server is not None:
            server.stop()

    def stop_all(self) -> None:
        for server in self.servers.values():
            if server is not None:
                server.stop()


@pytest.fixture(scope="session")
def e2e_servers(e2e_builds):
    pool = ServerPool(e2e_builds)
    try:
        pool.start_all()
        yield pool
    finally:
        pool.stop_all()


@pytest.fixture(scope="session")
def e2e_engine(e2e_builds):
    """The in-process reference engine of the shared target (both repositories serve the same target)."""
    import torch

    from specbuild.engines.reference.engine import ReferenceEngine

    torch.set_num_threads(1)
    return ReferenceEngine.load(e2e_builds["draft_target"][0])


@pytest.fixture(scope="session")
def greedy(e2e_engine):
    """greedy(prompt, n) -> (continuation text, token ids, prompt ids): the target alone, in-process,
    with the end token the repositories' preprocessing sends (the tokenizer's eos)."""
    from specbuild.core.sampling_params import SamplingParams

    cache = {}

    def run(prompt: str, n: int):
        if (prompt, n) not in cache:
            ids = e2e_engine.encode(prompt)
            r = e2e_engine.generate(ids, SamplingParams(max_tokens=n), speculative=False)
            cache[prompt, n] = (r.text, r.token_ids, ids)
        return cache[prompt, n]

    return run


def _llmapi_repo(
    root: Path, example: str, models: dict[str, Path], *, decoupled: bool = True
) -> tuple[Path, Path]:
    """`compile --flow llmapi --engine reference` of examples/tiny/EXAMPLE -> `repo --backend llmapi-local`
    (decoupled: these tests stream): (build, repository)."""
    import yaml
    from repo_builds import EXAMPLES

    from specbuild.core.deployment import RepoKind
    from specbuild.demo.pipeline import ServedBuild, compile_in_process, repo_in_process

    raw = yaml.safe_load((EXAMPLES / example).read_text())
    raw["build"].update(max_seq_len=MAX_SEQ_LEN, max_input_len=MAX_INPUT_LEN)
    raw["flow"] = "llmapi"
    (root / "spec.yaml").write_text(yaml.safe_dump(raw))
    for name, folder in models.items():
        shutil.copytree(folder, root / name)
    served = ServedBuild(spec=root / "spec.yaml", out=root, kind=RepoKind.LLMAPI_LOCAL, decoupled=decoupled)
    return compile_in_process(served), repo_in_process(served)


def _llmapi_server(build: Path, repo: Path):
    """A tritonserver serving the LLM-API interface of `repo`; yields (build, repository, server)."""
    from specbuild.demo.pipeline import local_server

    server = local_server(repo).launch().wait_ready()
    try:
        yield build, repo, server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def e2e_llmapi_repo(tmp_path_factory, tiny_target, tiny_draft):
    """(build, repository) of the draft/target spec on the LLM-API flow."""
    root = tmp_path_factory.mktemp("e2e-llmapi")
    return _llmapi_repo(root, "draft-target.yaml", {"target": tiny_target, "draft": tiny_draft})


@pytest.fixture(scope="session")
def e2e_llmapi(e2e_llmapi_repo):
    """(build, repository, server) of the draft/target spec on the LLM-API flow (started only for the
    tests that ask, so the other e2e modules do not pay for it)."""
    yield from _llmapi_server(*e2e_llmapi_repo)


@pytest.fixture(scope="session")
def e2e_llmapi_ngram(tmp_path_factory, tiny_target):
    """(build, repository, server) of the n-gram spec on the LLM-API flow (NGramDecodingConfig)."""
    root = tmp_path_factory.mktemp("e2e-llmapi-ngram")
    yield from _llmapi_server(*_llmapi_repo(root, "ngram.yaml", {"target": tiny_target}))
