"""An in-process stand-in for the Python backend, to unit-test a generated repository's Python models
without a server: a fake `triton_python_backend_utils` module and a tiny scheduler that loads each
model's 1/model.py, routes BLS calls between models and runs the ensemble's steps.

It checks what a real server would check at the boundary (declared input names, required inputs,
data types); real serving is tested end to end by the client tests with tritonserver.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
import types
from pathlib import Path

import numpy as np

FINAL = 1  # TRITONSERVER_RESPONSE_COMPLETE_FINAL


class Tensor:
    def __init__(self, name: str, value):
        self._name, self._value = name, np.asarray(value)

    def name(self) -> str:
        return self._name

    def as_numpy(self):
        return self._value


class TritonError:
    INTERNAL, CANCELLED = 13, 1

    def __init__(self, message: str, code: int = 13):
        self._message, self._code = message, code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code


class InferenceResponse:
    def __init__(self, output_tensors=(), error=None):
        self.output_tensors, self._error = list(output_tensors), error

    def has_error(self) -> bool:
        return self._error is not None

    def error(self):
        return self._error


class Sender:
    """Records what a model sends; a decoupled model may send from its own thread after execute returns."""

    def __init__(self, request):
        self.request = request
        self.responses: list[tuple[InferenceResponse | None, int]] = []
        self.done = threading.Event()

    def send(self, response=None, flags=0):
        assert not self.done.is_set(), "a response after the final flag"
        self.responses.append((response, flags))
        if flags & FINAL:
            self.done.set()

    def is_cancelled(self) -> bool:
        return self.request.cancelled.is_set()


class Request:
    def __init__(
        self, inputs: dict[str, np.ndarray], requested: list[str] | None = None, request_id: str = ""
    ):
        self.inputs, self.requested, self._id = inputs, requested, request_id
        self.cancelled = threading.Event()  # tests set it: Triton's request cancellation
        self.sender = Sender(self)

    def get_response_sender(self):
        return self.sender

    def request_id(self) -> str:
        return self._id

    def is_cancelled(self) -> bool:
        return self.cancelled.is_set()


def get_input_tensor_by_name(request, name):
    return Tensor(name, request.inputs[name]) if name in request.inputs else None


def get_output_tensor_by_name(response, name):
    return next((t for t in response.output_tensors if t.name() == name), None)


class FakeServer:
    """Loads every model of a repository folder; `infer(model, inputs)` returns its responses."""

    def __init__(self, repo: Path, *, engine_process: bool = False):
        """engine_process: the local engine models run their engine in a child process, as served (False:
        inside this process, where a test can reach `model.engine` and the scheduler's internals)."""
        from specbuild.model_repo.configs import parse_text

        self.repo = Path(repo)
        self.engine_process = engine_process
        self.configs = {p.parent.name: parse_text(p.read_text()) for p in self.repo.glob("*/config.pbtxt")}
        self.calls: list[tuple[str, dict]] = []  # (model, inputs) of every request, in order
        self.log: list[str] = []  # pb_utils.Logger warnings and errors
        self._install_module()
        self.models = {}
        for name, cfg in self.configs.items():
            if cfg.platform == "ensemble":
                continue
            model = self._load(name)
            model.initialize(self.init_args(name))
            self.models[name] = model

    def close(self) -> None:
        """Unload every model, as Triton does at stop: each model's finalize (it releases what it holds:
        engine processes, the BLS's in-flight counter in /dev/shm)."""
        models, self.models = self.models, {}
        for model in models.values():
            if hasattr(model, "finalize"):
                model.finalize()

    def init_args(self, name: str) -> dict:
        """What Triton passes to a model instance's initialize()."""
        from google.protobuf.json_format import MessageToDict

        config = MessageToDict(self.configs[name], preserving_proto_field_name=True)
        params = config.setdefault("parameters", {})
        if "gpt_model_path" in params and "engine_process" not in params:  # a local engine model
            params["engine_process"] = {"string_value": str(self.engine_process).lower()}
        return {
            "model_config": json.dumps(config),
            "model_name": name,
            "model_repository": str(self.repo / name),
            "model_version": "1",
        }

    def _install_module(self) -> None:
        server = self
        mod = types.ModuleType("triton_python_backend_utils")
        mod.Tensor, mod.TritonError, mod.InferenceResponse = Tensor, TritonError, InferenceResponse
        mod.get_input_tensor_by_name, mod.get_output_tensor_by_name = (
            get_input_tensor_by_name,
            get_output_tensor_by_name,
        )
        mod.TRITONSERVER_RESPONSE_COMPLETE_FINAL = FINAL
        mod.Logger = types.SimpleNamespace(
            log_warn=lambda msg: server.log.append(msg),
            log_info=lambda msg: None,
            log_error=lambda msg: server.log.append(msg),
        )
        mod.using_decoupled_model_transaction_policy = lambda cfg: bool(
            cfg.get("model_transaction_policy", {}).get("decoupled")
        )

        class InferenceRequest:
            def __init__(self, model_name, requested_output_names, inputs, request_id=""):
                self.model_name, self.requested = model_name, list(requested_output_names)
                self.inputs = {t.name(): t.as_numpy() for t in inputs}
                self.request_id = request_id

            def exec(self, decoupled=False):
                responses = server.infer(self.model_name, self.inputs, request_id=self.request_id)
                if decoupled:
                    return iter(responses)
                assert len(responses) == 1, (
                    f"{self.model_name}: {len(responses)} responses to a non-decoupled call"
                )
                return responses[0]

        mod.InferenceRequest = InferenceRequest
        sys.modules["triton_python_backend_utils"] = mod

    def _load(self, name: str):
        path = self.repo / name / "1" / "model.py"
        spec = importlib.util.spec_from_file_location(f"fake_triton_model_{name}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        return module.TritonPythonModel()

    def _validate(self, name: str, inputs: dict[str, np.ndarray]) -> None:
        from tritonclient.grpc import model_config_pb2 as pb

        from specbuild.model_repo.tensors import NUMPY_DTYPE

        declared = {t.name: t for t in self.configs[name].input}
        for key, value in inputs.items():
            assert key in declared, f"{name}: input {key!r} is not declared in its config.pbtxt"
            want = NUMPY_DTYPE[pb.DataType.Name(declared[key].data_type)]
            got = "object" if np.asarray(value).dtype.kind in "OSU" else str(np.asarray(value).dtype)
            assert got == want, f"{name}: input {key} is {got}, config says {want}"
        for t in declared.values():
            assert t.optional or t.name in inputs, f"{name}: required input {t.name} missing"

    def infer(
        self, name: str, inputs: dict[str, np.ndarray], request_id: str = ""
    ) -> list[InferenceResponse]:
        """All responses of one request (decoupled models may send several)."""
        if self.configs[name].platform == "ensemble":
            self._validate(name, inputs)
            self.calls.append((name, inputs))
            return self._ensemble(self.configs[name], inputs)
        return self.infer_batch(name, [inputs], request_ids=[request_id])[0]

    def infer_batch(
        self,
        name: str,
        batch: list[dict[str, np.ndarray]],
        *,
        request_ids: list[str] | None = None,
        requests: list[Request] | None = None,
    ) -> list[list[InferenceResponse]]:
        """Several requests handed to one execute() call, as Triton's dynamic batcher does (or the given
        Request objects, which a test can cancel while they run)."""
        requests = requests or [
            Request(inputs, request_id=rid)
            for inputs, rid in zip(batch, request_ids or [""] * len(batch), strict=True)
        ]
        for request in requests:
            self._validate(name, request.inputs)
            self.calls.append((name, request.inputs))
        cfg = self.configs[name]
        returned = self.models[name].execute(requests)
        if cfg.model_transaction_policy.decoupled:
            assert returned is None, f"{name}: a decoupled model must return None from execute"
            out = []
            for request in requests:
                assert request.sender.done.wait(120), f"{name}: no final response"
                sent = request.sender.responses
                assert sent and sent[-1][1] == FINAL and all(flags == 0 for _, flags in sent[:-1]), (
                    f"{name}: final flag"
                )
                out.append([r for r, _ in sent if r is not None])
            return out
        if returned is None:  # a non-decoupled model answering through its response senders
            out = []
            for request in requests:
                assert request.sender.done.wait(120), f"{name}: no final response"
                sent = request.sender.responses
                # the Python backend's rules: exactly one response, with the final flag
                # ("Non-decoupled model cannot send more than one response" / "... complete final before
                # sending a response")
                assert len(sent) == 1 and sent[0][0] is not None and sent[0][1] == FINAL, (
                    f"{name}: a non-decoupled model sends exactly one response, with the final flag"
                )
                out.append([sent[0][0]])
            return out
        assert len(returned) == len(requests)
        return [[r] for r in returned]

    def _ensemble(self, cfg, inputs: dict[str, np.ndarray]) -> list[InferenceResponse]:
        """Run the steps in order; a step with several responses feeds each one to the following steps."""

        def run(step_index: int, tensors: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
            if step_index == len(cfg.ensemble_scheduling.step):
                return [tensors]
            step = cfg.ensemble_scheduling.step[step_index]
            step_inputs = {k: tensors[v] for k, v in step.input_map.items() if v in tensors}
            results = []
            for response in self.infer(step.model_name, step_inputs):
                assert not response.has_error(), response.error().message()
                produced = dict(tensors)
                for t in response.output_tensors:
                    if t.name() in step.output_map:
                        produced[step.output_map[t.name()]] = t.as_numpy()
                results += run(step_index + 1, produced)
            return results

        names = {o.name for o in cfg.output}
        return [
            InferenceResponse([Tensor(k, v) for k, v in r.items() if k in names])
            for r in run(0, dict(inputs))
        ]


def stop_request(request_id: str) -> Request:
    """The backend's `stop` request for a running request id (empty input tensors, stop = true)."""
    empty = np.zeros((1, 1), dtype=np.int32)
    return Request(
        {"input_ids": empty, "input_lengths": empty, "request_output_len": empty, "stop": np.array([[True]])},
        request_id=request_id,
    )


def engine_request(ids, n, *, exclude_input_in_output=True, **extra):
    """tensorrt_llm inputs; exclude_input_in_output None omits it (the model's parameter: false)."""
    inputs = {
        "input_ids": np.array([ids], dtype=np.int32),
        "input_lengths": np.array([[len(ids)]], dtype=np.int32),
        "request_output_len": np.array([[n]], dtype=np.int32),
    }
    if exclude_input_in_output is not None:
        inputs["exclude_input_in_output"] = np.array([[exclude_input_in_output]])
    for key, value in extra.items():
        inputs[key] = np.asarray(value)
    return inputs


def text_request(
    text: str, max_tokens: int, *, exclude_input_in_output: bool | None = True, **extra
) -> dict[str, np.ndarray]:
    """Ensemble / BLS inputs with the batch dim: scalars become [1, 1] arrays of the right dtype.
    exclude_input_in_output defaults to True here (the continuation alone); None omits it (the
    backend's default, false: non-streamed answers start with the prompt)."""
    dtypes = {
        "stream": bool,
        "use_draft_logits": bool,
        "return_perf_metrics": bool,
        "exclude_input_in_output": bool,
        "num_draft_tokens": np.int32,
        "top_k": np.int32,
        "temperature": np.float32,
        "top_p": np.float32,
        "seed": np.uint64,
        "end_id": np.int32,
        "return_num_input_tokens": bool,
        "return_num_output_tokens": bool,
        "min_tokens": np.int32,
    }
    inputs = {
        "text_input": np.array([[text.encode()]], dtype=object),
        "max_tokens": np.array([[max_tokens]], dtype=np.int32),
    }
    if exclude_input_in_output is not None:
        extra["exclude_input_in_output"] = exclude_input_in_output
    for key, value in extra.items():
        inputs[key] = np.array([[value]], dtype=dtypes[key])
    return inputs


def collect(responses) -> dict:
    """Concatenate text deltas and token ids of a response stream; keep the last perf outputs. chunks: the
    token count of each response that carried tokens."""
    text, tokens, perf, chunks = "", [], {}, []
    for r in responses:
        assert not r.has_error(), r.error().message()
        out = {t.name(): t.as_numpy() for t in r.output_tensors}
        text += out["text_output"].reshape(-1)[0].decode() if "text_output" in out else ""
        if "output_ids" in out:
            new = out["output_ids"].reshape(-1)[: int(out["sequence_length"].reshape(-1)[0])].tolist()
            tokens += new
            chunks += [len(new)] if new else []
        for key in (
            "acceptance_rate",
            "total_accepted_draft_tokens",
            "total_draft_tokens",
            "first_token_time_ns",
            "last_token_time_ns",
            "arrival_time_ns",
            "kv_cache_reused_blocks",
        ):
            if key in out:
                perf[key] = out[key].reshape(-1)[0].item()
    return {"text": text, "tokens": tokens, "perf": perf, "responses": len(list(responses)), "chunks": chunks}
