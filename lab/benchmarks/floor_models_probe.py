"""The engine work the IPC floor's probe times, the same code inside a Triton stub
(floor_models/engine_probe.py) and in the benchmark's own process (ipc_floor.engine_probe)."""

from __future__ import annotations

import time

from specbuild.core.sampling_params import SamplingParams

PIECES = ("plain", "speculative")  # = floor_models/engine_probe.py PIECES


def time_engine_pieces(
    engine, *, reps: int, prompt_len: int, draft_len: int, max_tokens: int
) -> dict[str, list[int]]:
    """piece -> ns per repetition: `plain` (prompt_len tokens -> draft_len tokens, the target alone, the
    prefix cache warm after the first) and `speculative` (-> max_tokens tokens, the in-process loop at
    K = draft_len). end_id -1: every run generates its full length."""
    ids = [5 + (i * 7) % 50 for i in range(prompt_len)]
    plain = SamplingParams(max_tokens=draft_len, end_id=-1)
    spec = SamplingParams(max_tokens=max_tokens, end_id=-1)
    clock = time.perf_counter_ns
    out: dict[str, list[int]] = {piece: [] for piece in PIECES}
    for _ in range(reps):
        t0 = clock()
        engine.generate(ids, plain, speculative=False)
        out["plain"].append(clock() - t0)
        t0 = clock()
        engine.generate(ids, spec, speculative=True, num_draft_tokens=draft_len)
        out["speculative"].append(clock() - t0)
    return out
