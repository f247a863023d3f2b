"""Triton Python model standing in for the C++ `tensorrt_llm` backend: runs specbuild's reference engine.

Same tensor interface as the C++ backend (config.pbtxt from specbuild.model_repo.tensors), so the
ensemble, pre/postprocessing and BLS are identical in local and production repositories. Loads
`gpt_model_path` (a reference engine folder) with ReferenceEngine; `medusa_choices` (backend form)
selects the Medusa tree. What each input does: local_core.py.

* decoupled (Medusa repositories): each generated chunk is sent as it is produced when `streaming`
  is true; the last response carries COMPLETE_FINAL (and the perf outputs);
* draft_input_ids: external verification through the engine's prefix cache, so the BLS's growing
  prefix is not recomputed each round (enable_kv_cache_reuse);
* several requests may be in flight (Triton's dynamic batcher hands them over together); the engine
  serves them one after another under its lock.
"""

from __future__ import annotations

import json
import os
import sys

import triton_python_backend_utils as pb_utils

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from local_core import Perf, cut, parse_request, token_outputs  # noqa: E402

DEFAULT_TORCH_THREADS = "1"  # per engine model process; SPECBUILD_TORCH_THREADS overrides
DEFAULT_TOKENS_PER_BLOCK = 32  # KV block size the perf counters are reported in (TRT-LLM's default)


def _param(config: dict, key: str, default: str = "") -> str:
    value = config.get("parameters", {}).get(key, {}).get("string_value", "")
    return default if value == "" or value.startswith("${") else value


class TritonPythonModel:
    def initialize(self, args):
        import torch

        from specbuild.engines.reference.engine import ReferenceEngine

        # Several stub processes (draft, target, BLS, pre/post) share the CPU: torch's default of one
        # thread per core in each of them oversubscribes it (measured 50x slower on 2 loaded cores).
        torch.set_num_threads(int(os.environ.get("SPECBUILD_TORCH_THREADS", DEFAULT_TORCH_THREADS)))

        config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        path = _param(config, "gpt_model_path")
        choices = _param(config, "medusa_choices") or None
        self.engine = ReferenceEngine.load(path, medusa_choices=choices)
        self.exclude_default = _param(config, "exclude_input_in_output", "false").lower() == "true"
        names = {t["name"] for t in config["input"]}
        self.seed_name = "seed" if "seed" in names else "random_seed"
        self.min_tokens_name = "min_tokens" if "min_tokens" in names else "min_length"
        build = json.loads(open(os.path.join(path, "config.json")).read()).get("build_config", {})
        self.tokens_per_block = int((build.get("plugin_config") or {}).get("tokens_per_block") or DEFAULT_TOKENS_PER_BLOCK)
        self._warm_up()

    def _warm_up(self) -> None:
        """One tiny generation and verification at load: the first request must not pay for torch's
        lazy initialisation (seconds on a busy CPU, which would distort TTFT measurements)."""
        from specbuild.sampling_params import SamplingParams

        params = SamplingParams(max_tokens=2, end_id=-1)
        self.engine.generate([0], params, speculative=True)
        if self.engine.mode != "medusa":
            self.engine.verify_external([0], [0], None, params=params)

    def execute(self, requests):
        responses = []
        for request in requests:
            sender = request.get_response_sender() if self.decoupled else None
            try:
                outputs = self._serve(request, sender)
                response = pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(k, v) for k, v in outputs.items()])
            except Exception as exc:  # the request's error response, as the backend reports bad requests
                response = pb_utils.InferenceResponse(error=pb_utils.TritonError(f"tensorrt_llm (local): {exc}"))
            if sender is not None:
                sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                responses.append(response)
        return None if self.decoupled else responses

    def _serve(self, request, sender) -> dict:
        def get(name):
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            return None if tensor is None else tensor.as_numpy()

        req = parse_request(get, seed_name=self.seed_name, min_tokens_name=self.min_tokens_name,
                            exclude_default=self.exclude_default, default_end_id=None)
        if req.streaming and sender is None:
            raise ValueError("Streaming is only supported if model is deployed using decoupled mode.")
        perf = Perf(arrival_ns=req.arrival_ns)
        reused_before = self.engine.prefix_cache.reused_tokens
        extra = {}
        if req.draft_ids is not None:
            perf.token()
            tokens = self.engine.verify_external(req.prompt_ids, req.draft_ids, req.draft_logits, params=req.params)
            tokens = cut(tokens, req.params, req.max_new)
            perf.token()
            perf.drafted = len(req.draft_ids)
            perf.accepted = max(0, len(tokens) - 1)
        else:
            def on_tokens(new):
                perf.token()
                if req.streaming:
                    chunk = token_outputs(new, req, with_prompt=False)
                    sender.send(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(k, v) for k, v in chunk.items()]))

            if req.generation_logits:
                result, logits = self.engine.generate_with_logits(req.prompt_ids, req.params, on_tokens=on_tokens)
                extra["generation_logits"] = logits.float().numpy()[None, None]  # [1, 1, n, V]
            else:
                result = self.engine.generate(req.prompt_ids, req.params, speculative=True, on_tokens=on_tokens)
            tokens = result.token_ids
            perf.accepted, perf.drafted = result.stats.accepted, result.stats.drafted
        reused = self.engine.prefix_cache.reused_tokens - reused_before
        perf.reused_blocks = reused // self.tokens_per_block
        total = len(req.prompt_ids) + len(tokens)
        perf.new_blocks = max(0, -(-total // self.tokens_per_block) - perf.reused_blocks)
        if req.streaming:  # the chunks went out already; the final response carries no new tokens
            outputs = token_outputs([], req, with_prompt=False)
        else:
            outputs = token_outputs(tokens, req, with_prompt=not req.exclude_input)
        outputs.update(extra)
        if req.perf:
            outputs.update(perf.outputs())
        return outputs
