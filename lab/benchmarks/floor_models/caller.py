"""Triton Python model for the IPC floor (lab/benchmarks/ipc_floor.py): a BLS-style caller, decoupled.

One request (calls N, prompt_len L, draft_len k) times N repetitions of each piece of a speculative
BLS round, in Triton's Python backend only (no specbuild code, no engine):
  build   - the pb_utils.Tensor objects of a draft call's inputs (no call);
  draft   - a draft-style call (InferenceRequest.exec) to `floor_draft`: the inputs the BLS sends to
            tensorrt_llm_draft (input_ids [1, L], input_lengths, request_output_len k, end_id,
            pad_id, exclude_input_in_output, streaming, min_tokens), outputs output_ids and
            sequence_length;
  target  - a verify-style call to `floor_target`: the same without min_tokens, with
            draft_input_ids [1, k] and request_output_len k + 1;
  send    - one streamed response (text_output, output_ids [1, 1, k + 1], sequence_length);
  cancel  - one response_sender.is_cancelled() ask.
The final response's timings_ns is [5 * N] int64 (the pieces in that order, N each).
"""

import time

import numpy as np
import triton_python_backend_utils as pb_utils

PIECES = ("build", "draft", "target", "send", "cancel")


def _i32(value):
    return np.array([[value]], dtype=np.int32)


def _scalar(request, name):
    return int(pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)[0])


class TritonPythonModel:
    def initialize(self, args):
        pass

    def _inputs(self, ids, n, extra):
        arrays = {
            "input_ids": np.array([ids], dtype=np.int32),
            "input_lengths": _i32(len(ids)),
            "request_output_len": _i32(n),
            "end_id": _i32(2),
            "pad_id": _i32(2),
            "exclude_input_in_output": np.array([[True]]),
            "streaming": np.array([[False]]),
            **extra,
        }
        return [pb_utils.Tensor(name, value) for name, value in arrays.items()]

    def _call(self, model, inputs):
        request = pb_utils.InferenceRequest(
            model_name=model, requested_output_names=["output_ids", "sequence_length"], inputs=inputs
        )
        response = request.exec()
        if response.has_error():
            raise RuntimeError(f"{model}: {response.error().message()}")
        for name in ("output_ids", "sequence_length"):
            pb_utils.get_output_tensor_by_name(response, name).as_numpy()

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                times = self._run(request, sender)
            except Exception as exc:  # noqa: BLE001 - the request's error response
                sender.send(
                    pb_utils.InferenceResponse(error=pb_utils.TritonError(f"floor_caller: {exc}")),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
                continue
            sender.send(
                pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor("timings_ns", np.array(times, dtype=np.int64))]
                ),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
        return None

    def _run(self, request, sender):
        n_calls, length, k = (_scalar(request, name) for name in ("calls", "prompt_len", "draft_len"))
        ids = [5] * length
        times = {piece: [] for piece in PIECES}
        clock = time.perf_counter_ns
        for _ in range(n_calls):
            t0 = clock()
            self._inputs(ids, k, {"min_tokens": _i32(k)})
            times["build"].append(clock() - t0)
            t0 = clock()
            self._call("floor_draft", self._inputs(ids, k, {"min_tokens": _i32(k)}))
            times["draft"].append(clock() - t0)
            t0 = clock()
            drafts = {"draft_input_ids": np.array([[7] * k], dtype=np.int32)}
            self._call("floor_target", self._inputs(ids, k + 1, drafts))
            times["target"].append(clock() - t0)
            t0 = clock()
            out = [
                pb_utils.Tensor("text_output", np.array([b"abcd"], dtype=object)),
                pb_utils.Tensor("output_ids", np.zeros((1, 1, k + 1), dtype=np.int32)),
                pb_utils.Tensor("sequence_length", _i32(k + 1)),
            ]
            sender.send(pb_utils.InferenceResponse(output_tensors=out))
            times["send"].append(clock() - t0)
            t0 = clock()
            sender.is_cancelled()
            times["cancel"].append(clock() - t0)
            ids.append(7)  # the sequence grows one token a call, as a BLS request's does
        return [t for piece in PIECES for t in times[piece]]
