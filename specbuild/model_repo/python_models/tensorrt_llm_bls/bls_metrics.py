"""The BLS's own Prometheus counter, through Triton's custom-metrics API (pb_utils.MetricFamily, Python
backend 2.51): `specbuild_ngram_pool_fallbacks_total{model, reason}`, the requests of an n-gram
repository drafted from a private pool instead of the server's shared one (bls_core.NGramDrafter):
reason "locked" (another process held the pool file), "error" (another SQLite error), "unusable" (the
instance could not open the shared pool at start: every request it serves counts).

Lifetime as engine_common/spec_metrics.py explains (python_backend r24.10, src/metric.cc): a
Metric or MetricFamily deleted after the stub tore down its shared memory segfaults the stub, so the
objects are held by the module (`_OPEN`) and deleted by `close()` in the model's finalize, never by
the garbage collector. Fallbacks are rare: each is sent at once (one IPC round trip), no flusher.

Plain Python: runs in the production container, where specbuild is not installed.
"""

from __future__ import annotations

import threading

import triton_python_backend_utils as pb_utils

POOL_FALLBACKS = "specbuild_ngram_pool_fallbacks_total"  # Triton adds no _total suffix: it is in the name

_OPEN: set[FallbackCounter] = set()


class FallbackCounter:
    """`count(reason)`: one more request of `model` drafted from a private pool for `reason`."""

    def __init__(self, model: str):
        self.model = model
        self._lock = threading.Lock()
        self._family = None
        self._metrics: dict[str, object] = {}
        self._closed = False

    def count(self, reason: str) -> None:
        if not hasattr(pb_utils, "MetricFamily"):  # a backend without custom metrics: nothing to export
            return
        with self._lock:
            if self._closed:
                return
            if self._family is None:
                self._family = pb_utils.MetricFamily(
                    name=POOL_FALLBACKS,
                    description="Requests drafted from a private n-gram pool instead of the shared one",
                    kind=pb_utils.MetricFamily.COUNTER,
                )
                _OPEN.add(self)
            metric = self._metrics.get(reason)
            if metric is None:
                metric = self._metrics[reason] = self._family.Metric(
                    labels={"model": self.model, "reason": reason}
                )
            metric.increment(1)

    def close(self) -> None:
        """The model's finalize: delete the metrics, then the family, while the stub can still tell the
        server. Idempotent; count() after it does nothing."""
        with self._lock:
            self._closed = True
            self._metrics.clear()
            self._family = None
            _OPEN.discard(self)
