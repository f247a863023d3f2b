"""What `specbuild bench` runs: its options and prompts (light at import: the CLI reads the defaults)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from specbuild.core.addresses import grpc_address, http_url
from specbuild.core.errors import ClientError
from specbuild.core.sampling_params import DEFAULT_MAX_TOKENS, SamplingParams

DEFAULT_CONCURRENCY = (1, 2, 4, 8)
DEFAULT_TEMPERATURES = (0.0, 0.8)
DEFAULT_TIMEOUT_S = 120.0
DEFAULT_OUT = Path("build/bench")
MAX_CONCURRENCY = 256  # threads, each with its own gRPC stream
MAX_PROMPT_FILE_BYTES = 64 * 2**20  # a prompt file is read whole: bound it
WORKLOADS = ("single", "multiturn")
DEFAULT_CONVERSATIONS = 4
DEFAULT_TURNS = 3
MAX_TURNS = 64
MAX_WAVES = 64  # --waves bound: requests per run = max(prompts, waves x concurrency)
# the shared system prompt of the multi-turn workload: every conversation starts with it (a shared prefix)
DEFAULT_SYSTEM_PROMPT = (
    "You are a careful assistant for Python programmers. Answer with short, correct code and plain words. "
    "Keep the context of the conversation in mind."
)


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    url: str
    prompts: tuple[str, ...]
    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    temperatures: tuple[float, ...] = DEFAULT_TEMPERATURES
    max_tokens: int = DEFAULT_MAX_TOKENS
    num_draft_tokens: int | None = None  # None: the repository's K (its BLS default_num_draft_tokens)
    seed: int = 0  # T > 0 requests use seed + prompt index: runs are repeatable
    timeout_s: float = DEFAULT_TIMEOUT_S
    rounds: int = 1  # interleaved repeats of every (temperature, concurrency, mode) run (medians reported)
    # load-aware benches: after `rounds`, one more round at each (T, c) whose schedule bars the sign test
    # leaves undecided (bench/load_bench.bar_decision), up to this many rounds in all (0: no more)
    max_rounds: int = 0
    fixed_ks: tuple[int, ...] = ()  # extra fixed K runs beside the repository's K (load-aware benches)
    metrics_url: str | None = None  # the server's Prometheus endpoint: cross-check the speculative counters
    workload: str = "single"  # single | multiturn
    conversations: int = DEFAULT_CONVERSATIONS  # multiturn: conversations per run (prompts cycle as turns)
    turns: int = DEFAULT_TURNS  # multiturn: user turns per conversation
    system_prompt: str = DEFAULT_SYSTEM_PROMPT  # multiturn: the shared prefix
    unary_baseline: bool = True  # also the target alone in one unary call per request (throughput only)
    streamed_baseline: bool = True  # the target alone streamed (num_draft_tokens 0: one BLS call per token)
    aa_baseline: bool = False  # the one-call baseline twice per round (bench/metrics.UNARY_BASELINE_AGAIN)
    # load-aware benches: right before every benched run, the same run on these prompts (the tune prompts,
    # never the benched ones) calibrates the served cost model (bench/serve_curve.py); the benched run
    # carries its prediction (metrics["predicted_tokens_per_s"]). Once per (T, c, mode) was not enough
    # on this noisy host: one slow calibration run put every round of its mode at 1.22.
    calibration_prompts: tuple[str, ...] = ()
    # single workload: each run at concurrency c sends max(len(prompts), waves x c) requests, the prompts
    # cycled in order (run_prompts). One request per worker measures a burst (every worker starts at once
    # and the run ends with its slowest request), not the throughput the closed loop settles into.
    waves: int = 1

    def __post_init__(self) -> None:
        if self.workload not in WORKLOADS:
            raise ClientError(
                f"unknown --workload {self.workload!r}",
                expected=" | ".join(WORKLOADS),
                found=self.workload,
                fix="pass --workload single or --workload multiturn",
            )
        for name, value, high in (
            ("conversations", self.conversations, 1024),
            ("turns", self.turns, MAX_TURNS),
        ):
            if not 1 <= value <= high:
                raise ClientError(
                    f"--{name} must be from 1 to {high}, got {value}", fix=f"pass --{name} {DEFAULT_TURNS}"
                )
        bad = [c for c in self.concurrency if not 1 <= c <= MAX_CONCURRENCY]
        if bad or not self.concurrency:
            raise ClientError(
                "--concurrency values must be whole numbers from 1",
                expected=f"1 .. {MAX_CONCURRENCY}",
                found=",".join(str(c) for c in self.concurrency) or "none",
                fix="pass --concurrency 1,2,4",
            )
        if not self.prompts:
            raise ClientError("no prompts to send", fix="pass --prompts FILE with one prompt per line")
        if self.num_draft_tokens is not None and self.num_draft_tokens < 0:
            raise ClientError(
                f"--num-draft-tokens must be >= 0, got {self.num_draft_tokens}",
                fix="pass --num-draft-tokens 4",
            )
        if not 1 <= self.rounds <= 100:
            raise ClientError(f"--rounds must be in 1..100, got {self.rounds}", fix="pass --rounds 3")
        if self.max_rounds and not self.rounds <= self.max_rounds <= 100:
            raise ClientError(
                f"--max-rounds must be in --rounds ({self.rounds})..100, got {self.max_rounds}",
                fix=f"pass --max-rounds {max(self.rounds, 8)}, or leave it out",
            )
        if not 1 <= self.waves <= MAX_WAVES:
            raise ClientError(f"--waves must be in 1..{MAX_WAVES}, got {self.waves}", fix="pass --waves 4")
        if any(k < 1 for k in self.fixed_ks):
            raise ClientError(
                f"--fixed-k values must be >= 1, got {','.join(map(str, self.fixed_ks))}",
                fix="pass --fixed-k 2,4",
            )
        if not self.timeout_s > 0:
            raise ClientError(
                f"--timeout must be > 0 seconds, got {self.timeout_s}", fix="pass --timeout 120"
            )
        for t in self.temperatures:  # the same checks a request's SamplingParams makes, before any run starts
            SamplingParams(max_tokens=self.max_tokens, temperature=t)
        grpc_address(self.url, option="--url")
        if self.metrics_url is not None:
            http_url(self.metrics_url, option="--metrics-url")


def run_prompts(prompts: tuple[str, ...], concurrency: int, waves: int = 1) -> tuple[str, ...]:
    """The prompts one closed-loop run at `concurrency` sends: all of them, cycled in order up to
    waves x concurrency requests when that is more."""
    return tuple(prompts[i % len(prompts)] for i in range(run_length(len(prompts), concurrency, waves)))


def run_length(prompts: int, concurrency: int, waves: int = 1) -> int:
    """Requests one closed-loop run sends (run_prompts)."""
    return max(prompts, waves * concurrency)


def load_prompts(path: Path) -> tuple[str, ...]:
    """JSONL with a "prompt" field per line, or plain text with one prompt per line (UTF-8, bounded)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_PROMPT_FILE_BYTES + 1)
    except OSError as exc:
        raise ClientError(
            f"cannot read the prompt file {path}", found=str(exc), fix="pass --prompts FILE"
        ) from None
    if len(raw) > MAX_PROMPT_FILE_BYTES:
        raise ClientError(
            f"the prompt file {path} is larger than {MAX_PROMPT_FILE_BYTES // 2**20} MiB",
            fix="pass a smaller --prompts file",
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ClientError(
            f"{path}:{line}: not valid UTF-8 text",
            found=f"byte {raw[exc.start : exc.start + 1]!r}",
            fix="save the prompt file as UTF-8",
        ) from None
    lines = [line for line in text.splitlines() if line.strip()]
    prompts = []
    for number, line in enumerate(lines, 1):
        if line.lstrip().startswith("{"):
            try:
                prompts.append(str(json.loads(line)["prompt"]))
            except (ValueError, KeyError, TypeError):
                raise ClientError(
                    f'{path}:{number}: not a JSON object with a "prompt" field',
                    found=line[:80],
                    fix='write one {"prompt": "..."} per line',
                ) from None
        else:
            prompts.append(line)
    if not prompts:
        raise ClientError(f"{path} holds no prompts", fix="one prompt per line, or JSONL with a prompt field")
    return tuple(prompts)


def default_prompts_file() -> Path:
    return Path(__file__).resolve().parent.parent / "data" / "prompts.jsonl"
