"""`specbuild bench`: the same prompts with speculation off (target alone) and on, per temperature
and concurrency, through a running tritonserver (streaming requests, as genai-perf measures).

Baseline: draft/target repositories send `num_draft_tokens = 0` to `tensorrt_llm_bls` (the BLS
then calls the target alone). A Medusa engine always speculates, so a Medusa repository has no
baseline run here (measured speedup is left empty; the predicted one is still reported).

Cost ratio c (draft pass / target pass): measured through the same server by timing the
`tensorrt_llm_draft` and `tensorrt_llm` models directly on the first prompt's token ids,
generating n tokens and 1 token each; c = (t_draft(n) - t_draft(1)) / (t_target(n) - t_target(1)),
which cancels the prefill and the request overhead. Medusa heads cost ~nothing next to the
target: c = 0 there.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from specbuild.client.metrics import RequestRecord, RunSummary, attach_speedups, summarize_run
from specbuild.errors import ClientError
from specbuild.sampling_params import DEFAULT_MAX_TOKENS, SamplingParams

DEFAULT_CONCURRENCY = (1, 2, 4, 8)
DEFAULT_TEMPERATURES = (0.0, 0.8)
DEFAULT_NUM_DRAFT_TOKENS = 4
DEFAULT_TIMEOUT_S = 120.0
DEFAULT_OUT = Path("build/bench")
COST_TOKENS = 16  # tokens generated per timing call when measuring c
COST_REPEATS = 3  # best of N per timing (less noise from other work on the host)
MAX_CONCURRENCY = 256  # threads, each with its own gRPC stream
MAX_PROMPT_FILE_BYTES = 64 * 2**20  # a prompt file is read whole: bound it


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    url: str
    prompts: tuple[str, ...]
    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    temperatures: tuple[float, ...] = DEFAULT_TEMPERATURES
    max_tokens: int = DEFAULT_MAX_TOKENS
    num_draft_tokens: int = DEFAULT_NUM_DRAFT_TOKENS
    seed: int = 0  # T > 0 requests use seed + prompt index: runs are repeatable
    timeout_s: float = DEFAULT_TIMEOUT_S

    def __post_init__(self) -> None:
        bad = [c for c in self.concurrency if not 1 <= c <= MAX_CONCURRENCY]
        if bad or not self.concurrency:
            raise ClientError("--concurrency values must be whole numbers from 1", expected=f"1 .. {MAX_CONCURRENCY}",
                              found=",".join(str(c) for c in self.concurrency) or "none", fix="pass --concurrency 1,2,4")
        if not self.prompts:
            raise ClientError("no prompts to send", fix="pass --prompts FILE with one prompt per line")
        if self.num_draft_tokens < 0:
            raise ClientError(f"--num-draft-tokens must be >= 0, got {self.num_draft_tokens}", fix="pass --num-draft-tokens 4")
        if not self.timeout_s > 0:
            raise ClientError(f"--timeout must be > 0 seconds, got {self.timeout_s}", fix="pass --timeout 120")
        for t in self.temperatures:  # the same checks a request's SamplingParams makes, before any run starts
            SamplingParams(max_tokens=self.max_tokens, temperature=t)


def load_prompts(path: Path) -> tuple[str, ...]:
    """JSONL with a "prompt" field per line, or plain text with one prompt per line."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_PROMPT_FILE_BYTES + 1)
    except OSError as exc:
        raise ClientError(f"cannot read the prompt file {path}", found=str(exc), fix="pass --prompts FILE") from None
    if len(raw) > MAX_PROMPT_FILE_BYTES:
        raise ClientError(f"the prompt file {path} is larger than {MAX_PROMPT_FILE_BYTES // 2**20} MiB",
                          fix="pass a smaller --prompts file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise ClientError(f"{path}:{line}: not valid UTF-8 text", found=f"byte {raw[exc.start:exc.start + 1]!r}",
                          fix="save the prompt file as UTF-8") from None
    lines = [line for line in text.splitlines() if line.strip()]
    prompts = []
    for number, line in enumerate(lines, 1):
        if line.lstrip().startswith("{"):
            try:
                prompts.append(str(json.loads(line)["prompt"]))
            except (ValueError, KeyError, TypeError):
                raise ClientError(f"{path}:{number}: not a JSON object with a \"prompt\" field",
                                  found=line[:80], fix='write one {"prompt": "..."} per line') from None
        else:
            prompts.append(line)
    if not prompts:
        raise ClientError(f"{path} holds no prompts", fix="one prompt per line, or JSONL with a prompt field")
    return tuple(prompts)


def default_prompts_file() -> Path:
    return Path(__file__).resolve().parent.parent / "data" / "prompts.jsonl"


def _one_request(config: BenchConfig, prompt: str, index: int, *, temperature: float, k: int | None) -> RequestRecord:
    from specbuild.client.remote import generate_remote

    params = SamplingParams(max_tokens=config.max_tokens, temperature=temperature,
                            seed=config.seed + index if temperature > 0 else None)
    result = generate_remote(config.url, prompt, params, stream=True, num_draft_tokens=k, timeout_s=config.timeout_s)
    t = result.timings
    return RequestRecord(
        ttft_s=t.get("ttft", t["total"]), latency_s=t["total"], output_tokens=len(result.token_ids),
        target_passes=int(t.get("chunks", 0)), drafted=result.stats.drafted, accepted=result.stats.accepted,
        accepted_per_step=tuple(result.stats.accepted_per_step),
    )


def run_once(config: BenchConfig, *, mode: str, temperature: float, concurrency: int, k: int | None,
             advance: Callable[[], None]) -> RunSummary:
    """All prompts at one concurrency; duration = first send to last answer."""
    lock = threading.Lock()

    def task(item: tuple[int, str]) -> RequestRecord:
        record = _one_request(config, item[1], item[0], temperature=temperature, k=k)
        with lock:
            advance()
        return record

    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        records = list(pool.map(task, enumerate(config.prompts)))
    duration = time.monotonic() - t0
    return summarize_run(records, mode=mode, temperature=temperature, concurrency=concurrency,
                         num_draft_tokens=k or 0, duration_s=duration)


def run_bench(config: BenchConfig, *, console=None) -> tuple[list[RunSummary], dict]:
    """Every (temperature, concurrency, mode) run with a progress bar; returns runs and context."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from specbuild.client.remote import connect, model_info

    client = connect(config.url)
    try:
        info = model_info(client, None)
        cost_ratio = measure_cost_ratio(client, config.prompts[0]) if info.draft_target else 0.0
    finally:
        client.close()
    modes = [("baseline", 0), ("speculative", config.num_draft_tokens)] if info.draft_target else [("speculative", None)]
    plan = [(t, c, m, k) for t in config.temperatures for c in config.concurrency for m, k in modes]
    runs: list[RunSummary] = []
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=False) as progress:
        bar = progress.add_task("bench", total=len(plan) * len(config.prompts))
        for temperature, concurrency, mode, k in plan:
            progress.update(bar, description=f"{mode:11s} T={temperature:g} c={concurrency}")
            run = run_once(config, mode=mode, temperature=temperature, concurrency=concurrency, k=k,
                           advance=lambda: progress.advance(bar))
            runs.append(run)
    attach_speedups(runs, cost_ratio=cost_ratio)
    context = {"url": config.url, "model": info.name, "mode": "draft_target" if info.draft_target else "medusa",
               "cost_ratio": cost_ratio, "cost_ratio_method": "draft-only vs target-only timing" if info.draft_target
               else "Medusa heads: c = 0", "prompts": len(config.prompts), "max_tokens": config.max_tokens,
               "num_draft_tokens": config.num_draft_tokens}
    return runs, context


def _time_generate(client, model: str, ids, n: int) -> float:
    import numpy as np
    import tritonclient.grpc as grpcclient

    def tensor(name, array):
        t = grpcclient.InferInput(name, list(array.shape), "INT32")
        t.set_data_from_numpy(array)
        return t

    inputs = [tensor("input_ids", ids[None, :]), tensor("input_lengths", np.array([[len(ids)]], dtype=np.int32)),
              tensor("request_output_len", np.array([[n]], dtype=np.int32))]
    best = float("inf")
    for _ in range(COST_REPEATS):
        t0 = time.perf_counter()
        client.infer(model, inputs)
        best = min(best, time.perf_counter() - t0)
    return best


def measure_cost_ratio(client, prompt: str) -> float | None:
    """c = draft pass / target pass time, from direct calls to both models (None if unmeasurable)."""
    import numpy as np
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    try:
        q = grpcclient.InferInput("QUERY", [1, 1], "BYTES")
        q.set_data_from_numpy(np.array([[prompt.encode()]], dtype=object))
        n = grpcclient.InferInput("REQUEST_OUTPUT_LEN", [1, 1], "INT32")
        n.set_data_from_numpy(np.array([[1]], dtype=np.int32))
        ids = client.infer("preprocessing", [q, n]).as_numpy("INPUT_ID").reshape(-1).astype(np.int32)  # [L]
        draft = _time_generate(client, "tensorrt_llm_draft", ids, COST_TOKENS) - _time_generate(client, "tensorrt_llm_draft", ids, 1)
        target = _time_generate(client, "tensorrt_llm", ids, COST_TOKENS) - _time_generate(client, "tensorrt_llm", ids, 1)
    except InferenceServerException:
        return None
    if target <= 0:
        return None
    return max(draft, 0.0) / target
