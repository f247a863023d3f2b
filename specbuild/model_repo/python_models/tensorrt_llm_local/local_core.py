"""The local `tensorrt_llm` model without Triton: read a request like the C++ backend, run the
reference engine, shape the outputs like the C++ backend.

Interface: specbuild.model_repo.tensors.tensorrt_llm_interface (names, dtypes, dims). What the local
model does with each input:
* input_ids / input_lengths / request_output_len / end_id (absent: no end token, TensorRT-LLM's -1) /
  temperature / runtime_top_k / runtime_top_p /
  seed (random_seed before TRT-LLM 0.20) / streaming / exclude_input_in_output / return_perf_metrics /
  return_generation_logits: as the backend (sampling defaults: trtllm_semantics.py);
* draft_input_ids (+ draft_logits): external draft verification (draft_tokens_external): one target pass,
  output = the accepted drafts + one target token;
* min_tokens (min_length) >= request_output_len: the end id does not stop the request (the BLS's
  draft calls ask for exactly k tokens);
* stop_words_list: a stop word ends the request after its last token (single-token words through the
  engine's stop ids, longer ones through the engine's stop hook, common/words.py); bad_words_list, beams or
  sequences > 1, LoRA, prompt
  tables, log probs and context logits are not supported and are rejected when actually used;
* return_num_input_tokens / return_num_output_tokens: num_input_tokens (the prompt's tokens) and
  num_output_tokens (the tokens of that response's output_ids, the prompt included when it is), as the
  C++ backend's model_instance_state.cc fills them;
* stop = true: a stop request (`is_stop_request`): the in-flight request with the same request id ends;
* lengths: the engine's limits (core/engine_limits.py): a prompt over the runtime input limit and more
  draft tokens than max_draft_len fail the request; an output length that would overflow max_seq_len
  is lowered to fit, as the backend does.

Shape legend: L prompt length, n new tokens, V vocab, k draft tokens.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from child_channel import pack_array, unpack_array
from engine_worker import RequestCounters
from trtllm_semantics import check_sampling, sampling_params
from words import scalar, word_lists

from specbuild.core.sampling_params import SamplingParams
from specbuild.model_repo.tensors import NUMPY_DTYPE, PERF_OUTPUTS

Get = Callable[[str], "np.ndarray | None"]


@dataclass(frozen=True)
class LocalRequest:
    prompt_ids: list[int]
    max_new: int  # request_output_len
    params: object  # SamplingParams
    streaming: bool = False
    exclude_input: bool = True
    perf: bool = False
    generation_logits: bool = False
    draft_ids: list[int] | None = None  # external draft verification
    draft_logits: np.ndarray | None = None  # [k, V]
    arrival_ns: int = 0
    stop_sequences: tuple[tuple[int, ...], ...] = ()  # stop words longer than one token
    request_id: str = ""
    num_input_tokens: bool = False  # return_num_input_tokens
    num_output_tokens: bool = False  # return_num_output_tokens
    requested_len: int = 0  # request_output_len as asked (max_new: after the max_seq_len clamp)


def is_stop_request(get: Get) -> bool:
    """A request with `stop` = true asks to end the in-flight request of the same request id (its other
    inputs are placeholders: upstream's client sends input_ids [[0]], input_lengths 0, request_output_len
    0)."""
    return bool(scalar(get, "stop", bool, False))


def parse_request(
    get: Get,
    *,
    seed_name: str,
    min_tokens_name: str,
    exclude_default: bool,
    default_end_id: int | None,
    limits=None,
    engine_draft_len: int = 0,
    request_id: str = "",
) -> LocalRequest:
    """limits: the engine's EngineLimits (None: unchecked); engine_draft_len: draft tokens the engine itself
    adds per step (Medusa: max_draft_len), counted against max_seq_len as the runtime does."""
    ids = get("input_ids")
    if ids is None:
        raise ValueError("input_ids is required by the local engine model")
    length = scalar(get, "input_lengths", int, np.asarray(ids).size)
    if not 0 < length <= np.asarray(ids).size:
        raise ValueError(f"input_lengths {length} does not fit input_ids of {np.asarray(ids).size} tokens")
    prompt = [int(t) for t in np.asarray(ids).reshape(-1)[:length]]
    requested = scalar(get, "request_output_len", int)
    if requested is None or requested < 1:
        raise ValueError(f"request_output_len must be >= 1, got {requested}")
    draft = get("draft_input_ids")
    draft_ids = [int(t) for t in np.asarray(draft).reshape(-1)] if draft is not None else None
    max_new = requested
    if limits is not None:
        limits.check_prompt(len(prompt))
        if draft_ids:
            limits.check_draft(len(draft_ids))
        max_new = limits.output_len(len(prompt), requested, len(draft_ids) if draft_ids else engine_draft_len)
        if max_new < 1:
            raise ValueError(
                f"no room for output tokens: the prompt ({len(prompt)} tokens) fills max_seq_len "
                f"({limits.max_seq_len}) with the draft tokens of a step"
            )
    for name in ("beam_width", "num_return_sequences"):
        value = scalar(get, name, int, 1)
        if value != 1:
            raise ValueError(f"{name} {value} is not supported by the local engine (1 only)")
    for name in ("bad_words_list", "lora_weights", "lora_task_id", "prompt_embedding_table"):
        value = get(name)
        if value is not None and np.asarray(value).size:
            raise ValueError(f"{name} is not supported by the local engine model")
    for name in ("return_log_probs", "return_context_logits"):
        if scalar(get, name, bool, False):
            raise ValueError(f"{name} is not supported by the local engine model")
    end_id = scalar(get, "end_id", int, default_end_id)
    min_tokens = scalar(get, min_tokens_name, int, 0)
    check_sampling(temperature=None, top_k=None, top_p=None, min_tokens=min_tokens)
    words = word_lists(get("stop_words_list"))
    stops = tuple(w[0] for w in words if len(w) == 1)
    sequences = tuple(tuple(w) for w in words if len(w) > 1)
    if min_tokens >= max_new:  # nothing may stop the request early
        end_id, stops, sequences = -1, (), ()
    params = sampling_params(
        max_tokens=max_new,
        temperature=scalar(get, "temperature", float),
        top_k=scalar(get, "runtime_top_k", int),
        top_p=scalar(get, "runtime_top_p", float),
        seed=scalar(get, seed_name, int),
        end_id=end_id,
    )
    params = dataclasses.replace(params, stop_token_ids=stops)
    logits = get("draft_logits")
    draft_logits = None
    if logits is not None and draft_ids:
        arr = np.asarray(logits, dtype=np.float32)
        draft_logits = arr.reshape(-1, arr.shape[-1])  # [k, V]
    return LocalRequest(
        prompt_ids=prompt,
        max_new=max_new,
        params=params,
        streaming=scalar(get, "streaming", bool, False),
        exclude_input=scalar(get, "exclude_input_in_output", bool, exclude_default),
        perf=scalar(get, "return_perf_metrics", bool, False),
        generation_logits=scalar(get, "return_generation_logits", bool, False),
        draft_ids=draft_ids,
        draft_logits=draft_logits,
        arrival_ns=time.time_ns(),
        stop_sequences=sequences,
        request_id=request_id,
        num_input_tokens=scalar(get, "return_num_input_tokens", bool, False),
        num_output_tokens=scalar(get, "return_num_output_tokens", bool, False),
        requested_len=requested,
    )


def request_to_wire(req: LocalRequest) -> dict:
    """A request as the engine process reads it (JSON: step_host.py); request_from_wire reverses it."""
    wire = dataclasses.asdict(dataclasses.replace(req, params=None, draft_logits=None))
    wire["params"] = req.params.to_dict()
    wire["draft_logits"] = None if req.draft_logits is None else pack_array(req.draft_logits)
    return wire


def request_from_wire(wire: dict) -> LocalRequest:
    fields = dict(wire)
    fields["params"] = SamplingParams.from_dict(wire["params"])
    fields["draft_logits"] = None if wire["draft_logits"] is None else unpack_array(wire["draft_logits"])
    fields["stop_sequences"] = tuple(tuple(int(t) for t in w) for w in wire["stop_sequences"])
    return LocalRequest(**fields)


def token_outputs(tokens: list[int], req: LocalRequest, *, with_prompt: bool) -> dict[str, np.ndarray]:
    """output_ids [1, 1, n] and sequence_length [1, 1] (prompt first when it is not excluded), and the
    token counts the request asked for."""
    ids = (req.prompt_ids + list(tokens)) if with_prompt else list(tokens)
    out = {
        "output_ids": np.array(ids, dtype=np.int32).reshape(1, 1, -1),  # [batch 1, beam 1, n]
        "sequence_length": np.array([[len(ids)]], dtype=np.int32),  # [1, 1]
    }
    if req.num_input_tokens:
        out["num_input_tokens"] = np.array([[len(req.prompt_ids)]], dtype=np.int32)  # [1, 1]
    if req.num_output_tokens:
        out["num_output_tokens"] = np.array([[len(ids)]], dtype=np.int32)  # [1, 1]
    return out


@dataclass
class Perf(RequestCounters):
    """The backend's return_perf_metrics outputs for one request (counters: common/engine_worker.py)."""

    def outputs(self) -> dict[str, np.ndarray]:
        """Every perf output of the tensor table (model_repo/tensors.py PERF_OUTPUTS), [1, 1] each."""
        values = {
            "kv_cache_alloc_new_blocks": self.new_blocks,
            "kv_cache_reused_blocks": self.reused_blocks,
            "kv_cache_alloc_total_blocks": self.new_blocks + self.reused_blocks,
            "arrival_time_ns": self.arrival_ns,
            "first_scheduled_time_ns": self.scheduled_ns or self.arrival_ns,
            "first_token_time_ns": self.first_token_ns,
            "last_token_time_ns": self.last_token_ns,
            "acceptance_rate": self.acceptance_rate,
            "total_accepted_draft_tokens": self.accepted,
            "total_draft_tokens": self.drafted,
        }
        return {t.name: np.array([[values[t.name]]], dtype=NUMPY_DTYPE[t.data_type]) for t in PERF_OUTPUTS}


def cut(tokens: list[int], params, limit: int) -> list[int]:
    """Stop after the first end/stop token and at `limit` tokens (as the backend's output would)."""
    stops = set(params.stop_token_ids) | ({params.end_id} if params.end_id is not None else set())
    out = []
    for t in tokens[:limit]:
        out.append(int(t))
        if t in stops:
            break
    return out


@dataclass
class Job:
    """One request being served."""

    req: LocalRequest
    responder: object  # responder.Responder: cancellation and (decoupled) the response sender
    perf: Perf
    tokens: list = field(default_factory=list)
    ran: bool = False  # generated already (batched with others)
    extra: dict = field(default_factory=dict)  # outputs beyond the tokens (generation_logits)
    cancelled: bool = False  # ended early: cancelled by Triton or stopped by a `stop` request
    error: Exception | None = None  # what failed the request
    reused_tokens: int = 0  # prompt tokens its run took from the engine's prefix cache
    steps: list = field(default_factory=list)  # (accepted, drafted) of its verification steps (metrics)
    head: list = field(default_factory=list)  # tokens its tree produced before it went on as a plain row
    paused: bool = False  # its tree stopped because the load turned the schedule's K to 0 (a row goes on)
    jid: int = 0  # its number between the model and its engine host (step_host.py)
    # streamed with return_perf_metrics, each chunk carries the perf outputs so far (step_host.py):
    live: tuple | None = None  # a whole job while it runs: (its SpecStats, the prefix cache's reuse before)
    held: list | None = None  # a row's streamed tokens held while it is admitted (its reuse is known after)
    streamed: int = 0  # the model's side: tokens streamed so far
    host: int = 0  # which start of the engine host it was handed to (model.py: a dead host's jobs fail)
