"""Triton Python model `preprocessing`: text -> token ids, word lists -> the backend's word-list form.

specbuild's own implementation of the TensorRT-LLM template interface (tensors: specbuild.model_repo.
tensors.preprocessing_interface). The HF tokenizer is loaded with AutoTokenizer from `tokenizer_dir`,
never with trust_remote_code. Batch shapes: b = requests batched by Triton, L = longest prompt.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import triton_python_backend_utils as pb_utils

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from lifeline import start_in_stub  # noqa: E402
from words import flag, param  # noqa: E402


def word_list(words: list[str], encode) -> np.ndarray:
    """Words -> [2, n]: row 0 the concatenated token ids, row 1 the cumulative end offsets (padded with -1
    to the row length), as TensorRT-LLM's stop_words_list / bad_words_list expect."""
    ids: list[int] = []
    offsets: list[int] = []
    for word in words:
        tokens = encode(word)
        if not tokens:
            continue
        ids += tokens
        offsets.append(len(ids))
    out = np.zeros((2, len(ids)), dtype=np.int32)  # [2, n]
    out[0, :] = ids
    out[1, :] = -1
    out[1, : len(offsets)] = offsets
    return out


def batch_word_lists(per_item: list[np.ndarray]) -> np.ndarray:
    """Pad [2, n_i] lists to [b, 2, max n]: ids with 0, offsets with -1."""
    width = max((w.shape[1] for w in per_item), default=0)
    out = np.zeros((len(per_item), 2, width), dtype=np.int32)  # [b, 2, n]
    out[:, 1, :] = -1
    for i, w in enumerate(per_item):
        out[i, :, : w.shape[1]] = w
    return out


MULTIMODAL_INPUTS = ("IMAGE_BYTES", "IMAGE_URL", "IMAGES", "VIDEO_BYTES")


def _text(value, name: str) -> str:
    """A BYTES element as text; invalid UTF-8 is the request's error, not a traceback."""
    if not isinstance(value, bytes):
        return str(value)
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"{name} is not valid UTF-8 (byte {exc.start}: {value[exc.start : exc.start + 4]!r})"
        ) from None


def _strings(tensor, name: str = "words") -> list[list[str]]:
    """[b, n] BYTES -> per batch item, its decoded non-empty strings."""
    rows = tensor.as_numpy()
    return [[_text(s, name) for s in row.reshape(-1) if s not in (b"", "")] for row in rows]


class TritonPythonModel:
    def initialize(self, args):
        start_in_stub(args["model_name"])  # ends this process if tritonserver dies (lifeline.py)
        from transformers import AutoTokenizer

        config = json.loads(args["model_config"])
        tokenizer_dir = param(config, "tokenizer_dir")
        self.add_special_tokens = flag(param(config, "add_special_tokens", "true"))
        self.tokenizer = AutoTokenizer.from_pretrained(
            tokenizer_dir, legacy=False, padding_side="left", trust_remote_code=False
        )
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.end_id = int(self.tokenizer.eos_token_id)
        self.pad_id = int(self.tokenizer.pad_token_id)
        self.vocab_size = len(self.tokenizer)

    def _encode_words(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                responses.append(self._one(request))
            except ValueError as exc:  # a bad request: its error response, the others go on
                responses.append(
                    pb_utils.InferenceResponse(error=pb_utils.TritonError(f"preprocessing: {exc}"))
                )
        return responses

    def _one(self, request):
        get = lambda name: pb_utils.get_input_tensor_by_name(request, name)  # noqa: E731
        for name in MULTIMODAL_INPUTS:
            t = get(name)
            if t is not None and t.as_numpy().size:
                raise ValueError(
                    f"{name} is given, but this repository serves a text-only model (no multimodal encoder)"
                )
        queries = [_text(q, "QUERY") for q in get("QUERY").as_numpy().reshape(-1)]
        b = len(queries)
        encoded = [self.tokenizer.encode(q, add_special_tokens=self.add_special_tokens) for q in queries]
        lengths = np.array([[len(e)] for e in encoded], dtype=np.int32)  # [b, 1]
        end_t, pad_t = get("END_ID"), get("PAD_ID")
        end_id = int(end_t.as_numpy().reshape(-1)[0]) if end_t is not None else self.end_id
        pad_id = int(pad_t.as_numpy().reshape(-1)[0]) if pad_t is not None else self.pad_id
        width = int(lengths.max()) if b else 0
        input_ids = np.full((b, width), end_id, dtype=np.int32)  # [b, L] right-padded; lengths say where
        for i, e in enumerate(encoded):
            input_ids[i, : len(e)] = e
        outputs = [
            pb_utils.Tensor("INPUT_ID", input_ids),
            pb_utils.Tensor("REQUEST_INPUT_LEN", lengths),
            # Decoder-only engines ignore the decoder inputs; one pad token keeps their shape valid.
            pb_utils.Tensor("DECODER_INPUT_ID", np.full((b, 1), pad_id, dtype=np.int32)),
            pb_utils.Tensor("REQUEST_DECODER_INPUT_LEN", np.ones((b, 1), dtype=np.int32)),
            pb_utils.Tensor("REQUEST_OUTPUT_LEN", get("REQUEST_OUTPUT_LEN").as_numpy().astype(np.int32)),
            pb_utils.Tensor("OUT_END_ID", np.full((b, 1), end_id, dtype=np.int32)),
            pb_utils.Tensor("OUT_PAD_ID", np.full((b, 1), pad_id, dtype=np.int32)),
        ]
        for src, dst in (("BAD_WORDS_DICT", "BAD_WORDS_IDS"), ("STOP_WORDS_DICT", "STOP_WORDS_IDS")):
            t = get(src)
            words = _strings(t, src) if t is not None else [[] for _ in range(b)]
            outputs.append(
                pb_utils.Tensor(dst, batch_word_lists([word_list(w, self._encode_words) for w in words]))
            )
        outputs.append(pb_utils.Tensor("EMBEDDING_BIAS", self._embedding_bias(get, b)))
        extra = get("PROMPT_TABLE_EXTRA_ID")
        if extra is not None:
            ids = extra.as_numpy().astype(np.uint64).reshape(b, 1)  # one extra id per prompt token
            outputs.append(pb_utils.Tensor("OUT_PROMPT_TABLE_EXTRA_IDS", np.repeat(ids, width, axis=1)))
        return pb_utils.InferenceResponse(output_tensors=outputs)

    def _embedding_bias(self, get, b: int) -> np.ndarray:
        words_t, weights_t = get("EMBEDDING_BIAS_WORDS"), get("EMBEDDING_BIAS_WEIGHTS")
        if words_t is None or weights_t is None:
            return np.empty((b, 0), dtype=np.float32)  # empty = no bias (the backend skips it)
        bias = np.zeros((b, self.vocab_size), dtype=np.float32)  # [b, V]
        weights = weights_t.as_numpy().reshape(b, -1)
        for i, words in enumerate(_strings(words_t, "EMBEDDING_BIAS_WORDS")):
            for word, weight in zip(words, weights[i], strict=False):
                for token in self._encode_words(word):
                    bias[i, token] += float(weight)
        return bias
