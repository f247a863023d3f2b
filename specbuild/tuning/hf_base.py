"""The frozen HF base model Medusa heads are trained on (transformers, never trust_remote_code).

Shape legend: B batch, T tokens, D hidden size, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from specbuild.builder.resolve import resolve_model
from specbuild.core.errors import TrainingError
from specbuild.core.formats.hf_config import HFModelConfig
from specbuild.core.formats.weights import find_weights


@dataclass(frozen=True)
class BaseModel:
    folder: Path
    model: Any  # transformers *ForCausalLM, eval mode, requires_grad off
    tokenizer: Any
    device: torch.device
    stored_dtype: torch.dtype  # the checkpoint's dtype: heads are saved in it

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.hidden_size)

    @property
    def vocab_size(self) -> int:
        return int(self.lm_head_weight().shape[0])

    @property
    def hidden_act(self) -> str:
        return str(getattr(self.model.config, "hidden_act", "silu"))

    @property
    def eos_ids(self) -> tuple[int, ...]:
        eos = self.model.config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        if eos is None:
            return ()
        return tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)

    def lm_head_weight(self) -> torch.Tensor:
        """The output projection [V, D] (the input embedding when the model ties them)."""
        return self.model.get_output_embeddings().weight.detach()

    @torch.no_grad()
    def hidden(self, ids: torch.Tensor) -> torch.Tensor:
        """Last hidden state (after the final norm) as float32: [B, T] -> [B, T, D]."""
        return self.model.get_decoder()(input_ids=ids).last_hidden_state.float()

    @torch.no_grad()
    def logits(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids).logits.float()  # [B, T, V]


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise TrainingError(
            "--device cuda but no CUDA GPU is visible",
            expected="a GPU host with a CUDA build of torch",
            found=f"torch {torch.__version__}, cuda available: False",
            fix="use --device cpu (or auto)",
        )
    return dev


def load_base(ref: str | Path, *, device: str = "auto") -> BaseModel:
    """Load tokenizer + model; float32 on CPU, the checkpoint's dtype on GPU."""

    folder = resolve_model(ref, what="base model")
    hf = HFModelConfig.from_hf(folder)
    _refuse_pickle_only(folder)
    stored = getattr(torch, hf.dtype)
    dev = pick_device(device)
    run_dtype = stored if dev.type == "cuda" else torch.float32
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=run_dtype, trust_remote_code=False)
    except (OSError, ValueError) as exc:
        raise TrainingError(
            f"cannot load the base model {folder}",
            expected="a transformers causal LM folder (config, tokenizer, weights)",
            found=str(exc).splitlines()[0],
            fix="check the folder, or re-save it with transformers",
        ) from None
    model.eval().requires_grad_(False).to(dev)
    return BaseModel(folder=folder, model=model, tokenizer=tokenizer, device=dev, stored_dtype=stored)


def _refuse_pickle_only(folder: Path) -> None:
    """Weights only as pytorch_model*.bin (pickle): never loaded; safetensors are required."""
    weights = find_weights(folder)
    if not weights.safetensors:
        found = ", ".join(p.name for p in weights.torch_bins[:3]) or "no weight files"
        raise TrainingError(
            f"{folder} has no safetensors weights",
            expected="model*.safetensors (a pickle file can run code when loaded, so specbuild never "
            "unpickles model weights)",
            found=found,
            fix="convert the weights once where you trust them: model.save_pretrained(folder, "
            "safe_serialization=True)",
        )
