"""Triton Python model for the IPC floor (lab/benchmarks/ipc_floor.py): the reference engine inside a stub.

It loads the build named by its `reference_engine` parameter and, per request (reps R, prompt_len L,
draft_len k, max_tokens T), times R times two pieces of engine work with nothing of Triton in between:
  plain       - engine.generate(L prompt tokens, k new tokens, no speculation) (a draft call's work);
  speculative - engine.generate(L prompt tokens, T new tokens, speculative, K = k) (the whole in-process
                speculative loop).
The same pieces timed in the benchmark's own process say whether work inside a Python-backend stub runs
slower than in-process (threads, allocator, the stub's own threads), apart from any IPC.
timings_ns: [2 * R] int64 (the pieces in that order, R each). The timed code is one function,
lab.benchmarks.floor_models_probe.time_engine_pieces, on both sides.
"""

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils

PIECES = ("plain", "speculative")


def _scalar(request, name):
    return int(pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)[0])


class TritonPythonModel:
    def initialize(self, args):
        import torch

        from specbuild.engines.reference.engine import ReferenceEngine

        torch.set_num_threads(int(os.environ.get("SPECBUILD_TORCH_THREADS", "1")))
        config = json.loads(args["model_config"])
        path = config["parameters"]["reference_engine"]["string_value"]
        self.engine = ReferenceEngine.load(path)

    def execute(self, requests):
        from lab.benchmarks.floor_models_probe import time_engine_pieces

        responses = []
        for request in requests:
            reps, length, k, tokens = (
                _scalar(request, name) for name in ("reps", "prompt_len", "draft_len", "max_tokens")
            )
            times = time_engine_pieces(
                self.engine, reps=reps, prompt_len=length, draft_len=k, max_tokens=tokens
            )
            flat = np.array([t for piece in PIECES for t in times[piece]], dtype=np.int64)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("timings_ns", flat)]))
        return responses
