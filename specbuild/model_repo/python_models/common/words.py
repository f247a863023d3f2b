"""Helpers every Python model of a repository shares (copied into each model's folder).

* `param(config, key, default)`: a config.pbtxt string parameter (unset `${...}` template values
  read as the default); `flag(value)`: its boolean reading;
* `scalar(get, name, kind, default)`: one value of an optional input tensor (batch size 1);
* `word_lists(value)`: the backend's [1, 2, n] stop/bad word list -> each word's token ids;
* `find_stop(tokens, sequences, start)`: where the first multi-token stop word ends;
* `stop_at_words(sequences)`: a stop hook for the speculative loop (engines/reference/speculative.py
  `StopHook`) that ends a request right after a multi-token stop word; `first_stop(*hooks)` combines
  it with others (cancellation).

Plain Python + numpy: the BLS runs it in the production container too (no specbuild there).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np


def param(config: dict, key: str, default: str = "") -> str:
    value = config.get("parameters", {}).get(key, {}).get("string_value", "")
    return default if value == "" or value.startswith("${") else value


def flag(value: str) -> bool:
    return value.strip().lower() in ("true", "1", "yes")


def scalar(get: Callable[[str], np.ndarray | None], name: str, kind, default=None):
    """kind(first value) of input `name`; `default` when it is absent or empty."""
    value = get(name)
    if value is None or np.asarray(value).size == 0:
        return default
    return kind(np.asarray(value).reshape(-1)[0])


def word_lists(value: np.ndarray | None) -> list[list[int]]:
    """[1, 2, n] backend word list (ids; offsets, -1 padded) -> the words as token lists."""
    if value is None or np.asarray(value).size == 0:
        return []
    arr = np.asarray(value).reshape(2, -1)
    words, start = [], 0
    for end in (int(o) for o in arr[1] if o >= 0):
        words.append([int(t) for t in arr[0, start:end]])
        start = end
    return [w for w in words if w]


def find_stop(tokens: Sequence[int], sequences: Sequence[Sequence[int]], start: int = 0) -> int | None:
    """End (exclusive) of the first stop sequence in `tokens` that ends after position `start`."""
    for end in range(start + 1, len(tokens) + 1):
        for seq in sequences:
            if end >= len(seq) and tuple(tokens[end - len(seq) : end]) == tuple(seq):
                return end
    return None


def first_stop(*hooks):
    """One stop hook from several (None ones skipped): the first that ends the request decides."""
    hooks = [h for h in hooks if h is not None]
    if not hooks:
        return None

    def stop(out, start):
        for hook in hooks:
            end = hook(out, start)
            if end is not None:
                return end
        return None

    return stop


def stop_at_words(sequences: Sequence[Sequence[int]]):
    """A StopHook(out, start) -> cut length: the request ends after the first stop word that completes."""
    if not sequences:
        return None
    return lambda out, start: find_stop(out, sequences, start)
