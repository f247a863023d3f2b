"""Round trip: un-shard every rank file of a converted checkpoint and get each HF tensor back exactly.

The inverse below is written independently of the converter (it re-derives the PP layer split with
torch.tensor_split and the QKV / vocab layouts from trtllm.md §2.3-2.4), so a converter bug cannot
cancel itself out.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from specbuild.core.formats.manifest import read_manifest, verify_manifest
from specbuild.engines.trtllm.convert import convert_checkpoint
from specbuild.engines.trtllm.medusa import MedusaHeadsSource

pytestmark = (
    pytest.mark.numeric
)  # float results through CPU kernels: `make test-isa` runs them per kernel family


def hf_tensors(folder: Path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def make_heads(
    folder: Path,
    *,
    hidden: int,
    vocab: int,
    heads: int,
    layers: int,
    config: dict | None = None,
    seed: int = 0,
    fmt: str = "safetensors",
) -> Path:
    """Random HF Medusa heads: {h}.{j}.linear.weight|bias and {h}.{L}.weight (FasterDecoding format)."""
    g = torch.Generator().manual_seed(seed)
    state = {}
    for h in range(heads):
        for j in range(layers):
            state[f"{h}.{j}.linear.weight"] = torch.randn(hidden, hidden, generator=g)
            state[f"{h}.{j}.linear.bias"] = torch.randn(hidden, generator=g)
        state[f"{h}.{layers}.weight"] = torch.randn(vocab, hidden, generator=g)
    folder.mkdir(parents=True, exist_ok=True)
    if fmt == "safetensors":
        save_file(state, folder / "medusa_lm_head.safetensors")
    else:
        torch.save(state, folder / "medusa_lm_head.pt")
    cfg = {"medusa_num_heads": heads, "medusa_num_layers": layers} if config is None else config
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def unshard(ckpt: Path) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], int]:
    """(HF-named model tensors, HF-named Medusa tensors, tensors written) from rank{N}.safetensors."""
    cfg = json.loads((ckpt / "config.json").read_text())
    tp, pp = cfg["mapping"]["tp_size"], cfg["mapping"]["pp_size"]
    assert cfg["mapping"]["world_size"] == tp * pp
    nh, nkv, hd, V = (
        cfg["num_attention_heads"],
        cfg["num_key_value_heads"],
        cfg["head_size"],
        cfg["vocab_size"],
    )
    L = cfg["num_hidden_layers"]
    ranks = [load_file(ckpt / f"rank{r}.safetensors") for r in range(tp * pp)]
    assert not (ckpt / f"rank{tp * pp}.safetensors").exists()
    stages = torch.tensor_split(torch.arange(L), pp)
    out: dict[str, torch.Tensor] = {}
    heads: dict[str, torch.Tensor] = {}

    def same(tensors):  # replicated tensors must be identical on every TP rank
        for t in tensors[1:]:
            assert torch.equal(t, tensors[0])
        return tensors[0]

    for s, layers in enumerate(stages):
        group = ranks[s * tp : (s + 1) * tp]  # TP ranks of stage s
        for i, layer in enumerate(layers.tolist()):
            p, hp = f"transformer.layers.{i}.", f"model.layers.{layer}."
            for kind in ("weight", "bias"):
                if p + f"attention.qkv.{kind}" not in group[0]:
                    assert kind == "bias"
                    continue
                parts = [g[p + f"attention.qkv.{kind}"] for g in group]
                qn, kvn = nh // tp * hd, max(nkv // tp, 1) * hd
                for part in parts:
                    assert part.shape[0] == qn + 2 * kvn
                qs = [t[:qn] for t in parts]
                ks = [t[qn : qn + kvn] for t in parts]
                vs = [t[qn + kvn :] for t in parts]
                if nkv >= tp:
                    k, v = torch.cat(ks), torch.cat(vs)
                else:  # rank r holds KV head r // (tp/nkv); the repeats must agree
                    reps = tp // nkv
                    k = torch.cat([same(ks[h * reps : (h + 1) * reps]) for h in range(nkv)])
                    v = torch.cat([same(vs[h * reps : (h + 1) * reps]) for h in range(nkv)])
                out[hp + f"self_attn.q_proj.{kind}"] = torch.cat(qs)
                out[hp + f"self_attn.k_proj.{kind}"] = k
                out[hp + f"self_attn.v_proj.{kind}"] = v
            out[hp + "self_attn.o_proj.weight"] = torch.cat(
                [g[p + "attention.dense.weight"] for g in group], dim=1
            )
            out[hp + "mlp.gate_proj.weight"] = torch.cat([g[p + "mlp.fc.weight"] for g in group])
            out[hp + "mlp.up_proj.weight"] = torch.cat([g[p + "mlp.gate.weight"] for g in group])
            out[hp + "mlp.down_proj.weight"] = torch.cat([g[p + "mlp.proj.weight"] for g in group], dim=1)
            out[hp + "input_layernorm.weight"] = same([g[p + "input_layernorm.weight"] for g in group])
            out[hp + "post_attention_layernorm.weight"] = same(
                [g[p + "post_layernorm.weight"] for g in group]
            )
        first, last = s == 0, s == pp - 1
        assert all(("transformer.vocab_embedding.weight" in g) == first for g in group)
        assert all(
            ("lm_head.weight" in g) == last and ("transformer.ln_f.weight" in g) == last for g in group
        )
        if first:
            out["model.embed_tokens.weight"] = same([g["transformer.vocab_embedding.weight"] for g in group])
        if last:
            out["model.norm.weight"] = same([g["transformer.ln_f.weight"] for g in group])
            out["lm_head.weight"] = _vocab(group, "lm_head.weight", V, tp)
            for h in range(cfg.get("num_medusa_heads", 0)):
                for j in range(cfg["num_medusa_layers"]):
                    for kind in ("weight", "bias"):
                        heads[f"{h}.{j}.linear.{kind}"] = torch.cat(
                            [g[f"medusa_heads.{h}.medusa_layers.{j}.linear.{kind}"] for g in group]
                        )
                heads[f"{h}.{cfg['num_medusa_layers']}.weight"] = _vocab(
                    group, f"medusa_heads.{h}.lm_head.weight", V, tp
                )
    names_written = sum(len(r) for r in ranks)
    return out, heads, names_written


def _vocab(group, name: str, V: int, tp: int) -> torch.Tensor:
    full = torch.cat([g[name] for g in group])  # [ceil(V/tp)*tp, H]
    assert full.shape[0] == -(-V // tp) * tp
    assert torch.count_nonzero(full[V:]) == 0  # padding rows are zeros
    return full[:V]


def expected_count(cfg: dict, tp: int, pp: int, bias: bool, medusa: tuple[int, int] | None = None) -> int:
    per_layer = 7 + (1 if bias else 0)
    heads = medusa[0] * (2 * medusa[1] + 1) if medusa else 0  # on every rank
    return tp * (cfg["num_hidden_layers"] * per_layer + 1 + 2) + tp * pp * heads


CASES = [
    # (fixture or make_tiny kwargs, tp, pp)
    ("gqa", 1, 1),
    ("gqa", 2, 1),
    ("gqa", 4, 1),
    ("gqa", 2, 2),
    ("gqa", 1, 2),
    ("mha_tied", 2, 1),
    ("mha_tied", 4, 2),
    ("qwen2", 2, 2),
    ("qwen2", 4, 1),
    ("mqa_oddvocab", 4, 2),
    ("mqa_oddvocab", 2, 2),
    ("mistral", 2, 1),
]


@pytest.fixture(scope="module")
def models(make_tiny, tiny_target, tiny_tied, tiny_qwen2):
    return {
        "gqa": tiny_target,  # 4 heads / 2 KV heads: tp 4 repeats KV heads
        "mha_tied": tiny_tied,  # 4 / 4, tied embeddings
        "qwen2": tiny_qwen2,  # qkv bias
        # 1 KV head (MQA), 3 layers (uneven PP split), vocab 390 (not a multiple of 4: padded lm_head)
        "mqa_oddvocab": make_tiny(
            "mqa_oddvocab", num_layers=3, num_heads=4, num_kv_heads=1, vocab_size=390, seed=7
        ),
        "mistral": make_tiny(
            "mistral", family="mistral", num_layers=1, num_heads=4, num_kv_heads=2, head_dim=32, seed=10
        ),  # explicit head_dim: nh*hd != H
    }


@pytest.mark.parametrize(("model", "tp", "pp"), CASES, ids=[f"{m}-tp{t}-pp{p}" for m, t, p in CASES])
def test_unshard_gives_back_every_hf_tensor(models, tmp_path, model, tp, pp):
    src = models[model]
    out = convert_checkpoint(src, tmp_path / "ckpt", tp_size=tp, pp_size=pp)
    hf = hf_tensors(src)
    back, _, written = unshard(out)
    cfg = json.loads((out / "config.json").read_text())
    tied = cfg["tie_word_embeddings"]
    if tied:
        assert "lm_head.weight" not in hf
        assert torch.equal(back.pop("lm_head.weight"), hf["model.embed_tokens.weight"])
    assert set(back) == set(hf)
    for name, t in hf.items():
        assert back[name].dtype == t.dtype and torch.equal(back[name], t), name
    assert written == expected_count(cfg, tp, pp, cfg["attn_bias"])  # nothing extra in the rank files
    assert cfg["architecture"] == json.loads((src / "config.json").read_text())["architectures"][0]
    assert verify_manifest(out) == []  # the sha256 taken while writing matches the files
    assert read_manifest(out, kind="trtllm_checkpoint")["options"]["tp_size"] == tp


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_cast_round_trip(models, tmp_path, dtype):
    """Casting goes through the assembled-tensor path (scratch buffers) for every split kind."""
    src = models["mqa_oddvocab"]
    threads = torch.get_num_threads()
    out = convert_checkpoint(src, tmp_path / "ckpt", tp_size=4, pp_size=2, dtype=dtype)
    assert torch.get_num_threads() == threads  # one torch thread while converting, then as it was
    back, _, _ = unshard(out)
    for name, t in hf_tensors(src).items():
        assert torch.equal(back[name], t.to(getattr(torch, dtype))), name
    assert verify_manifest(out) == []


def test_medusa_heads_round_trip(tiny_target, tmp_path):
    cfg = json.loads((tiny_target / "config.json").read_text())
    heads_dir = make_heads(
        tmp_path / "heads", hidden=cfg["hidden_size"], vocab=cfg["vocab_size"], heads=3, layers=2
    )
    out = convert_checkpoint(
        tiny_target,
        tmp_path / "ckpt",
        tp_size=2,
        pp_size=2,
        medusa=MedusaHeadsSource(heads_dir, max_draft_len=10),
    )
    c = json.loads((out / "config.json").read_text())
    assert (
        c["architecture"],
        c["num_medusa_heads"],
        c["num_medusa_layers"],
        c["max_draft_len"],
        c["model_type"],
    ) == ("MedusaForCausalLM", 3, 2, 10, "llama")
    back, heads, written = unshard(out)
    src = load_file(heads_dir / "medusa_lm_head.safetensors")
    assert set(heads) == set(src)
    for name, t in src.items():
        assert torch.equal(heads[name], t), name
    assert written == expected_count(c, 2, 2, False, medusa=(3, 2))
    # MedusaForCausalLm builds the heads on every PP stage and its loader requires them there too:
    # every rank file holds its TP slice of every head, the same on both stages.
    for tp_rank in range(2):
        first, last = (
            load_file(out / f"rank{tp_rank}.safetensors"),
            load_file(out / f"rank{2 + tp_rank}.safetensors"),
        )
        heads_first = {k: v for k, v in first.items() if k.startswith("medusa_heads.")}
        assert len(heads_first) == 3 * (2 * 2 + 1)
        assert all(torch.equal(v, last[k]) for k, v in heads_first.items())


def test_medusa_pt_heads_padded_vocab(make_tiny, tmp_path):
    model = make_tiny("mqa_oddvocab", num_layers=3, num_heads=4, num_kv_heads=1, vocab_size=390, seed=7)
    cfg = json.loads((model / "config.json").read_text())
    heads_dir = make_heads(
        tmp_path / "heads", hidden=cfg["hidden_size"], vocab=390, heads=2, layers=1, config={}, fmt="pt"
    )
    out = convert_checkpoint(
        model, tmp_path / "ckpt", tp_size=4, medusa=MedusaHeadsSource(heads_dir, num_heads=2, num_layers=1)
    )
    _, heads, _ = unshard(out)
    src = torch.load(heads_dir / "medusa_lm_head.pt", weights_only=True)
    for name, t in src.items():
        assert torch.equal(heads[name], t), name
    assert load_file(out / "rank3.safetensors")["medusa_heads.0.lm_head.weight"].shape == (
        98,
        64,
    )  # ceil(390/4)


def test_config_json_keys(tiny_qwen2, tiny_target, tmp_path):
    c = json.loads(
        (
            convert_checkpoint(tiny_qwen2, tmp_path / "q", tp_size=2, dtype="bfloat16", weight_only="int8")
            / "config.json"
        ).read_text()
    )
    assert c["architecture"] == "Qwen2ForCausalLM" and c["qwen_type"] == "qwen2" and c["attn_bias"] is True
    assert (
        c["dtype"] == "bfloat16"
        and c["quantization"]["quant_algo"] == "W8A16"
        and c["quantization"]["kv_cache_quant_algo"] is None
    )
    assert c["hidden_act"] == "silu" and c["position_embedding_type"] == "rope_gpt_neox"
    assert c["mapping"]["world_size"] == 2 and c["mapping"]["tp_size"] == 2 and c["mapping"]["pp_size"] == 1
    assert c["vocab_size"] == json.loads((tiny_qwen2 / "config.json").read_text())["vocab_size"]
    assert load_file(tmp_path / "q" / "rank0.safetensors")["lm_head.weight"].dtype == torch.bfloat16
    c = json.loads(
        (
            convert_checkpoint(tiny_target, tmp_path / "l", weight_only="int4", dtype="float16")
            / "config.json"
        ).read_text()
    )
    assert c["quantization"]["quant_algo"] == "W4A16" and c["norm_epsilon"] == 1e-6 and c["head_size"] == 16
    assert (
        c["quantization"]["group_size"] == 128 and c["rotary_base"] == 10000.0 and c["rotary_scaling"] is None
    )


def test_rope_scaling_both_config_styles(make_tiny, tmp_path):
    model = make_tiny(
        "rope_linear", num_layers=1, rope_scaling={"rope_type": "linear", "factor": 2.0}, seed=8
    )
    c = json.loads((convert_checkpoint(model, tmp_path / "v5") / "config.json").read_text())
    assert c["rotary_scaling"]["type"] == "linear" and c["rotary_scaling"]["factor"] == 2.0
    # transformers-4 style: rope_theta + rope_scaling {"type"} + torch_dtype
    old = tmp_path / "v4"
    old.mkdir()
    raw = json.loads((model / "config.json").read_text())
    raw.pop("rope_parameters", None)
    raw.pop("dtype", None)
    raw.update(rope_theta=5e5, rope_scaling={"type": "linear", "factor": 4.0}, torch_dtype="float32")
    (old / "config.json").write_text(json.dumps(raw))
    (old / "model.safetensors").symlink_to(model / "model.safetensors")
    c = json.loads((convert_checkpoint(old, tmp_path / "v4out") / "config.json").read_text())
    assert (
        c["rotary_base"] == 5e5
        and c["rotary_scaling"]["type"] == "linear"
        and c["rotary_scaling"]["factor"] == 4.0
    )
    assert c["dtype"] == "float32"


def test_sharded_checkpoint_with_index(tiny_target, tmp_path):
    hf = hf_tensors(tiny_target)
    names = sorted(hf)
    shard = tmp_path / "sharded"
    shard.mkdir()
    half = len(names) // 2
    weight_map = {}
    for k, part in enumerate((names[:half], names[half:])):
        fname = f"model-0000{k + 1}-of-00002.safetensors"
        save_file({n: hf[n] for n in part}, shard / fname)
        weight_map.update(dict.fromkeys(part, fname))
    (shard / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
    (shard / "config.json").write_text((tiny_target / "config.json").read_text())
    back, _, _ = unshard(convert_checkpoint(shard, tmp_path / "ckpt", tp_size=2))
    assert all(torch.equal(back[n], hf[n]) for n in names)
