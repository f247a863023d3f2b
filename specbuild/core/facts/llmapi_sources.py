"""Where each upstream fact of the LLM-API flow was read, and whether that pins the release.

`Fact` is one source record: the repository (or documentation site), the path, the commit / release /
code-index id it was read at, and a status: "verified" (read at the release itself) or "inferred" (read
at another revision or in a copy, the release could not be read). `core/facts/llmapi.py` attaches one to
every config class, parser, schedule rule and image it records; `specbuild doctor --facts` prints them.

How the releases were pinned:
* 1.2.1: triton-inference-server/tensorrtllm_backend's release branches record the TensorRT-LLM they
  build as the `tensorrt_llm` submodule (r26.05, r26.06, r26.07: ca88df0a400515b8206a19eb30cd047eb7661035;
  r26.04: 2fdb9e66302b15db9a9b5e71d3ac45d5921ea45d; the submodule URL is the triton-inference-server fork)
  and their Dockerfile builds TENSORRTLLM_VER=1.2.1 from the NVIDIA tag release/1.2.1. The code index
  holds no TensorRT-LLM file at either commit or at the tag, and the PyPI package is a stub that
  downloads from an index this project cannot reach: every 1.2.1 class fact is therefore inferred,
  from the closest copies found (named below).
* 1.4.0rc4: the Sphinx API reference of 1.4.0rc4 (signatures: field names, types, Literal
  discriminators) is the release's own; the parser function was read on main after it.

Torch-free, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

VERIFIED = "verified"
INFERRED = "inferred"


@dataclass(frozen=True)
class Fact:
    """One upstream source: what was read, where, at which revision, and whether it pins the release."""

    repo: str  # owner/name, or a documentation site
    path: str
    at: str  # commit, release, or code-index id (the index records no commit for some copies)
    status: str  # VERIFIED | INFERRED
    note: str = ""

    def __post_init__(self) -> None:
        if self.status not in (VERIFIED, INFERRED):
            raise ValueError(f"Fact status {self.status!r}: {VERIFIED} | {INFERRED}")

    @property
    def inferred(self) -> bool:
        return self.status == INFERRED

    def cite(self) -> str:
        mark = "" if self.status == VERIFIED else " [INFERRED]"
        return f"{self.repo}:{self.path} @ {self.at}{mark}" + (f" ({self.note})" if self.note else "")


def wheel_fact(source: dict, files: str | list[str], note: str = "") -> Fact:
    """A fact read from a release's PyPI wheel (a facts data file's `source`: package, wheel, its sha256 and
    the RECORD hash of each file read): the wheel pins the release, so it is verified."""
    files = [files] if isinstance(files, str) else files
    return Fact(
        f"PyPI {source['package']}",
        "; ".join(f"{p} ({source['files'][p]})" for p in files),
        f"{source['wheel']} sha256 {source['wheel_sha256']}",
        VERIFIED,
        note,
    )


# ---- 1.2.1 ---------------------------------------------------------------------------------------------

PIN_1_2 = Fact(
    "triton-inference-server/tensorrtllm_backend",
    "tensorrt_llm (submodule), dockerfile/Dockerfile.triton.trt_llm_backend",
    "r26.05-r26.07 ca88df0a400515b8206a19eb30cd047eb7661035; r26.04 2fdb9e66302b15db9a9b5e71d3ac45d5921ea45d",
    VERIFIED,
    "the Triton 26.04-26.07 containers build TENSORRTLLM_VER=1.2.1 (tag release/1.2.1); no file of "
    "TensorRT-LLM at these commits is readable here",
)
REGISTRY_1_2 = Fact(
    "NVIDIA/TensorRT-LLM",
    "tensorrt_llm/llmapi/llm_args.py",
    "code-index id 1090804222 (no commit recorded)",
    INFERRED,
    "the from_dict era: DecodingBaseConfig.from_dict registry MTP, Medusa, Eagle, Lookahead, NGram, "
    "DraftTarget, SaveState, UserProvided, AUTO; decoding_type a ClassVar (DraftTarget's is "
    "'Draft_Target', so the spelling that parses differs from the ClassVar); unknown types raise "
    "ValueError('Invalid decoding type: ...'); StrictBaseModel extra='forbid'. Older than 1.2.1 "
    "(no draft_len_schedule, no speculative_model alias)",
)
TRANSCRIPT_1_2 = Fact(
    "third-party schema transcripts labelled 'tensorrt library, version 1.2.1'",
    "llm_args.py chunks DecodingBaseConfig + Eagle/NGram/MTP, BaseLlmArgs",
    "code-index ids 59958270572, 59783186067",
    INFERRED,
    "quote the 1.2.1 source: speculative_model with AliasChoices('speculative_model', "
    "'speculative_model_dir'); max_concurrency Optional[int]; draft_len_schedule 'batch_size >= key', "
    "key 1 required and == max_draft_len; acceptance_window / acceptance_length_threshold; "
    "EagleDecodingConfig.eagle3_one_model default True; BaseLlmArgs max_num_tokens 8192",
)
SERVE_1_2 = Fact(
    "NVIDIA/TensorRT-LLM",
    "tensorrt_llm/commands/serve.py",
    "code-index id 4219957788 (1.2 era, no commit recorded)",
    INFERRED,
    "imports update_llm_args_with_extra_dict from tensorrt_llm.llmapi.llm_utils; the pytorch backend "
    "constructs LLM(**llm_args) (TorchLlmArgs); flags --tp_size/--pp_size/--kv_cache_free_gpu_memory_fraction"
    "/--config",
)
EAGLE_1_2 = Fact(
    "build.nvidia.com",
    "spark/speculative-decoding/instructions",
    "nvcr.io/nvidia/tensorrt-llm/release:1.2.0rc6",
    INFERRED,
    "an EAGLE-3 draft served on the 1.2 line with decoding_type: Eagle",
)

# ---- 1.4.0rc4 ------------------------------------------------------------------------------------------

DOCS_1_4 = Fact(
    "nvidia.github.io/TensorRT-LLM",
    "1.4.0rc4/llm-api/reference/{TorchLlmArgs,KvCacheConfig,NGramDecodingConfig,Eagle3DecodingConfig,"
    "MTPDecodingConfig}.html",
    "1.4.0rc4",
    VERIFIED,
    "Sphinx signatures: decoding_type is a Literal field (Eagle3, Draft_Target, NGram); no eagle3_one_model, "
    "eagle_choices, num_eagle_layers; spec_dec_variant new; kill switch acceptance_rate_window_size / "
    "acceptance_rate_threshold",
)
MAIN_1_4 = Fact(
    "NVIDIA/TensorRT-LLM",
    "tensorrt_llm/llmapi/llm_args.py",
    "0004396720054fd8e205cbf616f21f0b57c6b412 (main, Aug-Sep 2026)",
    INFERRED,
    "update_llm_args_with_extra_dict builds kv_cache_config etc. but passes speculative_config as a dict: "
    "TorchLlmArgs validates it as a union discriminated by decoding_type; read on main, not the rc4 tag",
)
LITERAL_UNION = Fact(
    "NVIDIA/TensorRT-LLM",
    "tensorrt_llm/llmapi/llm_args.py",
    "code-index id 7019226376 (main after the release/1.2 branch point)",
    INFERRED,
    "SpeculativeConfig = Annotated[Union[DraftTarget (Literal 'Draft_Target'), Eagle ('Eagle'), "
    "Eagle3 ('Eagle3'), NGram, ...], Field(discriminator='decoding_type')]",
)

SERVE_1_4 = Fact(
    "NVIDIA/TensorRT-LLM",
    "tensorrt_llm/commands/serve.py add_serve_options",
    "code-index id 59679953799 (newer than 1.2, no commit recorded)",
    INFERRED,
    "keeps --tp_size/--pp_size/--kv_cache_free_gpu_memory_fraction/--config",
)

# ---- the field moved (landscape-2026-q4) ---------------------------------------------------------------

FLOOR = Fact(
    "NVIDIA/TensorRT-LLM",
    "unit test 'Draft lengths resolved from draft_len_schedule are floored at min_runtime_draft_len' "
    "(PRs 16888, 19204 merged 2026-09-15)",
    "code-index id 69637569920 (path not returned)",
    INFERRED,
    "min_runtime_draft_len: Draft_Target 1, PARD 1, dynamic tree 1, SA 1; Eagle3/MTP one-model 0 with the "
    "drafter kept warm; NGram 0. The first release with the floor is not pinned (after 1.3.0rc2x): "
    "1.4.0rc4 is taken to have it",
)
COLLAPSE = Fact(
    "NVIDIA/TensorRT-LLM",
    "PR 16888 (2026-07-27)",
    "before the min_runtime_draft_len fix",
    INFERRED,
    "a schedule that resolves to K=0 skips the drafter: its state goes stale and acceptance silently "
    "collapses for the rest of every affected request once the batch shrinks (not NGram: no drafter "
    "state); 1.2.1 predates the fix",
)
TWO_MODEL = Fact(
    "NVIDIA/TensorRT-LLM",
    "PRs 17366 (2026-08-06), 18721 (2026-09-04)",
    "main after 2026-09-04",
    INFERRED,
    "two-model speculation removed: eagle3_one_model=False / mtp_eagle_one_model=False raise. Releases "
    "with two-model: 1.2.x (draft/target is two-model there; Eagle two-model with eagle3_one_model: "
    "false) and the 1.3.0rc line before 2026-09-04; 1.4.0rc4: none",
)

# ---- images ----------------------------------------------------------------------------------------------

RELEASE_IMAGES = Fact(
    "nvidia.github.io/TensorRT-LLM",
    "installation/containers.html",
    "nvcr.io/nvidia/tensorrt-llm/release:<version>",
    INFERRED,
    "the tag is the TensorRT-LLM version",
)
DYNAMO_MATRIX = Fact(
    "docs.nvidia.com/dynamo",
    "v-0-9-1/getting-started/support-matrix.md; dev/backends/tensor-rt-llm (container matrix)",
    "Dynamo docs v0.9.1 and dev",
    VERIFIED,
    "the TensorRT-LLM each Dynamo release ships in its tensorrtllm-runtime image",
)
