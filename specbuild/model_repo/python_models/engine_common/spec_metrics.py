"""trtllm-serve's speculative-decoding Prometheus series from a local Python-backend engine model, through
Triton's custom-metrics API: the engine-flow `tensorrt_llm` stand-in and the LLM-API one (both get this
folder: model_repo/sources.py). Not in common/: the BLS gets every common module and must not depend on
specbuild; these models run where specbuild is installed."""

from __future__ import annotations

import threading
import time
from collections import Counter

import triton_python_backend_utils as pb_utils

# The Metric and MetricFamily objects of every SpecMetrics not yet closed (what keeps them alive; see
# SpecMetrics.close for why not the model instance).
_OPEN: set[SpecMetrics] = set()

# Every Metric update is an IPC round trip from the stub to the server (about 4 + 2K per verification
# step): record() only adds to pending counts, and a flusher thread sends them, summed, at most FLUSH_S
# after the step that made them (the series lag the requests by that much; `bench` re-reads the page
# until they agree).
FLUSH_S = 0.05


class SpecMetrics:
    """trtllm-serve's speculative-decoding series (core/facts/trtllm.py PROMETHEUS_SPEC_DECODE) through
    Triton's custom-metrics API, labelled with this model's name; created at the first speculative step,
    so a model that never speculates (the draft) exports none. One verification of BLS drafts is one
    step (an iteration of the real engine); a Medusa request counts each of its tree steps.

    Lifetime (python_backend r24.10, src/metric.cc, src/pb_stub.cc): deleting a Metric or MetricFamily
    sends the server a delete message through the stub's shared-memory pool. The stub tears that pool
    down when it ends: `Stub::~Stub` drops the model instance after the stub singleton is reset, and a
    Metric deleted then gets a fresh stub object with no pool (a segfault at 0x60 in
    Metric::SaveToSharedMemory or MetricFamily::SaveToSharedMemory, once per server stop). So the
    objects are held by the module (`_OPEN`), not only by the model: close() (the model's finalize,
    the stub still whole) deletes them all; a stub that ends without finalize (its server died) exits
    without finalizing Python, so they are never deleted at all."""

    def __init__(self, model: str, flush_s: float = FLUSH_S):
        self.model, self.flush_s = model, flush_s
        self._families = None
        self._position: dict[tuple[str, int], object] = {}
        self._lock = threading.Lock()  # guards the pending counts
        self._pending: Counter = Counter()  # "drafted", "accepted", "steps", ("drafted_per_position", i), ...
        self._length: float | None = None  # the last recorded step's acceptance length (a gauge)
        self._wake = threading.Event()
        self._closing = False  # close() began: record() adds nothing more
        self._flusher: threading.Thread | None = None

    def _setup(self):
        from specbuild.core.facts.trtllm import PROMETHEUS_SPEC_DECODE as N
        from specbuild.core.facts.trtllm import PROMETHEUS_SPEC_STEPS

        family = pb_utils.MetricFamily
        labels = {"model": self.model}

        def make(name, kind, description):
            return family(name=name, description=description, kind=kind)

        counter, gauge = family.COUNTER, family.GAUGE
        # every family stays referenced for the model's life: the backend refuses to update a Metric
        # whose MetricFamily was deleted
        self._families = {
            "drafted_per_position": make(N["drafted_per_position"], counter, "Drafted tokens per position"),
            "accepted_per_position": make(
                N["accepted_per_position"], counter, "Accepted draft tokens per position"
            ),
            "drafted": make(N["num_draft_tokens"], counter, "Draft tokens verified"),
            "accepted": make(N["num_accepted_tokens"], counter, "Draft tokens accepted"),
            "length": make(N["acceptance_length"], gauge, "Tokens per step, last iteration"),
            "steps": make(PROMETHEUS_SPEC_STEPS, counter, "Verification steps (specbuild)"),
        }
        self.drafted = self._families["drafted"].Metric(labels=labels)
        self.accepted = self._families["accepted"].Metric(labels=labels)
        self.length = self._families["length"].Metric(labels=labels)
        self.steps = self._families["steps"].Metric(labels=labels)
        _OPEN.add(self)

    def _per_position(self, kind: str, position: int):
        key = (kind, position)
        if key not in self._position:
            from specbuild.core.facts.trtllm import PROMETHEUS_POSITION_LABEL

            labels = {"model": self.model, PROMETHEUS_POSITION_LABEL: str(position)}
            self._position[key] = self._families[kind].Metric(labels=labels)
        return self._position[key]

    def record(self, steps: list[tuple[int, int]]) -> None:
        """steps: (accepted, drafted) of each verification step of one request (drafted > 0). Adds them
        to the pending counts; the flusher sends them within flush_s."""
        steps = [(a, d) for a, d in steps if d > 0]
        if not steps or not hasattr(pb_utils, "MetricFamily"):
            return
        accepted, drafted = sum(a for a, _ in steps), sum(d for _, d in steps)
        with self._lock:
            if self._closing:  # finalize: the series are being deleted (a step that ends now is not counted)
                return
            if self._families is None:
                self._setup()
            self._pending.update(drafted=drafted, accepted=accepted, steps=len(steps))
            for a, d in steps:
                for i in range(d):
                    self._pending["drafted_per_position", i] += 1
                    if i < a:
                        self._pending["accepted_per_position", i] += 1
            self._length = 1.0 + accepted / len(steps)
            if self._flusher is None:
                self._flusher = threading.Thread(target=self._loop, name=f"{self.model}-metrics", daemon=True)
                self._flusher.start()
        self._wake.set()

    def flush(self) -> None:
        """Send the pending counts (summed: one update per series)."""
        with self._lock:
            pending, self._pending = self._pending, Counter()
            length, self._length = self._length, None
        for key, n in pending.items():
            if not n:
                continue
            metric = getattr(self, key) if isinstance(key, str) else self._per_position(*key)
            metric.increment(n)
        if length is not None:
            self.length.set(length)

    def close(self) -> None:
        """The model's finalize: stop the flusher, send what is pending, then delete every Metric and
        MetricFamily while the stub can still tell the server (see the class docstring). Idempotent;
        record() after it adds nothing."""
        with self._lock:
            self._closing = True
        self._wake.set()
        if self._flusher is not None:
            self._flusher.join(timeout=5)
        if self._families is None:
            return
        try:
            self.flush()
        finally:
            self._release()

    def _release(self) -> None:
        """Drop every reference to the Metric and MetricFamily objects: the metrics first (each family
        deletes its own metrics on the server), then the families."""
        self.drafted = self.accepted = self.length = self.steps = None
        self._position.clear()
        families, self._families = self._families, None
        _OPEN.discard(self)
        families.clear()

    def _loop(self) -> None:
        while not self._closing:
            self._wake.wait()
            if self._closing:
                return
            self._wake.clear()
            time.sleep(self.flush_s)  # gather the steps of the next calls into one update
            try:
                self.flush()
            except Exception as exc:  # noqa: BLE001 - metrics are best effort; never kill the model
                pb_utils.Logger.log_warn(f"{self.model}: speculative metrics not updated: {exc}")
