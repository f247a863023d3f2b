"""tensorrt_llm_local/spec_metrics.py: the speculative Prometheus series are summed in the model and sent
by a flusher thread (each Metric update is an IPC round trip through the Python backend), totals exact."""

from __future__ import annotations

import importlib.util
import sys
import time
import types
from pathlib import Path

import pytest

MODULE = (
    Path(__file__).resolve().parents[1]
    / "specbuild/model_repo/python_models/tensorrt_llm_local/spec_metrics.py"
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
    from specbuild.core.trtllm_facts import PROMETHEUS_SPEC_DECODE as N

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
