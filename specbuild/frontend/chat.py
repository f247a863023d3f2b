"""Chat prompts: the tokenizer's chat template (transformers' apply_chat_template), or one given with
`serve --chat-template FILE` (a Jinja template in the Hugging Face format, as vLLM's --chat-template).

A tokenizer without a template (the demo's) answers /v1/chat/completions with a 400 that says how to
supply one; /v1/completions works either way. The rendered text goes to the BLS as `text_input`, whose
preprocessing tokenizes it as every prompt (special tokens as the repository's tokenizer adds them).
"""

from __future__ import annotations

from pathlib import Path

from specbuild.core.formats.safe_io import read_text
from specbuild.frontend.protocol import OpenAIError


class ChatTemplate:
    """Renders messages with the tokenizer's template or an explicit one; `available` says which."""

    def __init__(self, tokenizer_dir: str | Path | None, template_file: Path | None = None):
        self.tokenizer = None
        self.template: str | None = None
        self.source = "none"
        if template_file is not None:
            self.template = read_text(template_file, kind="spec", what="chat template")
            self.source = str(template_file)
        if tokenizer_dir is not None:
            from transformers import AutoTokenizer  # noqa: PLC0415 - heavy; only a frontend with chat loads it

            self.tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))  # local folder, no remote code
            if self.template is None and getattr(self.tokenizer, "chat_template", None):
                self.template = None  # the tokenizer's own
                self.source = f"the tokenizer's ({tokenizer_dir})"

    @property
    def available(self) -> bool:
        return self.tokenizer is not None and self.source != "none"

    def render(self, messages: list[dict[str, str]]) -> str:
        if not self.available:
            raise OpenAIError(
                "this model's tokenizer has no chat template, so /v1/chat/completions cannot build a "
                "prompt; restart with `specbuild serve REPO --openai-port N --chat-template FILE` (a "
                "Hugging Face Jinja chat template), or use /v1/completions",
                param="messages",
                code="chat_template_missing",
            )
        try:
            return self.tokenizer.apply_chat_template(
                messages, chat_template=self.template, tokenize=False, add_generation_prompt=True
            )
        except Exception as exc:  # noqa: BLE001 - a template error is the request's (or the template's) error
            raise OpenAIError(
                f"the chat template failed on these messages: {exc}", param="messages"
            ) from None
