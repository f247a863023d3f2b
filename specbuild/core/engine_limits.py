"""The request limits of one engine, read from its config.json `build_config`, as the TensorRT-LLM
1.2 runtime applies them. One home for: the runtime prompt limit, the backend's refusals, the
clamping of the output length, and the user-facing `prompt + max_tokens` bound the BLS and the
client check.

What the runtime does (TensorRT-LLM `cpp/include/tensorrt_llm/batch_manager/llmRequest.h`,
`GenericLlmRequest::validate`, read at NVIDIA/TensorRT-LLM, stored version of that file):
* prompt longer than the runtime's max input length -> the request fails with
  "Prompt length (P) exceeds maximum input length (M)."
* more external draft tokens than the engine's max_draft_len -> the request fails with
  "Draft tokens length (D) exceeds maximum draft tokens length (K)."
* prompt + requested output + draft tokens per step > max_seq_len -> the output length is lowered to
  fit, with a warning (not an error).
The runtime's max input length: with remove_input_padding and context FMHA (always on in specbuild
builds) trtllm-build's max_input_len is not the limit; it is min(max_seq_len - 1, max_num_tokens),
or max_seq_len - 1 with chunked context (the executor's enable_chunked_context).

Pure Python, no specbuild imports: the production BLS vendors this module (model_repo/generate.py).
"""

from __future__ import annotations

from dataclasses import dataclass

INT32_MAX = 2**31 - 1  # the wire type of max_tokens / request_output_len / num_draft_tokens


class LimitError(ValueError):
    """A request over an engine limit (ValueError: the Python models turn it into the request's error)."""


@dataclass(frozen=True)
class EngineLimits:
    """What one engine accepts per request (token counts)."""

    max_seq_len: (
        int  # prompt + output + draft tokens of one step (the engine's value: speculative K included)
    )
    max_input_len: int  # prompt tokens the runtime accepts
    max_draft_len: int = 0  # draft tokens per step (0: not speculative)

    @classmethod
    def from_build_config(cls, build: dict, *, enable_chunked_context: bool | None = None) -> EngineLimits:
        """From an engine's `build_config` (trtllm-build's BuildConfig.to_dict(), or specbuild's record)."""
        max_seq_len = int(build["max_seq_len"])
        plugin = build.get("plugin_config") or {}
        chunked = (
            bool(build.get("enable_chunked_context", False))
            if enable_chunked_context is None
            else enable_chunked_context
        )
        packed = bool(plugin.get("remove_input_padding", True)) and bool(plugin.get("context_fmha", True))
        if chunked:
            max_input = max_seq_len - 1
        elif packed:
            max_num_tokens = build.get("max_num_tokens")
            max_input = min(max_seq_len - 1, int(max_num_tokens)) if max_num_tokens else max_seq_len - 1
        else:  # padded inputs: trtllm-build's max_input_len is the engine's shape limit
            max_input = min(int(build.get("max_input_len") or max_seq_len - 1), max_seq_len - 1)
        return cls(
            max_seq_len=max_seq_len,
            max_input_len=max(1, max_input),
            max_draft_len=int(build.get("max_draft_len") or 0),
        )

    @classmethod
    def from_positions(cls, max_position_embeddings: int) -> EngineLimits:
        """A bare checkpoint (no build_config): the model's positions bound the sequence."""
        return cls(
            max_seq_len=int(max_position_embeddings), max_input_len=max(1, int(max_position_embeddings) - 1)
        )

    # ---- what the backend does -------------------------------------------------------------------
    def check_prompt(self, prompt_len: int) -> None:
        if prompt_len > self.max_input_len:
            raise LimitError(
                f"Prompt length ({prompt_len}) exceeds maximum input length ({self.max_input_len})."
            )

    def check_draft(self, draft_len: int) -> None:
        if draft_len > self.max_draft_len:
            raise LimitError(
                f"Draft tokens length ({draft_len}) exceeds maximum draft tokens length "
                f"({self.max_draft_len})."
            )

    def output_len(self, prompt_len: int, requested: int, draft_per_step: int = 0) -> int:
        """The output length the runtime will produce: requested, lowered so the sequence fits max_seq_len."""
        return max(0, min(int(requested), self.max_seq_len - prompt_len - draft_per_step))

    def request_limits(self, *, growing_prefix: bool = False) -> RequestLimits:
        """What a whole request must meet: prompt + max_tokens fits with one step's drafts (the spec's
        max_seq_len). growing_prefix: the BLS loop sends prompt + accepted tokens as the next call's
        prompt, so that prefix (up to prompt + max_tokens - 1 tokens) must pass the prompt limit too."""
        total = self.max_seq_len - self.max_draft_len
        if growing_prefix:
            total = min(total, self.max_input_len + 1)
        return RequestLimits(max_input_len=self.max_input_len, max_total_len=total)


@dataclass(frozen=True)
class RequestLimits:
    """The user-facing bounds (BLS, client): prompt tokens, and prompt + max_tokens."""

    max_input_len: int
    max_total_len: int

    def check(self, prompt_len: int, max_tokens: int) -> None:
        """Refuse what would not run whole (the engines would fail or cut it short mid-request)."""
        if prompt_len > self.max_input_len:
            raise LimitError(
                f"Prompt length ({prompt_len}) exceeds maximum input length ({self.max_input_len})."
            )
        if prompt_len + max_tokens > self.max_total_len:
            raise LimitError(
                f"prompt ({prompt_len} tokens) + max_tokens ({max_tokens}) exceeds the engine's sequence "
                "limit "
                f"({self.max_total_len} tokens); ask for at most {max(self.max_total_len - prompt_len, 0)} "
                "tokens"
            )

    @staticmethod
    def tightest(*limits: RequestLimits) -> RequestLimits:
        """A request through several engines (draft and target) must meet each one."""
        return RequestLimits(
            max_input_len=min(x.max_input_len for x in limits),
            max_total_len=min(x.max_total_len for x in limits),
        )
