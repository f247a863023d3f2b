"""train-medusa: HF Medusa output format, checkpoints, and resume after an interruption."""

from __future__ import annotations

import json

import pytest
from tolerances import REORDER_ULPS, assert_close

pytestmark = [pytest.mark.slow, pytest.mark.numeric]  # trains (a few seconds on the tiny model)

TEXT = "\n".join(
    ["The quick brown fox jumps over the lazy dog.", "def add(a, b):", "    return a + b", "import os"] * 6
)


class Interrupt(Exception):
    pass


def _config(tmp_path, model, out, **kw):
    from specbuild.tuning.config import TrainConfig

    data = tmp_path / "data.txt"
    data.write_text(TEXT)
    opts = dict(
        steps=7, lr=1e-2, batch_size=2, seq_len=16, checkpoint_every=3, num_heads=3, seed=5, device="cpu"
    )
    opts.update(kw)
    return TrainConfig(model=str(model), data=data, out=tmp_path / out, **opts)


def test_resume_continues_from_the_last_checkpoint_and_matches_an_uninterrupted_run(tmp_path, tiny_target):
    import torch
    from safetensors.torch import load_file

    from specbuild.core.errors import TrainingError
    from specbuild.tuning.train import train_medusa

    torch.set_num_threads(1)
    whole = train_medusa(_config(tmp_path, tiny_target, "whole"))
    assert whole.resumed_from is None

    cfg = _config(tmp_path, tiny_target, "split")

    def stop_at_5(step):
        if step == 5:
            raise Interrupt

    with pytest.raises(Interrupt):
        train_medusa(cfg, on_step=stop_at_5)
    assert not cfg.out.exists()  # an interrupted run leaves no folder that looks complete
    assert sorted(p.name for p in cfg.checkpoint_dir.iterdir() if p.name.startswith("step-")) == [
        "step-0000003"
    ]
    with pytest.raises(TrainingError, match="--resume"):  # refusing to silently start over
        train_medusa(cfg)

    steps_run = []
    resumed = train_medusa(_config(tmp_path, tiny_target, "split", resume=True), on_step=steps_run.append)
    assert resumed.resumed_from == 3
    assert steps_run == [4, 5, 6, 7]
    assert not cfg.checkpoint_dir.exists()  # removed after success

    a = load_file(str(whole.out / "medusa_lm_head.safetensors"))
    b = load_file(str(resumed.out / "medusa_lm_head.safetensors"))
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key  # exact: the same ops on the same data in one process
    # and training did change the weights
    assert a["0.0.linear.weight"].abs().sum() > 0


def test_resume_refuses_other_options(tmp_path, tiny_target):
    import torch

    from specbuild.core.errors import TrainingError
    from specbuild.tuning.train import train_medusa

    torch.set_num_threads(1)
    cfg = _config(tmp_path, tiny_target, "x", steps=4, checkpoint_every=2)

    def stop(step):
        if step == 3:
            raise Interrupt

    with pytest.raises(Interrupt):
        train_medusa(cfg, on_step=stop)
    with pytest.raises(TrainingError, match="other options"):
        train_medusa(_config(tmp_path, tiny_target, "x", steps=4, checkpoint_every=2, lr=5e-3, resume=True))


def test_output_is_the_hf_medusa_format(tmp_path, tiny_tied):
    """Tied embeddings: the per-head lm_heads start as the embedding; keys and config as Medusa
    writes them."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from specbuild.core.formats.manifest import read_manifest, verify_manifest
    from specbuild.tuning.heads import load_heads
    from specbuild.tuning.train import train_medusa

    torch.set_num_threads(1)
    res = train_medusa(_config(tmp_path, tiny_tied, "heads", steps=2, checkpoint_every=0, num_layers=2))
    tensors = load_file(str(res.out / "medusa_lm_head.safetensors"))
    hidden, vocab = 64, 384
    expected = {f"{h}.{j}.linear.{w}" for h in range(3) for j in range(2) for w in ("weight", "bias")} | {
        f"{h}.2.weight" for h in range(3)
    }
    assert set(tensors) == expected
    assert tensors["0.0.linear.weight"].shape == (hidden, hidden)
    assert tensors["2.2.weight"].shape == (vocab, hidden)
    cfg = json.loads((res.out / "config.json").read_text())
    assert (cfg["medusa_num_heads"], cfg["medusa_num_layers"], cfg["hidden_size"], cfg["vocab_size"]) == (
        3,
        2,
        hidden,
        vocab,
    )
    assert cfg["base_model_name_or_path"] == str(tiny_tied)
    metrics = json.loads((res.out / "metrics.json").read_text())
    assert [h["predicts"] for h in metrics["heads"]] == ["t+2", "t+3", "t+4"]
    assert all(0.0 <= h["top1"] <= h["topk"] <= 1.0 for h in metrics["heads"])
    assert read_manifest(res.out, kind="medusa_heads")["metrics"] == metrics
    assert verify_manifest(res.out) == []
    assert load_heads(res.out).config.num_layers == 2

    # untrained heads are exactly the base lm_head (= the tied embedding)
    from specbuild.tuning.config import TrainConfig
    from specbuild.tuning.hf_base import load_base
    from specbuild.tuning.train import new_heads

    base = load_base(str(tiny_tied), device="cpu")
    fresh = new_heads(
        base, TrainConfig(model=str(tiny_tied), data=tmp_path, out=tmp_path / "unused", num_heads=2)
    )
    emb = AutoModelForCausalLM.from_pretrained(str(tiny_tied)).get_input_embeddings().weight
    assert torch.equal(fresh.heads[1][-1].weight, emb)
    ids = torch.tensor([[5, 9, 11]])
    assert_close(
        fresh(base.hidden(ids))[0], base.logits(ids), ulps=REORDER_ULPS
    )  # float32: heads' lm_head vs the model's


def test_cli_errors_are_typed(tmp_path, tiny_target):
    from typer.testing import CliRunner

    from specbuild.cli import app

    (tmp_path / "exists").mkdir()
    (tmp_path / "d.txt").write_text(TEXT)
    r = CliRunner().invoke(
        app,
        [
            "train-medusa",
            str(tiny_target),
            "--data",
            str(tmp_path / "d.txt"),
            "--out",
            str(tmp_path / "exists"),
        ],
    )
    assert r.exit_code == 2 and "already exists" in r.output
    r = CliRunner().invoke(
        app,
        [
            "train-medusa",
            str(tiny_target),
            "--data",
            str(tmp_path / "missing.txt"),
            "--out",
            str(tmp_path / "o"),
        ],
    )
    assert r.exit_code == 2 and "not found" in r.output


def test_distill_new_tokens_sets_each_answers_length_and_reaches_the_cli(tmp_path, tiny_target, monkeypatch):
    """--self-distill continues each prompt tail (seq_len/2 tokens) by --distill-new-tokens greedy tokens
    (default: the rest of one window); the CLI passes the option on and refuses 0."""
    import torch
    from typer.testing import CliRunner

    import specbuild.tuning.train as train
    from specbuild.cli import app
    from specbuild.tuning.data import encode
    from specbuild.tuning.hf_base import load_base
    from specbuild.tuning.progress import Reporter

    torch.set_num_threads(1)
    base = load_base(str(tiny_target), device="cpu")
    prompts = encode(base.tokenizer, TEXT.splitlines()[:4])
    lengths = {}
    for new in (None, 20):
        cfg = _config(tmp_path, tiny_target, f"d{new}", self_distill=True, distill_new_tokens=new, seq_len=16)
        out = train._self_distill(cfg, base, prompts, Reporter())
        tails = [p[-8:] for p in prompts]  # seq_len // 2 of each prompt
        assert [seq[: len(t)] for seq, t in zip(out, tails, strict=True)] == tails
        lengths[new] = [len(seq) - len(t) for seq, t in zip(out, tails, strict=True)]
    assert max(lengths[None]) == 8 and max(lengths[20]) == 20  # up to the first EOS
    assert all(n <= 20 for n in lengths[20])

    seen = []
    monkeypatch.setattr(train, "train_medusa", lambda config, **_: seen.append(config) or 1 / 0)
    argv = [
        "train-medusa",
        str(tiny_target),
        "--data",
        str(tmp_path / "data.txt"),
        "--out",
        str(tmp_path / "o"),
    ]
    CliRunner().invoke(app, [*argv, "--self-distill", "--distill-new-tokens", "96"])
    assert seen and seen[0].distill_new_tokens == 96
    monkeypatch.undo()
    r = CliRunner().invoke(app, [*argv, "--self-distill", "--distill-new-tokens", "0"])
    assert r.exit_code == 2 and "distill_new_tokens=0" in r.output
