"""Triton Python model `tensorrt_llm_bls` (decoupled): text in, text out, draft/target speculation.

* num_draft_tokens > 0 (or the repository's default when the request omits it) and a drafter
  configured (`bls_drafter`, named by the repository's method): the shared speculative loop
  (specbuild.engines.reference.speculative) runs with that Drafter (draft/target: calls to
  `tensorrt_llm_draft`) and a Verifier calling `tensorrt_llm` with draft_input_ids (+ draft_logits
  when use_draft_logits). acceptance_rate / total_accepted_draft_tokens / total_draft_tokens cover the
  whole request. With stream=true each round's accepted tokens are sent as they are accepted.
* otherwise the request goes to `tensorrt_llm` alone (streamed when that model is decoupled: Medusa).

Responses: text_output chunks are deltas (concatenate them), output_ids / sequence_length the token
ids of each response (prompt excluded); the last response carries the COMPLETE_FINAL flag, the
remaining text and, with return_perf_metrics, the perf outputs.
Production repositories ship the needed specbuild modules in ./vendor (no specbuild in the container).
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
import triton_python_backend_utils as pb_utils

_HERE = os.path.dirname(os.path.abspath(__file__))
for _path in (os.path.join(_HERE, "vendor"), _HERE):
    if os.path.isdir(_path) and _path not in sys.path:
        sys.path.insert(0, _path)

import bls_core  # noqa: E402
from bls_core import (  # noqa: E402
    PERF_OUTPUTS,
    BlsOptions,
    TextStream,
    detokenize,
    engine_inputs,
    new_tokens,
    perf_outputs,
    preprocess,
    speculate,
)

_NUMPY_LOGITS = {"TYPE_FP32": "float32", "TYPE_FP16": "float16", "TYPE_BF16": "float32"}  # no numpy bf16


def _token_outputs(tokens: list[int]) -> dict:
    """The response's token ids (specbuild addition): output_ids [1, 1, n], sequence_length [1, 1]."""
    return {
        "output_ids": np.array(tokens, dtype=np.int32).reshape(1, 1, -1),
        "sequence_length": np.array([[len(tokens)]], dtype=np.int32),
    }


def _param(config: dict, key: str, default: str = "") -> str:
    value = config.get("parameters", {}).get(key, {}).get("string_value", "")
    return default if value == "" or value.startswith("${") else value


def _flag(value: str) -> bool:
    return value.strip().lower() in ("true", "1", "yes")


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.target = _param(config, "tensorrt_llm_model_name", "tensorrt_llm")
        self.draft = _param(config, "tensorrt_llm_draft_model_name") or None
        # the repository's method names its BLS drafter ("bls_core:TritonDrafter"; empty: the target
        # speculates)
        drafter = _param(config, "bls_drafter")
        self.drafter_class = getattr(bls_core, drafter.partition(":")[2]) if drafter else None
        self.target_decoupled = _flag(_param(config, "tensorrt_llm_decoupled", "false"))
        self.default_k = int(_param(config, "default_num_draft_tokens", "0"))
        self.default_use_logits = _flag(_param(config, "default_use_draft_logits", "false"))
        inputs = {t["name"] for t in config["input"]}
        self.seed_name = "seed" if "seed" in inputs else "random_seed"
        self.min_tokens_name = "min_tokens" if "min_tokens" in inputs else "min_length"
        outputs = {t["name"]: t["data_type"] for t in config["output"]}
        self.logits_dtype = _NUMPY_LOGITS.get(outputs.get("generation_logits", "TYPE_FP32"), "float32")
        if self.drafter_class is not None:  # torch (draft logits) now, not in the first request
            import specbuild.engines.reference.sampling  # noqa: F401

    # ---- Triton plumbing ------------------------------------------------------------------------
    def _call(self, model: str, inputs: dict, output_names: list[str]) -> dict:
        """One non-streaming BLS call; numpy in, numpy out."""
        request = pb_utils.InferenceRequest(
            model_name=model,
            requested_output_names=output_names,
            inputs=[pb_utils.Tensor(name, value) for name, value in inputs.items()],
        )
        response = request.exec()
        return self._outputs(model, response, output_names)

    def _stream(self, model: str, inputs: dict, output_names: list[str]):
        """A call to a decoupled model: yields each data response's outputs."""
        request = pb_utils.InferenceRequest(
            model_name=model,
            requested_output_names=output_names,
            inputs=[pb_utils.Tensor(name, value) for name, value in inputs.items()],
        )
        for response in request.exec(decoupled=True):
            outputs = self._outputs(model, response, output_names)
            if outputs.get("output_ids") is not None:  # the final response may carry flags only
                yield outputs

    @staticmethod
    def _outputs(model: str, response, output_names: list[str]) -> dict:
        if response.has_error():
            raise RuntimeError(f"{model}: {response.error().message()}")
        out = {}
        for name in output_names:
            tensor = pb_utils.get_output_tensor_by_name(response, name)
            if tensor is not None:
                out[name] = tensor.as_numpy()
        return out

    @staticmethod
    def _response(outputs: dict):
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(k, v) for k, v in outputs.items()])

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                self._handle(request, sender)
            except Exception as exc:  # every failure becomes the request's error response
                sender.send(
                    pb_utils.InferenceResponse(error=pb_utils.TritonError(f"tensorrt_llm_bls: {exc}")),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
        return None

    # ---- one request ----------------------------------------------------------------------------
    def _handle(self, request, sender) -> None:
        arrival = time.time_ns()

        def get(name):
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            return None if tensor is None else tensor.as_numpy()

        opts = BlsOptions.from_inputs(
            get,
            default_num_draft_tokens=self.default_k,
            default_use_draft_logits=self.default_use_logits,
            seed_name=self.seed_name,
            min_tokens_name=self.min_tokens_name,
        )
        prep = preprocess(self._call, opts)
        text = TextStream(lambda tokens: detokenize(self._call, tokens))
        times = {"first": None, "last": None}

        def on_tokens(tokens):
            times["first"] = times["first"] or time.time_ns()
            times["last"] = time.time_ns()
            if opts.stream:
                delta = text.push(tokens)
                sender.send(
                    self._response(
                        {"text_output": np.array([[delta.encode()]], dtype=object), **_token_outputs(tokens)}
                    )
                )

        if opts.num_draft_tokens > 0 and self.drafter_class is not None:
            tokens, stats, shared = speculate(
                self._call,
                opts,
                prep,
                drafter_class=self.drafter_class,
                draft_model=self.draft,
                target_model=self.target,
                seed_name=self.seed_name,
                logits_dtype=self.logits_dtype,
                on_tokens=on_tokens,
            )
            perf = perf_outputs(
                stats=stats,
                arrival_ns=arrival,
                first_scheduled_ns=shared.first_call_ns,
                first_token_ns=times["first"],
                last_token_ns=times["last"],
                kv=shared.last_perf,
            )
        else:
            tokens, perf = self._plain(opts, prep, on_tokens)
        if opts.stream:
            final_text = text.flush()
        elif not opts.exclude_input_in_output:
            final_text = detokenize(self._call, prep.prompt_ids + tokens)
        else:
            final_text = detokenize(self._call, tokens)
        outputs = {
            "text_output": np.array([[final_text.encode()]], dtype=object),
            **_token_outputs([] if opts.stream else tokens),
        }
        if opts.return_perf_metrics:
            outputs.update(perf)
        sender.send(self._response(outputs), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _plain(self, opts: BlsOptions, prep, on_tokens):
        """No speculation in the BLS: tensorrt_llm alone (Medusa speculates inside it)."""
        stream = opts.stream and self.target_decoupled
        inputs = engine_inputs(
            prep.prompt_ids, opts.max_tokens, opts, prep, seed_name=self.seed_name, seed=opts.seed
        )
        inputs["streaming"] = np.array([[stream]])
        inputs["return_perf_metrics"] = np.array([[True]])
        wanted = ["output_ids", "sequence_length", *PERF_OUTPUTS]
        responses = (
            self._stream(self.target, inputs, wanted)
            if self.target_decoupled
            else [self._call(self.target, inputs, wanted)]
        )
        tokens, perf = [], {}
        for out in responses:
            new = new_tokens(out)
            tokens += new
            if new:
                on_tokens(new)
            perf.update({name: out[name] for name in PERF_OUTPUTS if name in out})
        return tokens, perf
