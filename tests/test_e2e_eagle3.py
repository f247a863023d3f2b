"""EAGLE-3 served end to end: a tiny target and an EAGLE-3 draft `train-eagle3` trained on it, the spec
(examples/tiny/eagle3.yaml) compiled with `--flow llmapi --engine reference`, laid out as Triton's LLM-API
model (`repo --backend llmapi-local`) and served by `specbuild serve --openai-port` (a real tritonserver
and the OpenAI frontend, one process tree). Greedy output equals the target alone's through Triton (unary
and streamed) and through the `openai` client; the perf outputs carry acceptance_rate /
total_accepted_draft_tokens / total_draft_tokens; `bench` and `repo check` work on it.

The draft is trained on the answers to PROMPTS, so it drafts them well: the accepted drafts are what the
equality is about (a draft that is never right would pass it trivially)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest
from test_eagle3_train import PROMPTS  # the draft learns the answers to these

pytestmark = pytest.mark.slow

MAX_TOKENS = 16  # within the training answers (seq_len 48: 24 answer tokens)
K = 4  # examples/tiny/eagle3.yaml speculation.max_draft_len
READY_S = 600  # a loaded shared CPU took minutes to load the LLM-API model (engine process + warm-up)


@pytest.fixture(scope="module")
def target4(make_tiny):
    return make_tiny("target4", num_layers=4, num_heads=4, num_kv_heads=2, seed=11)


@pytest.fixture(scope="module")
def e3_draft(target4, tmp_path_factory):
    """An EAGLE-3 draft trained by train-eagle3 on the target's answers to PROMPTS (layers 0, 1, 2)."""
    from specbuild.tuning.config import Eagle3TrainConfig
    from specbuild.tuning.eagle3_train import train_eagle3

    root = tmp_path_factory.mktemp("e3-serve-draft")
    data = root / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    config = Eagle3TrainConfig(
        model=str(target4),
        data=data,
        out=root / "eagle3",
        steps=60,
        batch_size=8,
        seq_len=48,
        layers=(0, 1, 2),
        draft_vocab_size=128,
        device="cpu",
        checkpoint_every=0,
        heldout_fraction=0.0,
    )
    return train_eagle3(config).out


@pytest.fixture(scope="module")
def e3_build(tmp_path_factory, target4, e3_draft):
    """(build, repository): examples/tiny/eagle3.yaml -> compile --flow llmapi --engine reference -> repo
    --backend llmapi-local --decoupled."""
    from e2e_fixtures import _llmapi_repo

    root = tmp_path_factory.mktemp("e2e-eagle3")
    return _llmapi_repo(root, "eagle3.yaml", {"target": target4, "eagle3": e3_draft})


@pytest.fixture(scope="module")
def engine(e3_build):
    """The build's reference engine in-process (target + EAGLE-3 draft)."""
    import torch

    from specbuild.engines.reference.engine import ReferenceEngine

    torch.set_num_threads(1)
    return ReferenceEngine.load(e3_build[0])


@pytest.fixture(scope="module")
def target_alone(engine):
    """prompt -> (text, token ids, prompt ids) of the target alone, greedy, in-process."""
    from specbuild.core.sampling_params import SamplingParams

    out = {}
    for prompt in PROMPTS:
        ids = engine.encode(prompt)
        r = engine.generate(ids, SamplingParams(max_tokens=MAX_TOKENS), speculative=False)
        out[prompt] = (r.text, r.token_ids, ids)
    return out


class Served:
    """`specbuild serve REPO --openai-port P` in a process of its own, until the module ends."""

    def __init__(self, repo, folder):
        from specbuild.serve.tritonserver import free_port

        self.grpc, self.http, self.metrics, self.openai = (free_port() for _ in range(4))
        self.out = folder / "serve.out"
        argv = [
            sys.executable,
            "-m",
            "specbuild",
            "serve",
            str(repo),
            "--log-file",
            str(folder / "triton.log"),
        ]
        argv += ["--grpc-port", str(self.grpc), "--http-port", str(self.http)]
        argv += ["--metrics-port", str(self.metrics), "--openai-port", str(self.openai)]
        argv += ["--served-model-name", "e3"]
        with open(self.out, "w") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + READY_S
        while "OpenAI" not in self.output():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"serve did not become ready:\n{self.output()}")
            time.sleep(0.2)

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc}"

    def output(self) -> str:
        return self.out.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def served(e3_build, tmp_path_factory):
    server = Served(e3_build[1], tmp_path_factory.mktemp("e3-serve"))
    try:
        yield server
    finally:
        server.stop()


def _generate(url, prompt, **kw):
    from specbuild.client.remote import generate_remote
    from specbuild.core.sampling_params import SamplingParams

    return generate_remote(url, prompt, SamplingParams(max_tokens=MAX_TOKENS), timeout_s=300, **kw)


def test_in_process_speculation_equals_the_target_alone(engine, target_alone):
    from specbuild.core.sampling_params import SamplingParams

    accepted = 0
    for prompt, (_, ids, prompt_ids) in target_alone.items():
        r = engine.generate(prompt_ids, SamplingParams(max_tokens=MAX_TOKENS))
        assert r.token_ids == ids, prompt
        accepted += r.stats.accepted
    assert engine.method.value == "eagle3" and accepted > 0


def test_greedy_through_triton_equals_the_target_alone(served, target_alone):
    accepted = drafted = 0
    for prompt, (text, ids, _) in target_alone.items():
        unary = _generate(served.grpc_url, prompt)
        streamed = _generate(served.grpc_url, prompt, stream=True)
        assert unary.token_ids == ids and unary.text == text, prompt
        assert streamed.token_ids == ids and streamed.text == text, prompt
        s, st = unary.stats, streamed.stats
        assert unary.speculative and 0 <= s.accepted <= s.drafted and s.drafted > 0
        assert (st.accepted, st.drafted) == (s.accepted, s.drafted)  # greedy: the same rounds
        # each streamed response is one engine round: its tokens are the accepted drafts + 1
        assert sum(st.accepted_per_step) + st.target_passes == len(ids)
        # the rounds rebuilt from the responses' sizes (none in the context phase, then min(K, left - 1))
        assert sum(st.drafted_per_step) == st.drafted and max(st.drafted_per_step) <= K
        accepted, drafted = accepted + s.accepted, drafted + s.drafted
    assert accepted > 0.1 * drafted  # the trained draft is right often (0.24 measured in-process)


def test_perf_outputs_are_the_llmapi_models(served, target_alone):
    """Triton's LLM-API model's own outputs, read with tritonclient: the request's speculative counters."""
    import tritonclient.grpc as grpcclient

    def tensor(name, value, dtype):
        t = grpcclient.InferInput(name, [1], dtype)
        t.set_data_from_numpy(np.array([value], dtype=object if dtype == "BYTES" else None))
        return t

    prompt = PROMPTS[1]
    inputs = [
        tensor("text_input", prompt.encode(), "BYTES"),
        tensor("sampling_param_max_tokens", np.int32(MAX_TOKENS), "INT32"),
        tensor("sampling_param_temperature", np.float32(0.0), "FP32"),
        tensor("sampling_param_exclude_input_from_output", True, "BOOL"),
        tensor("sampling_param_return_perf_metrics", True, "BOOL"),
    ]
    import queue

    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(served.grpc_url)
    client.start_stream(callback=lambda result, error: results.put(error or result))
    try:  # the repository is decoupled (the demo and these tests stream): a one-request stream
        client.async_stream_infer("tensorrt_llm", inputs, request_id="perf")
        result = results.get(timeout=300)
    finally:
        client.stop_stream()
        client.close()
    assert not isinstance(result, Exception), result
    # upstream sends them as strings of the values (llmapi_core.py)
    accepted = int(result.as_numpy("total_accepted_draft_tokens")[0])
    drafted = int(result.as_numpy("total_draft_tokens")[0])
    rate = float(result.as_numpy("acceptance_rate")[0])
    assert result.as_numpy("text_output")[0].decode() == target_alone[prompt][0]
    assert 0 < accepted <= drafted and rate == pytest.approx(accepted / drafted, rel=1e-6)  # float32


def test_openai_client_gets_the_target_alones_text(served, target_alone):
    import openai

    c = openai.OpenAI(
        base_url=f"http://127.0.0.1:{served.openai}/v1", api_key="unused", max_retries=0, timeout=300
    )
    assert [m.id for m in c.models.list().data] == ["e3"]
    prompt = PROMPTS[0]
    text, ids, prompt_ids = target_alone[prompt]
    r = c.completions.create(model="e3", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0)
    assert r.choices[0].text == text and r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(prompt_ids), len(ids))
    spec = r.model_extra["metrics"]["speculative_decoding"]
    assert spec["num_spec_tokens"] == K and spec["num_draft_tokens"] > 0
    assert sum(j * n for j, n in enumerate(spec["acceptance_histogram"])) == spec["num_accepted_draft_tokens"]
    stream = c.completions.create(
        model="e3", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, stream=True
    )
    assert "".join(ch.choices[0].text for ch in stream if ch.choices) == text


def test_bench_and_repo_check(served, e3_build, tmp_path):
    from specbuild.bench.bench import run_bench
    from specbuild.bench.options import BenchConfig
    from specbuild.bench.report import write_report
    from specbuild.model_repo.check import check_repo

    assert check_repo(e3_build[1]) == []
    config = BenchConfig(
        url=served.grpc_url,
        prompts=PROMPTS[:3],
        concurrency=(1, 2),
        temperatures=(0.0,),
        max_tokens=8,
        metrics_url=f"http://127.0.0.1:{served.metrics}/metrics",
        timeout_s=300,
    )
    runs, context = run_bench(config)
    assert [r.mode for r in runs] == ["speculative", "speculative"]
    assert context["interface"] == "llmapi" and context["num_draft_tokens"] == K
    for run in runs:
        m = run.metrics
        assert m["output_sequence_length"]["avg"] == 8
        assert m["mean_accepted_tokens_per_pass"] > 1.0  # the trained draft's drafts are taken
        assert m["alpha"] == m["alpha"]  # the rounds are known (not NaN)
        # the draft layer costs a pass per draft, unknown through this interface: no prediction at c = 0
        assert "speedup_predicted" not in m
        check = m["prometheus_check"]  # trtllm-serve's spec-decode series agree with the requests
        assert check["agree"], check
        assert check["prometheus"]["drafted"] == sum(r.drafted for r in run.records) > 0
    write_report(runs, context, tmp_path)
    profile = json.loads((tmp_path / "speculation_profile.json").read_text())
    assert profile["num_speculative_tokens"] == K and profile["method"] == "eagle3"
