"""engine_common/spec_metrics.py: the speculative Prometheus series are summed in the model and sent
by a flusher thread (each Metric update is an IPC round trip through the Python backend), totals exact."""

from __future__ import annotations

import importlib.util
import sys
import time
import types
from pathlib import Path

import pytest

MODULE = (
    Path(__file__).resolve().parents[1] / "specbuild/model_repo/python_models/engine_common/spec_metrics.py"
)


class _Metric:
    def __init__(self, log, labels):
        self.log, self.labels, self.value = log, labels, 0.0

    def increment(self, n):
        self.log.append(("increment", n))
        self.value += n

    def set(self, v):
        self.log.append(("set", v))
        self.value = v


@pytest.fixture
def metrics(monkeypatch):
    log: list = []
    series: dict = {}

    class MetricFamily:
        COUNTER, GAUGE = "counter", "gauge"

        def __init__(self, name, description, kind):
            self.name = name

        def Metric(self, labels):  # noqa: N802 - the backend's spelling
            m = series.setdefault((self.name, tuple(sorted(labels.items()))), _Metric(log, labels))
            return m

    fake = types.ModuleType("triton_python_backend_utils")
    fake.MetricFamily = MetricFamily
    fake.Logger = types.SimpleNamespace(log_warn=lambda msg: log.append(("warn", msg)))
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", fake)
    spec = importlib.util.spec_from_file_location("spec_metrics_under_test", MODULE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, log, series


def test_steps_are_summed_and_flushed_in_few_updates(metrics):
    module, log, series = metrics
    m = module.SpecMetrics("tensorrt_llm", flush_s=0.2)
    for _ in range(20):  # 20 verification calls of K=4, 3 accepted each
        m.record([(3, 4)])
    assert not [e for e in log if e[0] == "increment"]  # nothing sent yet: no IPC on the request path
    m.close()
    updates = [e for e in log if e[0] == "increment"]
    # one update per series (drafted, accepted, steps, 4 drafted positions, 3 accepted positions), not
    # 20 x (3 + 4 + 3)
    assert len(updates) <= 10, updates
    from specbuild.core.facts.trtllm import PROMETHEUS_SPEC_DECODE as N

    assert sum(m.value for (name, _), m in series.items() if name == N["num_draft_tokens"]) == 80
    assert sum(m.value for (name, _), m in series.items() if name == N["num_accepted_tokens"]) == 60
    per_position = [m.value for (name, _), m in series.items() if name == N["drafted_per_position"]]
    assert sorted(per_position) == [20, 20, 20, 20]


def test_the_flusher_sends_within_flush_s(metrics):
    module, log, series = metrics
    m = module.SpecMetrics("tensorrt_llm", flush_s=0.02)
    m.record([(1, 2)])
    deadline = time.monotonic() + 5
    while not [e for e in log if e[0] == "increment"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [e for e in log if e[0] == "increment"], "the flusher never sent the pending counts"
    m.close()


@pytest.fixture
def lifetimes(monkeypatch):
    """A fake backend that records when each Metric / MetricFamily object is deleted (in the real stub a
    deletion is an IPC message through the stub's shared-memory pool)."""
    deleted: list = []

    class Metric:
        def __init__(self, family, labels):
            self.family, self.labels = family, labels

        def increment(self, n):
            pass

        def set(self, v):
            pass

        def __del__(self):
            deleted.append(("metric", self.family))

    class MetricFamily:
        COUNTER, GAUGE = "counter", "gauge"

        def __init__(self, name, description, kind):
            self.name = name

        def Metric(self, labels):  # noqa: N802 - the backend's spelling
            return Metric(self.name, labels)

        def __del__(self):
            deleted.append(("family", self.name))

    fake = types.ModuleType("triton_python_backend_utils")
    fake.MetricFamily = MetricFamily
    fake.Logger = types.SimpleNamespace(log_warn=lambda msg: None)
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", fake)
    spec = importlib.util.spec_from_file_location("spec_metrics_lifetime", MODULE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, deleted


def test_the_series_outlive_the_model_and_close_deletes_them(lifetimes):
    """The 2.51 stub drops the model instance after tearing its shared memory down (a Metric deleted then
    segfaults the stub): only close() (finalize) may delete the series; dropping the model must not."""
    import gc

    module, deleted = lifetimes
    m = module.SpecMetrics("tensorrt_llm", flush_s=0.01)
    m.record([(1, 2)])
    m.flush()  # per-position series exist too
    ref = m
    del m
    gc.collect()
    assert deleted == []  # the model let go (its instance dropped): the series are kept alive
    ref.close()
    gc.collect()
    kinds = [kind for kind, _ in deleted]
    # 4 named series + 2 drafted positions + 1 accepted position, then the 6 families
    assert kinds.count("metric") == 7 and kinds.count("family") == 6
    assert kinds.index("family") > max(i for i, k in enumerate(kinds) if k == "metric")  # metrics first
    assert module._OPEN == set()
    deleted.clear()
    ref.record([(2, 2)])  # a step that ends during finalize creates nothing (no series left to delete)
    ref.close()  # idempotent
    gc.collect()
    assert deleted == [] and ref._families is None
