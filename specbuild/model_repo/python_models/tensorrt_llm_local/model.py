"""Triton Python model standing in for the C++ `tensorrt_llm` backend: runs specbuild's reference engine.

Same tensor interface as the C++ backend (config.pbtxt from specbuild.model_repo.tensors), so the
ensemble, pre/postprocessing and BLS are identical in local and production repositories. Loads
`gpt_model_path` (a reference engine folder) with ReferenceEngine; `medusa_choices` (backend form)
selects the Medusa tree. What each input does: local_core.py.

* decoupled (Medusa repositories): each generated chunk is sent as it is produced when `streaming`
  is true; the last response carries COMPLETE_FINAL (and the perf outputs);
* draft_input_ids: external verification through the engine's prefix cache, so the BLS's growing
  prefix is not recomputed each round (enable_kv_cache_reuse);
* several requests in flight: Triton's dynamic batcher hands them over together; plain requests of
  one batch decode together (ReferenceEngine.generate_batch: lockstep, rows of their own length;
  Medusa one after another), verification and logits requests one by one.
"""

from __future__ import annotations

import json
import os
import sys

import triton_python_backend_utils as pb_utils

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from local_core import Job, Perf, cut, parse_request, token_outputs  # noqa: E402
from words import find_stop, stop_at_words  # noqa: E402

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
        self.tokens_per_block = int(
            (build.get("plugin_config") or {}).get("tokens_per_block") or DEFAULT_TOKENS_PER_BLOCK
        )
        self._warm_up()

    def _warm_up(self) -> None:
        """One tiny generation and verification at load: the first request must not pay for torch's
        lazy initialisation (seconds on a busy CPU, which would distort TTFT measurements)."""
        from specbuild.core.sampling_params import SamplingParams

        params = SamplingParams(max_tokens=2, end_id=-1)
        self.engine.generate([0], params, speculative=True)
        if not self.engine.speculates:  # an engine the BLS drives verifies drafts
            self.engine.verify_external([0], [0], None, params=params)

    def execute(self, requests):
        jobs = []  # [sender, request state or None, response or None]
        for request in requests:
            sender = request.get_response_sender() if self.decoupled else None
            try:
                jobs.append([sender, self._parse(request, sender), None])
            except Exception as exc:  # the request's error response, as the backend reports bad requests
                jobs.append([sender, None, self._error(exc)])
        plain = [
            job
            for job in jobs
            if job[1] is not None
            and job[1].req.draft_ids is None
            and not job[1].req.generation_logits
            and not job[1].req.stop_sequences
        ]
        if (
            len(plain) > 1
        ):  # several requests in flight: one batched decode (lockstep, rows of their own length)
            self._run_batch([job[1] for job in plain])
        for job in jobs:
            if job[2] is None:
                try:
                    state = job[1]
                    job[2] = self._finish(state if state.ran else self._run(state))
                except Exception as exc:
                    job[2] = self._error(exc)
        if self.decoupled:
            for sender, _, response in jobs:
                sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
        return [response for _, _, response in jobs]

    @staticmethod
    def _error(exc: Exception):
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(f"tensorrt_llm (local): {exc}"))

    def _parse(self, request, sender) -> Job:
        def get(name):
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            return None if tensor is None else tensor.as_numpy()

        req = parse_request(
            get,
            seed_name=self.seed_name,
            min_tokens_name=self.min_tokens_name,
            exclude_default=self.exclude_default,
            default_end_id=None,
        )
        if req.streaming and sender is None:
            raise ValueError("Streaming is only supported if model is deployed using decoupled mode.")
        return Job(
            req=req,
            sender=sender,
            perf=Perf(arrival_ns=req.arrival_ns),
            reused_before=self.engine.prefix_cache.reused_tokens,
        )

    def _on_tokens(self, job: Job, new: list[int]) -> None:
        job.perf.token()
        if job.req.streaming and new:
            chunk = token_outputs(new, job.req, with_prompt=False)
            job.sender.send(
                pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(k, v) for k, v in chunk.items()])
            )

    def _run_batch(self, jobs: list[Job]) -> None:
        results = self.engine.generate_batch(
            [j.req.prompt_ids for j in jobs],
            [j.req.params for j in jobs],
            speculative=True,
            on_tokens=lambda i, new: self._on_tokens(jobs[i], new),
        )
        for job, result in zip(jobs, results, strict=True):
            job.tokens, job.ran = result.token_ids, True
            job.perf.accepted, job.perf.drafted = result.stats.accepted, result.stats.drafted

    def _run(self, job: Job) -> Job:
        req, perf = job.req, job.perf
        if req.draft_ids is not None:
            perf.token()
            tokens = cut(
                self.engine.verify_external(
                    req.prompt_ids, req.draft_ids, req.draft_logits, params=req.params
                ),
                req.params,
                req.max_new,
            )
            end = find_stop(tokens, req.stop_sequences) if req.stop_sequences else None
            job.tokens = tokens[:end] if end is not None else tokens
            perf.token()
            perf.drafted = len(req.draft_ids)
            perf.accepted = max(0, len(job.tokens) - 1)
            return job
        stop = stop_at_words(req.stop_sequences)  # a multi-token stop word ends the generation after it
        if req.generation_logits:
            result, logits = self.engine.generate_with_logits(
                req.prompt_ids, req.params, on_tokens=lambda new: self._on_tokens(job, new), stop=stop
            )
            job.extra["generation_logits"] = logits.float().numpy()[None, None]  # [1, 1, n, V]
        else:
            result = self.engine.generate(
                req.prompt_ids,
                req.params,
                speculative=True,
                on_tokens=lambda new: self._on_tokens(job, new),
                stop=stop,
            )
        job.tokens = result.token_ids
        perf.accepted, perf.drafted = result.stats.accepted, result.stats.drafted
        return job

    def _finish(self, job: Job):
        req, perf = job.req, job.perf
        reused = self.engine.prefix_cache.reused_tokens - job.reused_before
        perf.reused_blocks = reused // self.tokens_per_block
        total = len(req.prompt_ids) + len(job.tokens)
        perf.new_blocks = max(0, -(-total // self.tokens_per_block) - perf.reused_blocks)
        if req.streaming:  # the chunks went out already; the final response carries no new tokens
            outputs = token_outputs([], req, with_prompt=False)
        else:
            outputs = token_outputs(job.tokens, req, with_prompt=not req.exclude_input)
        outputs.update(job.extra)
        if req.perf:
            outputs.update(perf.outputs())
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(k, v) for k, v in outputs.items()])
