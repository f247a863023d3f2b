"""The process tree under faults, end to end: `specbuild serve` (the CLI, as a supervisor runs it) on a
repository of each kind (draft/target, Medusa, n-gram, the LLM-API model) under load, then each way a
process of its tree dies:

* `serve` by SIGTERM, by SIGINT, by SIGTERM and SIGKILL 2 s later (a short-grace supervisor), by SIGKILL;
* tritonserver by SIGKILL; each model's Python-backend stub and each engine process by SIGKILL.

After each: every request in flight ends at once, with an error or (the graceful SIGTERM / SIGINT stop)
complete; a new request fails at once; no process of the tree outlives TREE_BOUND_S; no /dev/shm file of
the server is left; and `serve` started again on the same ports answers exactly (the target's greedy
text). A killed engine process is started again by its model: the same server answers exactly.

`make test` runs CORE (each way of dying on one kind); `make test-faults` (pytest --faults) runs the
whole matrix. The cases of one kind form a chain: the server started after a death is the next case's.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from specbuild.core.pdeathsig import die_with_parent

pytestmark = pytest.mark.slow

PROMPT = "The quick brown fox"
EXACT_TOKENS = 12
# The load: the tiny target's greedy continuation of this prompt has no end token within LONG_TOKENS, so a
# complete answer has exactly LONG_TOKENS tokens (the LLM-API interface has no end_id input to turn the
# end token off); each streams for seconds (max_seq_len 512: e2e_fixtures).
LOAD_PROMPT = "def add(a, b):"
LONG_TOKENS = 480
CLIENTS = 8
READY_S = 300.0  # model loading on 2 loaded cores
TREE_BOUND_S = 30.0  # the bound; the lifelines and the guardian end the tree in ~1 s
# A request in flight ends this soon after the fatal signal: serve checks its tree every 0.5 s, a stub's
# lifeline its server every 0.2 s, the kernel's PR_SET_PDEATHSIG is immediate; the rest is 2 loaded cores.
ERROR_S = 5.0
# A killed engine process fails the requests it held at once; its model starts it again (a reference
# engine loads in seconds) and the requests queued behind them then complete.
ENGINE_RESTART_S = 120.0
# SIGTERM / SIGINT stop tritonserver gracefully: in-flight requests may finish, within its exit timeout.
DRAIN_S = 20 + 10  # server.EXIT_TIMEOUT_S + the unload
SHORT_GRACE_S = 2.0  # SIGTERM, then SIGKILL this much later

SERVE_MODES = ("serve-SIGTERM", "serve-SIGINT", "serve-SIGTERM+SIGKILL@2s", "serve-SIGKILL")
GRACEFUL = ("serve-SIGTERM", "serve-SIGINT")
STUBS = {  # the models of each kind that run in a Python-backend stub (the ensemble does not)
    "draft_target": (
        "preprocessing",
        "postprocessing",
        "tensorrt_llm_bls",
        "tensorrt_llm",
        "tensorrt_llm_draft",
    ),
    "medusa": ("preprocessing", "postprocessing", "tensorrt_llm_bls", "tensorrt_llm"),
    "ngram": ("preprocessing", "postprocessing", "tensorrt_llm_bls", "tensorrt_llm"),
    "llmapi": ("tensorrt_llm",),
}
ENGINES = {  # the models of each kind with an engine process
    "draft_target": ("tensorrt_llm", "tensorrt_llm_draft"),
    "medusa": ("tensorrt_llm",),
    "ngram": ("tensorrt_llm",),
    "llmapi": ("tensorrt_llm",),
}
# `make test`: each way of dying once, every kind at least once, the short-grace kill of issue 40 on
# draft/target. SIGINT takes serve's path of SIGTERM (serving.STOP_SIGNALS): in the full matrix only.
CORE = {
    ("draft_target", "serve-SIGTERM+SIGKILL@2s"),
    ("medusa", "stub:tensorrt_llm"),
    ("medusa", "serve-SIGKILL"),
    ("ngram", "tritonserver-SIGKILL"),
    ("llmapi", "engine:tensorrt_llm"),
    ("llmapi", "serve-SIGTERM"),
}


def _modes(kind: str) -> list[str]:
    """Engine kills first: the model starts its engine again, so the next case reuses the server."""
    return [
        *(f"engine:{m}" for m in ENGINES[kind]),
        *(f"stub:{m}" for m in STUBS[kind]),
        "tritonserver-SIGKILL",
        *SERVE_MODES,
    ]


CASES = [
    pytest.param(kind, mode, marks=() if (kind, mode) in CORE else pytest.mark.faults, id=f"{kind}-{mode}")
    for kind in STUBS
    for mode in _modes(kind)
]


# ---- the tree ------------------------------------------------------------------------------------------
@dataclass
class Tree:
    """`serve` and every process under it, each with its role: tritonserver, guardian, stub:MODEL,
    engine:MODEL (psutil.Process keeps the start time: a reused pid is not mistaken for it)."""

    serve: psutil.Process
    roles: dict[int, tuple[str, psutil.Process]] = field(default_factory=dict)
    shm_prefix: str = ""
    triton_pid: int = 0

    @classmethod
    def of(cls, serve_pid: int) -> Tree:
        tree = cls(psutil.Process(serve_pid))
        for proc in tree.serve.children(recursive=True):
            try:
                argv = proc.cmdline()
            except psutil.Error:
                continue
            role = _role(argv)
            tree.roles[proc.pid] = (role, proc)
            if role == "tritonserver":
                tree.triton_pid = proc.pid
                tree.shm_prefix = next(a.rpartition("=")[2] for a in argv if "shm-region-prefix-name=" in a)
        return tree

    def find(self, role: str) -> psutil.Process:
        return next(proc for r, proc in self.roles.values() if r == role)

    def with_role(self, prefix: str) -> set[str]:
        return {r.partition(":")[2] for r, _ in self.roles.values() if r.startswith(prefix)}

    def processes(self) -> list[tuple[str, psutil.Process]]:
        return [("serve", self.serve), *self.roles.values()]

    def shm_left(self) -> list[str]:
        counters = f"specbuild-bls-inflight-{self.triton_pid}-"
        return sorted(
            p.name for p in Path("/dev/shm").iterdir() if p.name.startswith((self.shm_prefix, counters))
        )


def _role(argv: list[str]) -> str:
    if argv[0].endswith("/tritonserver"):
        return "tritonserver"
    if "specbuild.serve.guardian" in argv:
        return "guardian"
    if argv[0].endswith("triton_python_backend_stub"):
        return f"stub:{Path(argv[1]).parent.parent.name}"  # <repo>/<model>/1/model.py
    script = next((a for a in argv[1:3] if a.endswith((".py",))), "")
    if script.endswith("engine_host.py"):
        return f"engine:{Path(script).parent.parent.name}"
    return f"other:{' '.join(argv)[:80]}"


def alive(proc: psutil.Process) -> bool:
    """Running (a zombie has ended: only its exit status waits for its parent)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_gone(procs: list[tuple[str, psutil.Process]], bound_s: float, since: float) -> dict[str, float]:
    """role (pid) -> seconds after `since` it was last seen running; fails naming any still running."""
    ended: dict[str, float] = {}
    deadline = since + bound_s
    while True:
        running = [(r, p) for r, p in procs if alive(p)]
        now = time.monotonic()
        for role, proc in procs:
            if (role, proc) not in running:
                ended.setdefault(f"{role} ({proc.pid})", round(now - since, 2))
        if not running:
            return ended
        if now > deadline:
            message = ", ".join(f"{r} (pid {p.pid}, parent {p.ppid()})" for r, p in running)
            for _, proc in running:  # never leave them on the machine
                proc.kill()
            pytest.fail(f"still running {bound_s:g} s after the death: {message}")
        time.sleep(0.05)


# ---- serve ---------------------------------------------------------------------------------------------
class Served:
    """One `specbuild serve` process on fixed ports; ready, its tree known."""

    def __init__(self, repo: Path, ports: list[int], folder: Path, n: int):
        self.ports = ports
        self.out = folder / f"serve-{n}.out"
        argv = [
            sys.executable,
            "-m",
            "specbuild",
            "serve",
            str(repo),
            "--log-file",
            str(folder / f"triton-{n}.log"),
        ]
        for name, port in zip(("--grpc-port", "--http-port", "--metrics-port"), ports, strict=True):
            argv += [name, str(port)]
        with open(self.out, "w") as out:
            # die_with_parent: a test run that is itself killed leaves no server behind (the test kills
            # `serve` on purpose; the kernel's signal is only for the case its teardown never runs)
            self.proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=die_with_parent(),
            )
        deadline = time.monotonic() + READY_S
        while "ready:" not in self.output():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                pytest.fail(f"serve did not become ready:\n{self.output()}")
            time.sleep(0.2)
        self.tree = Tree.of(self.proc.pid)

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.ports[0]}"

    def output(self) -> str:
        return self.out.read_text(errors="replace")


def generate(url: str, n: int, *, timeout_s: float = 120, **kw):
    from specbuild.client.remote import generate_remote
    from specbuild.core.sampling_params import SamplingParams

    return generate_remote(url, PROMPT, SamplingParams(max_tokens=n, **kw), timeout_s=timeout_s)


class Load:
    """CLIENTS closed-loop clients streaming LONG_TOKENS each, until the server fails them or `stop()`."""

    def __init__(self, url: str):
        self.url = url
        self.outcomes: list[
            tuple[float, str, str]
        ] = []  # (when, "ok"|"error"|"crash", detail) after stop/kill
        self.streaming = [threading.Event() for _ in range(CLIENTS)]
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(CLIENTS)
        ]
        for thread in self._threads:
            thread.start()

    def _client(self, i: int) -> None:
        from specbuild.client.remote import generate_remote
        from specbuild.core.errors import ClientError
        from specbuild.core.sampling_params import SamplingParams

        while not self._stop.is_set():
            streaming = self.streaming[i] = threading.Event()
            try:
                result = generate_remote(
                    self.url,
                    LOAD_PROMPT,
                    SamplingParams(max_tokens=LONG_TOKENS),
                    stream=True,
                    timeout_s=DRAIN_S + 60,
                    on_text=lambda _, got=streaming: got.set(),
                )
            except ClientError as exc:
                self.outcomes.append((time.monotonic(), "error", f"{exc.what}: {exc.found}"))
                return  # the server failed this client: it stops
            except Exception as exc:  # noqa: BLE001 - reported by the test, never a hang
                self.outcomes.append((time.monotonic(), "crash", repr(exc)))
                return
            outcome = (
                "ok" if len(result.token_ids) == LONG_TOKENS else f"ok but {len(result.token_ids)} tokens"
            )
            self.outcomes.append((time.monotonic(), outcome, ""))

    def wait_in_flight(self) -> None:
        """Until some request streams text (it is in the engines) while every client waits on one (the
        server holds them all: streaming, or queued behind the engines' batch)."""
        deadline = time.monotonic() + 120
        while not any(event.is_set() for event in self.streaming):
            assert time.monotonic() < deadline and all(o[1] == "ok" for o in self.outcomes), (
                f"the load never streamed: {self.outcomes}"
            )
            time.sleep(0.05)
        assert all(o[1] == "ok" for o in self.outcomes), self.outcomes

    def since(self, start: float) -> list[tuple[float, str, str]]:
        return [o for o in self.outcomes if o[0] >= start]

    def stop(self, timeout_s: float) -> bool:
        """Let each client's running request end; False if one did not within timeout_s."""
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in self._threads)


# ---- the chain of servers of one kind --------------------------------------------------------------------
class Chain:
    """The live `serve` of one repository kind and the ports every server of the kind listens on."""

    def __init__(self, repo: Path, folder: Path):
        from specbuild.serve.tritonserver import free_port

        self.repo, self.folder = repo, folder
        self.ports = [free_port() for _ in range(3)]
        self.served: Served | None = None
        self.starts = 0
        self._trees: list[Tree] = []

    def live(self) -> Served:
        """The live server, or a new one (after killing whatever a failed case left of the last one: the
        ports must be free)."""
        if self.served is None:
            for tree in self._trees:
                for _, proc in tree.processes():
                    if alive(proc):
                        proc.kill()
            self.starts += 1
            self.served = Served(self.repo, self.ports, self.folder, self.starts)
            self._trees.append(self.served.tree)
        return self.served

    def stop(self) -> None:
        """SIGKILL the live server (its guardian cleans up: what the serve-SIGKILL case checks)."""
        served, self.served = self.served, None
        if served is not None and served.proc.poll() is None:
            served.proc.kill()
            served.proc.wait()
            wait_gone(served.tree.processes(), TREE_BOUND_S, time.monotonic())


@pytest.fixture(scope="module")
def chains(e2e_builds, e2e_llmapi_repo, tmp_path_factory):
    repos = {kind: repo for kind, (_, repo) in e2e_builds.items()}
    repos["llmapi"] = e2e_llmapi_repo[1]
    out = {kind: Chain(repo, tmp_path_factory.mktemp(f"tree-{kind}")) for kind, repo in repos.items()}
    yield out
    for chain in out.values():
        chain.stop()


# ---- the test --------------------------------------------------------------------------------------------
def _die(mode: str, served: Served) -> float:
    """Make `mode` happen; returns when the fatal signal went (monotonic)."""
    serve = served.proc
    if mode in ("serve-SIGTERM", "serve-SIGINT", "serve-SIGKILL"):
        serve.send_signal(getattr(signal, mode.partition("-")[2]))
    elif mode == "serve-SIGTERM+SIGKILL@2s":
        serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(SHORT_GRACE_S)
        except subprocess.TimeoutExpired:
            serve.kill()
    elif mode == "tritonserver-SIGKILL":
        served.tree.find("tritonserver").send_signal(signal.SIGKILL)
    else:  # stub:MODEL, engine:MODEL
        served.tree.find(mode).send_signal(signal.SIGKILL)
    return time.monotonic()


@pytest.mark.parametrize(("kind", "mode"), CASES)
def test_a_dying_process_takes_its_tree_and_leaves_nothing(kind, mode, chains, greedy):
    from specbuild.core.errors import ClientError

    chain = chains[kind]
    for other in chains.values():  # the cases run kind by kind: the other kinds' servers are done
        if other is not chain:
            other.stop()
    served = chain.live()
    tree = served.tree
    assert tree.with_role("stub:") == set(STUBS[kind]) and tree.with_role("engine:") == set(ENGINES[kind])
    assert tree.shm_left(), "a server's regions are in /dev/shm"
    text = greedy(PROMPT, EXACT_TOKENS)[0]
    assert len(greedy(LOAD_PROMPT, LONG_TOKENS)[1]) == LONG_TOKENS  # no end token: see LOAD_PROMPT

    load = Load(served.url)
    load.wait_in_flight()
    start = time.monotonic()
    killed_at = _die(mode, served)
    engine, graceful = mode.startswith("engine:"), mode in GRACEFUL
    if not engine:
        chain.served = None  # the next case starts its own server, whatever this one's outcome

    # the clients: none hangs; an error comes at once; an answer is complete or an error
    error_s = DRAIN_S if graceful else ERROR_S
    bound_s = DRAIN_S if graceful else ENGINE_RESTART_S if engine else ERROR_S
    assert load.stop(bound_s + killed_at - start), f"a request did not end within {bound_s:g} s"
    outcomes = [(round(t - killed_at, 2), what, detail) for t, what, detail in load.since(start)]
    assert all(what in ("ok", "error") for _, what, _ in outcomes), outcomes  # ok: complete
    late = [o for o in outcomes if o[1] == "error" and o[0] > error_s]  # named first: the list is long
    assert not late, f"errors later than {error_s:g} s after the death: {late}; every outcome: {outcomes}"
    if not graceful:  # requests were in flight in the process that died
        assert any(what == "error" for _, what, _ in outcomes), outcomes

    if engine:  # the model starts its engine again: the same server answers exactly
        killed = tree.find(mode)
        wait_gone([(mode, killed)], ERROR_S, killed_at)
        assert served.proc.poll() is None, served.output()
        assert generate(served.url, EXACT_TOKENS).text == text
        served.tree = Tree.of(served.proc.pid)
        assert served.tree.find(mode).pid != killed.pid
        return

    # the tree: every process ends, nothing is left in /dev/shm, serve says what happened
    code = served.proc.wait(DRAIN_S + TREE_BOUND_S)
    ended = wait_gone(tree.processes(), TREE_BOUND_S, killed_at)
    print(f"{kind} {mode}: errors at {[o[0] for o in outcomes if o[1] == 'error']} s, tree ended {ended}")
    left = tree.shm_left()
    for name in left:  # never leave them on the machine
        (Path("/dev/shm") / name).unlink(missing_ok=True)
    assert left == [], f"left in /dev/shm: {left}"
    output = served.output()
    if graceful:
        assert code == 0 and "stopping tritonserver" in output, output
    elif mode.startswith("serve-"):
        assert code in (-signal.SIGKILL, 0), output  # 0: the short grace was enough
    elif mode == "tritonserver-SIGKILL":
        assert code == 2 and "tritonserver exited (killed by SIGKILL)" in output, output
    else:
        model = mode.partition(":")[2]
        # serve names the dead model, or (a race in tritonserver 2.51's Python backend: the stub dies while
        # the server's side of a request is in flight, and libtriton_python throws out of a thread) the
        # server aborts first and serve says so; either way the tree ended and /dev/shm is clean (above)
        died = f"a model's Python-backend process died: {model}" in output
        aborted = "tritonserver exited (killed by SIGABRT)" in output
        assert code == 2 and (died or aborted), output
    assert "Traceback" not in output, output

    asked = time.monotonic()  # a new request fails at once
    with pytest.raises(ClientError):
        generate(served.url, EXACT_TOKENS, timeout_s=ERROR_S)
    assert time.monotonic() - asked < ERROR_S, "a request to the dead server did not fail at once"

    restarted = chain.live()  # on the same ports
    assert generate(restarted.url, EXACT_TOKENS).text == text, f"processes ended after (s): {ended}"
