"""Read the server's speculative counters from its Prometheus endpoint and cross-check bench's own.

The local engine models export trtllm-serve's series (core/facts/trtllm.py PROMETHEUS_SPEC_DECODE)
through Triton's custom-metrics API; `bench --metrics-url` reads them before and after each speculative
run (prometheus_client's text parser) and compares the differences with the counts the requests
themselves returned (the BLS's perf outputs): drafted and accepted tokens, verification steps and the
per-position series. They agree exactly when bench is the server's only client.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from specbuild.core.errors import ClientError
from specbuild.core.facts.trtllm import (
    PROMETHEUS_POSITION_LABEL,
    PROMETHEUS_SPEC_DECODE,
    PROMETHEUS_SPEC_STEPS,
)
from specbuild.model_repo.tensors import TARGET_MODEL

MAX_METRICS_BYTES = 16 * 2**20  # a /metrics page is tens of KB; bound the read
TIMEOUT_S = 10.0


@dataclass(frozen=True)
class SpecCounters:
    """The speculative counters of one model at one moment."""

    drafted: float = 0.0
    accepted: float = 0.0
    steps: float = 0.0
    drafted_per_position: dict[int, float] = field(default_factory=dict)
    accepted_per_position: dict[int, float] = field(default_factory=dict)

    def minus(self, before: SpecCounters) -> SpecCounters:
        def sub(a: dict[int, float], b: dict[int, float]) -> dict[int, float]:
            return {k: a.get(k, 0.0) - b.get(k, 0.0) for k in sorted(set(a) | set(b))}

        return SpecCounters(
            self.drafted - before.drafted,
            self.accepted - before.accepted,
            self.steps - before.steps,
            sub(self.drafted_per_position, before.drafted_per_position),
            sub(self.accepted_per_position, before.accepted_per_position),
        )

    def to_dict(self) -> dict:
        return {
            "drafted": self.drafted,
            "accepted": self.accepted,
            "steps": self.steps,
            "drafted_per_position": {str(k): v for k, v in self.drafted_per_position.items()},
            "accepted_per_position": {str(k): v for k, v in self.accepted_per_position.items()},
        }


def parse_counters(text: str, model: str = TARGET_MODEL) -> SpecCounters:
    """The counters of `model` in a Prometheus text exposition (absent series count 0)."""
    totals = {key: 0.0 for key in ("drafted", "accepted", "steps")}
    per_position: dict[str, dict[int, float]] = {"drafted": {}, "accepted": {}}
    names = {
        PROMETHEUS_SPEC_DECODE["num_draft_tokens"]: "drafted",
        PROMETHEUS_SPEC_DECODE["num_accepted_tokens"]: "accepted",
        PROMETHEUS_SPEC_STEPS: "steps",
    }
    positions = {
        PROMETHEUS_SPEC_DECODE["drafted_per_position"]: "drafted",
        PROMETHEUS_SPEC_DECODE["accepted_per_position"]: "accepted",
    }
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("model") != model:
                continue
            if sample.name in names:
                totals[names[sample.name]] += sample.value
            elif sample.name in positions and PROMETHEUS_POSITION_LABEL in sample.labels:
                table = per_position[positions[sample.name]]
                pos = int(sample.labels[PROMETHEUS_POSITION_LABEL])
                table[pos] = table.get(pos, 0.0) + sample.value
    return SpecCounters(
        totals["drafted"],
        totals["accepted"],
        totals["steps"],
        per_position["drafted"],
        per_position["accepted"],
    )


def scrape(url: str, model: str = TARGET_MODEL) -> SpecCounters:
    """GET the metrics page (bounded) and parse the speculative counters of `model`."""
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:  # noqa: S310 - the user's own URL
            raw = response.read(MAX_METRICS_BYTES + 1)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ClientError(
            f"cannot read the server's metrics at {url}",
            expected="the Prometheus endpoint of the running tritonserver",
            found=str(exc),
            fix="pass --metrics-url http://HOST:METRICS_PORT/metrics (serve prints it), or drop it",
        ) from None
    if len(raw) > MAX_METRICS_BYTES:
        raise ClientError(f"the metrics page at {url} is larger than 16 MiB", fix="check --metrics-url")
    return parse_counters(raw.decode("utf-8", errors="replace"), model)


def cross_check(delta: SpecCounters, *, drafted: int, accepted: int, steps: int | None) -> dict:
    """The server's counter differences next to the requests' own counts."""
    ours = {"drafted": drafted, "accepted": accepted, "steps": steps}
    theirs = {"drafted": delta.drafted, "accepted": delta.accepted, "steps": delta.steps}
    agree = all(ours[k] is None or abs(theirs[k] - ours[k]) < 0.5 for k in ours)  # counts: integers
    return {"prometheus": delta.to_dict(), "bench": ours, "agree": agree}


# The local engine models publish their counters from a flusher thread (spec_metrics.py FLUSH_S = 0.05 s
# after the step); a real server's iteration stats lag too, and a loaded host delays both. Read the page
# again until it agrees, this long (the wait costs nothing when the counters already agree).
SETTLE_S = 5.0
# Before a run: the counters are quiet when two reads this far apart are equal (several flush periods).
QUIET_S = 0.3


def quiet_scrape(url: str, model: str = TARGET_MODEL) -> SpecCounters:
    """The counters once the server has stopped publishing earlier work (the last steps of a cancelled or
    just-finished request land after its response): re-read every QUIET_S until two reads are equal, for
    up to SETTLE_S; then the last read."""
    deadline = time.monotonic() + SETTLE_S
    last = scrape(url, model)
    while time.monotonic() < deadline:
        time.sleep(QUIET_S)
        now = scrape(url, model)
        if now == last:
            return now
        last = now
    return last


def settled_check(url: str, before: SpecCounters, *, drafted: int, accepted: int, steps: int | None) -> dict:
    """cross_check of the counters scraped after a run against `before`, re-read every 0.1 s for up to
    SETTLE_S while they do not agree yet (the server may still be publishing the run's last steps)."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        check = cross_check(scrape(url).minus(before), drafted=drafted, accepted=accepted, steps=steps)
        if check["agree"] or time.monotonic() >= deadline:
            return check
        time.sleep(0.1)
