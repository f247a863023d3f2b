"""Triton Python model for the IPC floor (lab/benchmarks/ipc_floor.py): a no-op engine.

Served with the config.pbtxt of the repository's real `tensorrt_llm_draft` / `tensorrt_llm` model
(same input and output table, batching, instance count), it reads a request's inputs as the local
engine model does and answers `request_output_len` zero tokens at once: what is left of a call is
Triton's Python backend (server -> stub -> server) and nothing of specbuild.
"""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        pass

    def execute(self, requests):
        responses = []
        for request in requests:
            for tensor in request.inputs():  # every input read into numpy, as a real model reads them
                tensor.as_numpy()
            n = int(
                pb_utils.get_input_tensor_by_name(request, "request_output_len").as_numpy().reshape(-1)[0]
            )
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("output_ids", np.zeros((1, 1, n), dtype=np.int32)),
                        pb_utils.Tensor("sequence_length", np.array([[n]], dtype=np.int32)),
                    ]
                )
            )
        return responses
