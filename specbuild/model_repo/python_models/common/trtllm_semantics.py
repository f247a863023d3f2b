"""How the TensorRT-LLM backend reads a request's sampling inputs, as one function.

Copied into every Python model of a generated repository (the BLS and the local tensorrt_llm model
must agree with each other and with the C++ backend they stand in for):

* a missing `temperature` is 1.0; a missing `runtime_top_k` is 0 and a missing `runtime_top_p` 0.0;
* top_k == 0 and top_p == 0 together mean greedy (the backend's sampling layers then use top-k 1);
  temperature 0 is greedy too (specbuild's convention, the same as SamplingParams);
* top_p <= 0 means "no nucleus filter" (the backend resets it: `utils.cc getSamplingConfigFromTensors`).

Refused as the executor's `SamplingConfig` checks refuse them (TensorRT-LLM
`cpp/tensorrt_llm/executor/samplingConfig.cpp`: `TLLM_CHECK(temperature >= 0)`, `topK >= 0`,
`0 < topP <= 1`, `minTokens >= 0`, `beamWidth > 0`): a negative or NaN temperature, a negative top_k,
top_p above 1 or NaN, negative min_tokens. The error is the request's error response.
"""

from __future__ import annotations

import math


def check_sampling(
    *, temperature: float | None, top_k: int | None, top_p: float | None, min_tokens: int | None = None
) -> None:
    """Raise ValueError for what the backend's SamplingConfig refuses (NaN fails `>= 0` there too)."""
    if temperature is not None and not (temperature >= 0.0 and math.isfinite(temperature)):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature}")
    if top_k is not None and top_k < 0:
        raise ValueError(f"top_k must be >= 0, got {top_k}")
    if top_p is not None and (math.isnan(top_p) or top_p > 1.0):
        raise ValueError(f"top_p must be in (0, 1] (0 or less: no nucleus filter), got {top_p}")
    if min_tokens is not None and min_tokens < 0:
        raise ValueError(f"min_tokens must be >= 0, got {min_tokens}")


def sampling_params(
    *,
    max_tokens: int,
    temperature: float | None,
    top_k: int | None,
    top_p: float | None,
    seed: int | None,
    end_id: int | None,
):
    from specbuild.core.sampling_params import SamplingParams

    check_sampling(temperature=temperature, top_k=top_k, top_p=top_p)
    temperature = 1.0 if temperature is None else float(temperature)
    top_k = 0 if top_k is None else int(top_k)
    top_p = 0.0 if top_p is None else float(top_p)
    greedy = temperature <= 0.0 or (top_k == 0 and top_p <= 0.0) or top_k == 1
    if greedy:
        return SamplingParams(max_tokens=max_tokens, temperature=0.0, seed=seed, end_id=end_id)
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p if 0.0 < top_p <= 1.0 else 1.0,
        seed=seed,
        end_id=end_id,
    )
