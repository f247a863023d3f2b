"""What every speculation method answers, so that no stage compares method names.

A `SpeculationMethod` is a small frozen object: which spec section it needs, which engines a build
has (`roles`, each with TensorRT-LLM's `speculative_decoding_mode` and `max_draft_len`), who drives
the draft -> verify loop when serving (the Triton BLS with a named drafter, or the engine itself),
how the reference engine speculates in-process, what `tune` tunes and how the benchmarks baseline it.

A method is also the one home of what is true of it elsewhere: its spec section (`section_type`, the
integer ranges of its keys, which key names a model folder), how the LLM API writes it (`llmapi`, a
`Decoding`; the class per TensorRT-LLM release is a fact of core/facts/llmapi.py), its vLLM `method` and
SGLang `--speculative-algorithm` names (None: refused; the reason is the facts module's), its ecosystem
(profile) name and what `tune` edits (`tunes`).

Drafter code lives in the stages (engines/reference, the BLS model); a method only *names* it as
"module:attribute", resolved by the stage that runs it (`resolve_name`).
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from specbuild.core.errors import SpecError
from specbuild.core.facts.llmapi import Decoding
from specbuild.core.facts.trtllm import SpeculativeDecodingMode

if TYPE_CHECKING:
    from specbuild.core.methods.medusa import MedusaSection
    from specbuild.core.spec import BuildSpec

# (lowest, highest, example fix) of an integer key of a section: every integer of a spec has a range.
Ranges = dict[str, tuple[int, int, str]]


@dataclass(frozen=True)
class ModelSection:
    """A model the runtime loads as an engine of its own: the target, or draft/target's draft."""

    model: str  # local folder (relative to the spec file) or hub id
    tp_size: int = 1  # tensor-parallel ranks (GPUs one copy of the weights is split over)
    pp_size: int = 1  # pipeline-parallel stages

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size


MODEL_RANGES: Ranges = {"tp_size": (1, 512, "1"), "pp_size": (1, 512, "1")}


class Tunable(Enum):
    """What `specbuild tune` chooses, as the spec keys (section, key) `tune --write` edits."""

    DRAFT_LEN = (("speculation", "max_draft_len"),)  # K, draft tokens per round
    TREE = (("medusa", "choices"),)  # the token tree
    NGRAM = (("speculation", "max_draft_len"), ("ngram", "max_matching_ngram_size"))  # K and N

    @property
    def keys(self) -> tuple[tuple[str, str], ...]:
        return self.value

    def setting_of(self, spec: BuildSpec) -> Any:
        """What the spec has of what `tune` chooses, as a tune report's setting value spells it (None for
        K alone: a report's K needs no matching)."""
        if self is Tunable.TREE:
            return spec.medusa_choices().to_lists()
        if len(self.keys) > 1:
            return {f"{section}.{key}": getattr(getattr(spec, section), key) for section, key in self.keys}
        return None

    def assignments(self, chosen: Any) -> list[tuple[str, str, Any]]:
        """(section, key, value) edits for a tuner's chosen value: the value itself for one key, else a
        mapping "section.key" -> value."""
        if len(self.keys) == 1:
            return [(*self.keys[0], chosen)]
        return [(section, key, chosen[f"{section}.{key}"]) for section, key in self.keys]


@dataclass(frozen=True)
class EngineRole:
    """One engine of a build: `<role>/checkpoint` and `<role>/engine` in the build folder."""

    role: str  # "target" | "draft": also the spec section that names its checkpoint
    mode: SpeculativeDecodingMode  # trtllm-build --speculative_decoding_mode (NONE: an ordinary engine)
    max_draft_len: int  # trtllm-build --max_draft_len (0 for NONE)
    gather_generation_logits: bool = False  # draft logits travel to the target (lossless T > 0)
    heads: MedusaSection | None = None  # Medusa heads converted into this engine's checkpoint


@dataclass(frozen=True)
class SpeculationMethod:
    """The answers one method gives every stage. Subclasses override the spec-dependent ones."""

    name: str  # the spec's `mode:` value (a Method)
    title: str  # for messages
    section: str | None  # the spec section this method needs; other methods' sections must be absent
    section_example: str  # how that section looks, for the "add it" fix
    target_mode: SpeculativeDecodingMode  # the target engine's speculative_decoding_mode
    draft_model: bool  # a separate draft engine (role "draft") next to the target
    bls_drafter: str | None  # "bls_core:Class" the BLS drafts with; None: the engine speculates itself
    reference_decoder: str | None  # "module:factory" of the in-process speculator; None: not runnable
    tunes: Tunable
    tuner: str  # "module:function" of `specbuild tune`
    default_k: int = 0  # draft tokens per round when neither a spec nor a caller says (0: not per round)
    # the method's name in the ecosystem's records (ModelOpt's speculation_profile.json `method`, vLLM's
    # `method`); None: the same as `name`. It decides the profile's accept_length_model (chain methods).
    profile_name: str | None = None

    @property
    def ecosystem_name(self) -> str:
        return self.profile_name or self.name

    section_type: type | None = None  # the dataclass of `section` (BuildSpec has a field of this type)
    ranges: Ranges = field(default_factory=dict)  # integer keys of `section` -> (low, high, example)
    section_required: bool = True  # False: a spec may leave the section out (the loader fills its defaults)
    # the key of `section` naming a folder the runtime loads besides the target (the draft model, the
    # Medusa heads, the EAGLE-3 draft), and what messages call it; None: the method loads no other folder
    model_key: str | None = None
    model_label: str = ""
    # every round drafts min(K, tokens left - 1) (a client can rebuild the rounds); False: 0..K (n-gram)
    drafts_every_round: bool = True
    # how the LLM API's speculative_config writes this method (None: no LLM-API path); its config class per
    # release is core/facts/llmapi.py's `LlmApiRelease.methods`
    llmapi: Decoding | None = None
    # the method's name in other engines: vLLM's --speculative-config `method`, SGLang's
    # --speculative-algorithm (None: that engine cannot run it; core/facts/vllm.py VLLM_REFUSED,
    # core/facts/sglang.py SGLANG_REFUSED say why)
    vllm_method: str | None = None
    sglang_algorithm: str | None = None

    # ---- spec ---------------------------------------------------------------------------------
    def default_max_draft_len(self, spec: BuildSpec) -> int:
        """speculation.max_draft_len when the spec leaves it out."""
        return self.default_k

    def validate(self, spec: BuildSpec, where: str, *, validate_tree: bool = True) -> None:
        """Method-specific value checks (sections are checked by the spec loader); raise SpecError."""

    def section_of(self, spec: BuildSpec) -> Any:
        """The spec's section of this method (None: the method has none)."""
        return getattr(spec, self.section) if self.section else None

    def options_of(self, spec: BuildSpec) -> dict[str, Any] | None:
        """The spec's section of this method as a plain dict (what its drafters are configured with)."""
        section = self.section_of(spec)
        return dataclasses.asdict(section) if section is not None else None

    def extra_models(self, spec: BuildSpec) -> dict[str, str]:
        """The folders besides the target's that serving this spec loads: label -> the spec's reference
        (a folder relative to the spec file, or a hub id). The target is every method's input."""
        section = self.section_of(spec) if self.model_key else None
        return {self.model_label: getattr(section, self.model_key)} if section is not None else {}

    def capture_layers(self, spec: BuildSpec) -> list[int] | None:
        """The target layers whose hidden states feed a one-model draft, as the spec names them (None:
        the runtime's default, or a method that captures none)."""
        return None

    def speculative_model(self, spec: BuildSpec) -> str | None:
        """The spec's reference of the folder the LLM API loads as `speculative_model` (None: none)."""
        if self.llmapi is None or self.llmapi.model_section is None:
            return None
        return next(iter(self.extra_models(spec).values()), None)

    def one_model_draft(self, spec: BuildSpec) -> str | None:
        """The spec's reference of a draft that runs inside the target's model (EAGLE-3's layers read the
        target's hidden states): the speculative model when it is not an engine of its own."""
        return None if self.draft_model else self.speculative_model(spec)

    def draft_engine(self, spec: BuildSpec) -> ModelSection | None:
        """The section of the separate draft engine (role "draft"; None: the method has none)."""
        return self.section_of(spec) if self.draft_model else None

    def bls_parameters(self, spec: BuildSpec) -> dict[str, str]:
        """Extra string parameters of the BLS model its drafter reads (`bls_drafter`'s `configure`)."""
        return {}

    # ---- other engines (deploy/vllm.py, deploy/sglang.py ask; names: vllm_method, sglang_algorithm) ---
    def vllm_section_config(self, spec: BuildSpec) -> dict[str, Any]:
        """vLLM --speculative-config keys for this method's section (besides method, K and the model)."""
        return {}

    def vllm_unmapped(self, spec: BuildSpec) -> list[str]:
        """This method's section settings with no vLLM equivalent, as set in the spec."""
        return []

    def sglang_unmapped(self, spec: BuildSpec) -> list[str]:
        """This method's section settings with no SGLang equivalent, as set in the spec."""
        return []

    # ---- engines ------------------------------------------------------------------------------
    def roles(self, spec: BuildSpec) -> tuple[EngineRole, ...]:
        """The engines a build of `spec` has, target first."""
        gather = spec.speculation.use_logits and self.draft_model
        target = EngineRole(
            "target", self.target_mode, spec.speculation.max_draft_len, gather, self.heads_of(spec)
        )
        if not self.draft_model:
            return (target,)
        return (target, EngineRole("draft", SpeculativeDecodingMode.NONE, 0, gather))

    # ---- the method x flow x version matrix (core/methods/matrix.py) ------------------------------
    def engine_refusal(self) -> tuple[str, str] | None:
        """(reason, nearest alternative) when the engine flow cannot run this method; None: it can."""
        return None

    def llmapi_refusal(self, version: str) -> tuple[str, str] | None:
        """(reason, nearest alternative) when the LLM API of `version` cannot run this method; None: ask
        the release's facts (its config class for the method)."""
        return None

    def heads_of(self, spec: BuildSpec) -> MedusaSection | None:
        """Heads converted into the target's checkpoint (None: plain target weights)."""
        return None

    # ---- serving and benchmarks --------------------------------------------------------------
    @property
    def bls_drives_loop(self) -> bool:
        """The BLS runs draft -> verify rounds against the target (K per request, a target-alone
        baseline with num_draft_tokens 0); otherwise the engine speculates inside one call."""
        return self.bls_drafter is not None

    @property
    def has_baseline(self) -> bool:
        """Whether a repository can run the target alone (the benchmarks' baseline)."""
        return self.bls_drives_loop


def resolve_name(name: str) -> Any:
    """ "package.module:attribute" -> the attribute (used by the stage that runs a method's code)."""
    module, _, attr = name.partition(":")
    return getattr(importlib.import_module(module), attr)


def require(condition: bool, where: str, key: str, expected: str, found: Any, fix: str) -> None:
    if not condition:
        raise SpecError(f"{where}: impossible value for {key}", expected=expected, found=repr(found), fix=fix)
