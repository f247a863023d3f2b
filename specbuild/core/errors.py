"""Typed errors. Each says what was expected, what was found and how to fix it.

They are mapped once, at the CLI edge (`specbuild.cli.common.handle_errors`), to a message and exit
code 2; a traceback is shown only with `specbuild --debug`.
"""

from __future__ import annotations


class SpecbuildError(Exception):
    """Base class: `what` went wrong; optional `expected`, `found`, `fix` complete the message."""

    def __init__(
        self,
        what: str,
        *,
        expected: str | None = None,
        found: str | None = None,
        fix: str | None = None,
    ) -> None:
        self.what = _bounded(what)
        self.expected = _bounded(expected)
        self.found = _bounded(found)
        self.fix = _bounded(fix)
        super().__init__(self.message())

    def message(self) -> str:
        lines = [self.what]
        if self.expected is not None:
            lines.append(f"  expected: {self.expected}")
        if self.found is not None:
            lines.append(f"  found:    {self.found}")
        if self.fix is not None:
            lines.append(f"  fix:      {self.fix}")
        return "\n".join(lines)


MAX_FIELD = 8000  # characters per field: a message never grows with the input that caused it


def _bounded(text):
    if text is None or len(text) <= MAX_FIELD:
        return text
    return f"{text[:MAX_FIELD]}... ({len(text)} characters)"


class SpecError(SpecbuildError):
    """A build spec (YAML) is malformed: unknown key, wrong type, impossible value."""


class ModelNotFoundError(SpecbuildError):
    """A model folder or hub id could not be resolved locally."""


class CheckpointError(SpecbuildError):
    """A checkpoint is unreadable, truncated, or has missing / extra / mis-shaped tensors."""


class ConversionError(SpecbuildError):
    """HF -> TensorRT-LLM conversion cannot proceed (unsupported layout, bad TP/PP, ...)."""


class BuildError(SpecbuildError):
    """An engine build (trtllm-build or reference) failed or cannot be planned."""


class OutputExistsError(SpecbuildError):
    """An output folder already exists and --force was not given."""


class EngineError(SpecbuildError):
    """The reference engine cannot load or run a model."""


class RepoError(SpecbuildError):
    """A Triton model repository cannot be generated or is inconsistent."""


class ServerError(SpecbuildError):
    """The Triton server cannot be started, is down, or answered with an error."""


class ClientError(SpecbuildError):
    """A gRPC request failed (server down, wrong model, timeout)."""


class TrainingError(SpecbuildError):
    """Medusa training or tuning cannot proceed."""


class PlanError(SpecbuildError):
    """Capacity planning inputs that are missing, inconsistent or impossible."""


class DeployError(SpecbuildError):
    """A deployment the chosen engine or layout cannot run (manifests are not written)."""
