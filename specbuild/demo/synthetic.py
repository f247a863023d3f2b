"""Small Llama-family checkpoints and tokenizers the project makes itself (no downloads).

Tests build random tiny models with these; the demo trains them (specbuild.demo.models). The
tokenizer is a byte-level BPE trained with `tokenizers` and saved as a transformers fast tokenizer,
so every model that shares it has the same vocabulary, merges and special-token ids.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

BOS, EOS, PAD = "<s>", "</s>", "<pad>"

_DEFAULT_CORPUS = [
    "The quick brown fox jumps over the lazy dog. ",
    "def add(a, b):\n    return a + b\n",
    "Speculative decoding drafts tokens with a small model and verifies them with a large one. ",
    "import os\nimport sys\nfor i in range(10):\n    print(i)\n",
    "Once upon a time there was a tiny language model that wanted to run fast. ",
]


def train_tokenizer(
    out_dir: str | Path, texts: Iterable[str] | None = None, *, vocab_size: int = 384
) -> Path:
    """Train a byte-level BPE on `texts` (deterministic) and save it as a transformers tokenizer."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS, EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = list(texts) if texts is not None else _DEFAULT_CORPUS * 20
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD)
    fast.save_pretrained(str(out))
    return out


def make_model(
    out_dir: str | Path,
    tokenizer_dir: str | Path,
    *,
    family: str = "llama",
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    head_dim: int | None = None,
    tie_word_embeddings: bool = False,
    vocab_size: int | None = None,
    rope_scaling: dict | None = None,
    max_position_embeddings: int = 512,
    seed: int = 0,
    dtype: str = "float32",
    init_std: float = 0.2,
):
    """Write a random Llama / Mistral / Qwen2 model (safetensors + config + tokenizer) and return it."""
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    classes = {
        "llama": (LlamaConfig, LlamaForCausalLM),
        "mistral": (MistralConfig, MistralForCausalLM),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    }
    config_cls, model_cls = classes[family]
    kwargs = dict(
        vocab_size=vocab_size or len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        initializer_range=init_std,
        rms_norm_eps=1e-6,
    )
    if head_dim is not None:
        kwargs["head_dim"] = head_dim
    if rope_scaling is not None:
        kwargs["rope_scaling"] = rope_scaling
    if family == "qwen2":
        kwargs["use_sliding_window"] = False
    config = config_cls(**kwargs)
    torch.manual_seed(seed)
    model = model_cls(config)
    with torch.no_grad():  # random norms/biases too, so a converter that drops one is caught
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
    model = model.to(getattr(torch, dtype))
    out = Path(out_dir)
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    return model
