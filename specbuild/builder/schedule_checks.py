"""The load-aware schedule as the targeted runtime runs it, and the `check` row that says so.

On the LLM-API flow TensorRT-LLM applies `draft_len_schedule` itself, and releases differ
(core/facts/llmapi.py ScheduleRule): 1.4 floors the runtime K at `min_runtime_draft_len` (draft/target
runs K=1 where the schedule says 0; EAGLE-3 one-model and n-gram go to 0); 1.2.1 has no floor, and a
K=0 phase leaves a drafter's state stale, so acceptance may collapse for the rest of every affected
request (n-gram excepted: no drafter state). Both facts are inferred (llmapi_sources FLOOR, COLLAPSE).
On the engine flow specbuild's BLS applies the spec's schedule as written.
"""

from __future__ import annotations

from specbuild.builder.check_rows import PASS, WARN, CheckResult
from specbuild.builder.llmapi import runtime_schedule
from specbuild.core.facts.llmapi import release
from specbuild.core.perf.schedule import DraftSchedule, schedule_of
from specbuild.core.spec import BuildSpec


def served_schedule(spec: BuildSpec) -> DraftSchedule | None:
    """The schedule the spec's serving runtime applies: the release's floors on the LLM-API flow."""
    return runtime_schedule(spec) if spec.flow.runtime_floors_schedule else schedule_of(spec)


def schedule_row(spec: BuildSpec) -> CheckResult | None:
    """A row when the spec has a schedule: what the targeted runtime will run of it."""
    schedule = schedule_of(spec)
    if schedule is None:
        return None
    if schedule.off:
        return CheckResult("schedule", PASS, "speculation.schedule {1: 0}: the target alone at every load")
    if not spec.flow.runtime_floors_schedule:
        return CheckResult("schedule", PASS, f"the BLS applies the schedule as written: {schedule.to_text()}")
    rule, method = release(spec.trtllm_version).schedule, spec.mode.value
    runs = served_schedule(spec)
    zeros = [n for n, k in schedule.steps if k == 0]
    if runs is not None and runs != schedule:
        return CheckResult(
            "schedule",
            WARN,
            f"TensorRT-LLM {spec.trtllm_version} floors {method} at K={rule.runtime_k(method, 0)} "
            f"(min_runtime_draft_len, {rule.source.status}): the schedule {schedule.to_text()} runs as "
            f"{runs.to_text()}, and the options write what runs",
            "to stop drafting under load on this release, serve that load without speculation (another "
            "deployment), or accept the floor",
        )
    if zeros and rule.collapses(method):
        return CheckResult(
            "schedule",
            WARN,
            f"TensorRT-LLM {spec.trtllm_version} has no min_runtime_draft_len floor: after the K=0 phase "
            f"from {zeros[0]} requests in flight the drafter's state is stale and acceptance may "
            f"collapse for the rest of each affected request (TensorRT-LLM PR 16888; the fixed release is "
            f"{rule.source.status})",
            "keep K >= 1 at every load in the schedule, or target a release with the floor "
            '(trtllm_version: "1.4.0rc4")',
        )
    return CheckResult("schedule", PASS, f"TensorRT-LLM {spec.trtllm_version} runs {schedule.to_text()}")
