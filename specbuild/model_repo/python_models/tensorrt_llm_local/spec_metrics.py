"""trtllm-serve's speculative-decoding Prometheus series from a local Python-backend engine model, through
Triton's custom-metrics API: the engine-flow `tensorrt_llm` stand-in (this folder) and the LLM-API one
(`repo --backend llmapi-local` copies this file next to it). Not in common/: the BLS vendors every
common module and must not depend on specbuild; these models run where specbuild is installed."""

from __future__ import annotations

import triton_python_backend_utils as pb_utils


class SpecMetrics:
    """trtllm-serve's speculative-decoding series (core/trtllm_facts.py PROMETHEUS_SPEC_DECODE) through
    Triton's custom-metrics API, labelled with this model's name; created at the first speculative step,
    so a model that never speculates (the draft) exports none. One verification of BLS drafts is one
    step (an iteration of the real engine); a Medusa request counts each of its tree steps."""

    def __init__(self, model: str):
        self.model = model
        self._families = None
        self._position: dict[tuple[str, int], object] = {}

    def _setup(self):
        from specbuild.core.trtllm_facts import PROMETHEUS_SPEC_DECODE as N
        from specbuild.core.trtllm_facts import PROMETHEUS_SPEC_STEPS

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

    def _per_position(self, kind: str, position: int):
        key = (kind, position)
        if key not in self._position:
            from specbuild.core.trtllm_facts import PROMETHEUS_POSITION_LABEL

            labels = {"model": self.model, PROMETHEUS_POSITION_LABEL: str(position)}
            self._position[key] = self._families[kind].Metric(labels=labels)
        return self._position[key]

    def record(self, steps: list[tuple[int, int]]) -> None:
        """steps: (accepted, drafted) of each verification step of one request (drafted > 0)."""
        steps = [(a, d) for a, d in steps if d > 0]
        if not steps or not hasattr(pb_utils, "MetricFamily"):
            return
        if self._families is None:
            self._setup()
        accepted, drafted = sum(a for a, _ in steps), sum(d for _, d in steps)
        self.drafted.increment(drafted)
        self.accepted.increment(accepted)
        self.steps.increment(len(steps))
        self.length.set(1.0 + accepted / len(steps))
        for a, d in steps:
            for i in range(d):
                self._per_position("drafted_per_position", i).increment(1)
                if i < a:
                    self._per_position("accepted_per_position", i).increment(1)
