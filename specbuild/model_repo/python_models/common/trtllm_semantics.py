"""How the TensorRT-LLM backend reads a request's sampling inputs, as one function.

Copied into every Python model of a generated repository (the BLS and the local tensorrt_llm model
must agree with each other and with the C++ backend they stand in for):

* a missing `temperature` is 1.0; a missing `runtime_top_k` is 0 and a missing `runtime_top_p` 0.0;
* top_k == 0 and top_p == 0 together mean greedy (the backend's sampling layers then use top-k 1);
  temperature 0 is greedy too (specbuild's convention, the same as SamplingParams);
* top_p 0 with top_k > 0 means "no nucleus filter" (1.0).
"""

from __future__ import annotations


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

    temperature = 1.0 if temperature is None else float(temperature)
    top_k = 0 if top_k is None else max(0, int(top_k))
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
