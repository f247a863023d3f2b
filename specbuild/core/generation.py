"""What a generation returns, in-process or through Triton: one JSON shape for both.

Torch-free (the client imports it). `GenerationResult.to_json()` is the object that
`specbuild generate --json` prints for `--engine` and for `--url` alike.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class SpecStats:
    """Speculative-decoding counters of one request (all zero when speculation is off)."""

    drafted: int = (
        0  # draft tokens proposed (draft/target: K per round; Medusa: tree nodes offered on the best path)
    )
    accepted: int = 0  # draft tokens the target accepted
    target_passes: int = 0  # forward passes of the target (prefill included)
    draft_passes: int = 0  # forward passes of the draft model (Medusa: 0)
    accepted_per_step: list[int] = field(default_factory=list)  # accepted drafts in each verification step
    drafted_per_step: list[int] = field(default_factory=list)  # drafts offered in each step (when known)
    accepted_per_position: list[int] = field(default_factory=list)  # [k]: times draft position k was accepted
    drafted_per_position: list[int] = field(default_factory=list)  # [k]: times draft position k was proposed
    # Load-aware K (core/perf/schedule.py): the K each round drafted (0: a plain target step), and whether the
    # acceptance guard stopped this request's drafting.
    k_per_round: list[int] = field(default_factory=list)
    guard_stopped: bool = False

    @property
    def acceptance_rate(self) -> float:
        """accepted / drafted (the TensorRT-LLM backend's `acceptance_rate`)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def steps(self) -> list[tuple[int, int]]:
        """(accepted, drafted) of each verification step, when the drafts per step are known."""
        if len(self.drafted_per_step) != len(self.accepted_per_step):
            return []
        return list(zip(self.accepted_per_step, self.drafted_per_step, strict=True))

    @property
    def mean_accepted_per_step(self) -> float:
        """Tokens produced per verification pass: accepted drafts + the one the target adds."""
        steps = len(self.accepted_per_step)
        return (self.accepted + steps) / steps if steps else 0.0

    def record_step(self, n_accepted: int, n_drafted: int) -> None:
        self.accepted_per_step.append(n_accepted)
        self.drafted_per_step.append(n_drafted)
        self.accepted += n_accepted
        self.drafted += n_drafted
        for pos in range(n_drafted):
            if pos >= len(self.drafted_per_position):
                self.drafted_per_position.append(0)
                self.accepted_per_position.append(0)
            self.drafted_per_position[pos] += 1
            if pos < n_accepted:
                self.accepted_per_position[pos] += 1

    def merge(self, other: SpecStats) -> None:
        self.drafted += other.drafted
        self.accepted += other.accepted
        self.target_passes += other.target_passes
        self.draft_passes += other.draft_passes
        self.accepted_per_step += other.accepted_per_step
        self.k_per_round += other.k_per_round
        self.guard_stopped = self.guard_stopped or other.guard_stopped
        self.drafted_per_step += other.drafted_per_step
        for name in ("accepted_per_position", "drafted_per_position"):
            mine, theirs = getattr(self, name), getattr(other, name)
            mine.extend([0] * (len(theirs) - len(mine)))
            for i, v in enumerate(theirs):
                mine[i] += v

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["acceptance_rate"] = self.acceptance_rate
        d["mean_accepted_per_step"] = self.mean_accepted_per_step
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SpecStats:
        names = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass
class GenerationResult:
    """One request's continuation (prompt excluded) and how it was produced."""

    text: str
    token_ids: list[int]
    finish_reason: str = "length"  # length | stop (end id / stop token)
    speculative: bool = False
    stats: SpecStats = field(default_factory=SpecStats)
    timings: dict[str, float] = field(default_factory=dict)  # seconds: ttft, total, ...
    prompt_tokens: int | None = None  # the prompt's token count (through Triton: num_input_tokens)
    # prompt tokens whose KV came from the engine's prefix cache (in-process plain decode; None: not known)
    cached_prompt_tokens: int | None = None
    # through Triton with return_perf_metrics: the backend's kv_cache_* figures (and the BLS's draft_ ones)
    kv_cache: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "token_ids": list(self.token_ids),
            "prompt_tokens": self.prompt_tokens,
            "finish_reason": self.finish_reason,
            "speculative": self.speculative,
            "stats": self.stats.to_dict(),
            "timings": dict(self.timings),
            "kv_cache": dict(self.kv_cache),
        }
