"""Validate LLM-API options with the installed TensorRT-LLM's own parser, before any weight loads.

What trtllm-serve does with `--config FILE` (core/facts/llmapi.py `Parser`, per release): it merges the
file into its CLI arguments with `update_llm_args_with_extra_dict` (1.2.1 converts `speculative_config`
there through `DecodingBaseConfig.from_dict`; 1.4 leaves it to the args class's discriminated union),
then constructs the args class (`TorchLlmArgs`) from the result. `validate` runs exactly those two
calls of the installed package and nothing after them (no executor, no weights). Each top-level key
first goes through the parser alone, so an error the parser raises (`Invalid decoding type: Eagle3`)
is named by its key; the args class's pydantic errors carry their own locations. The error text is
upstream's, verbatim.

This file is self-contained (standard library only; PyYAML when run as a script) because it is copied
as is next to every LLM-API launch specbuild writes (`serve.sh`, the Triton LLM-API repository, Dynamo's
worker ConfigMap): the containers have TensorRT-LLM but no specbuild. As a script:

    python3 specbuild_preflight.py --options FILE --version V --parser MOD:FN --args MOD:CLS
                                   [--model M] [--drop KEY ...]

exit 0: the installed release accepts the file; 2: refused (the key, upstream's error and the installed
version on stderr), or another TensorRT-LLM is installed than the options were written for; 3:
tensorrt_llm cannot be imported. The builder imports the same functions (builder/llmapi.py).
"""

from __future__ import annotations

import argparse
import copy
import importlib
import sys

MAX_OPTIONS_BYTES = 1 << 20  # an options file is a few kB; refuse to read more than 1 MiB
EXIT_REFUSED = 2
EXIT_NO_TRTLLM = 3


class Refusal(Exception):
    """The installed parser refused the options: `key` (dotted path) and its error verbatim."""

    def __init__(self, key: str, error: str) -> None:
        super().__init__(f"{key}: {error}")
        self.key = key
        self.error = error


def installed_version() -> str | None:
    """tensorrt_llm.__version__, or None when the package cannot be imported here."""
    try:
        module = importlib.import_module("tensorrt_llm")
    except ImportError:
        return None
    return str(getattr(module, "__version__", "unknown"))


def resolve(ref: str):
    """'package.module:name' -> the object."""
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def validate(options: dict, *, model: str, parser: str, args_class: str) -> None:
    """Raise Refusal when the installed `parser` + `args_class` refuse `options` (a trtllm-serve --config)."""
    merge, cls = resolve(parser), resolve(args_class)
    base = {"model": model, "backend": "pytorch"}
    for key, value in options.items():
        try:
            merge(dict(base), {key: copy.deepcopy(value)})
        except Exception as exc:  # noqa: BLE001 - upstream's own error, reported verbatim
            raise Refusal(_where(key, exc), _text(exc)) from None
    try:
        cls(**merge(dict(base), copy.deepcopy(options)))
    except Exception as exc:  # noqa: BLE001 - upstream's own error, reported verbatim
        raise Refusal(_where(None, exc), _text(exc)) from None


def _where(stage: str | None, exc: Exception) -> str:
    """The dotted key(s) of an error: pydantic's locations under the stage's key, else the stage."""
    errors = getattr(exc, "errors", None)
    paths: list[str] = []
    if callable(errors):
        try:
            for err in errors():
                loc = [str(p) for p in err.get("loc", ())]
                if stage is not None and (not loc or loc[0] != stage):
                    loc = [stage, *loc]
                path = ".".join(loc) or "<options>"
                if path not in paths:
                    paths.append(path)
        except Exception:  # noqa: BLE001 - a foreign errors(): fall back to the stage
            paths = []
    return ", ".join(paths) or stage or "<options>"


def _text(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"


def _read(path: str) -> dict:
    import yaml  # noqa: PLC0415 - only the script reads YAML (the containers' Python has PyYAML)

    with open(path, encoding="utf-8") as f:
        text = f.read(MAX_OPTIONS_BYTES + 1)
    if len(text) > MAX_OPTIONS_BYTES:
        raise ValueError(f"{path} is larger than {MAX_OPTIONS_BYTES} bytes")
    options = yaml.safe_load(text) or {}
    if not isinstance(options, dict):
        raise ValueError(f"{path} is not a mapping")
    return options


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="specbuild's LLM-API preflight (see the file's docstring)")
    ap.add_argument("--options", required=True)
    ap.add_argument("--version", required=True, help="the TensorRT-LLM the options were written for")
    ap.add_argument("--parser", required=True)
    ap.add_argument("--args", required=True)
    ap.add_argument("--model", default=None)
    ap.add_argument("--drop", action="append", default=[])
    a = ap.parse_args(argv)
    say = "specbuild preflight:"
    installed = installed_version()
    if installed is None:
        print(
            f"{say} tensorrt_llm cannot be imported here; run this inside the TensorRT-LLM {a.version} "
            "container",
            file=sys.stderr,
        )
        return EXIT_NO_TRTLLM
    if installed != a.version:
        print(
            f"{say} the options in {a.options} were written for TensorRT-LLM {a.version}, this container "
            f"has {installed}\n  expected: tensorrt_llm {a.version}\n  found: tensorrt_llm {installed}\n"
            f"  fix: run the image of TensorRT-LLM {a.version}, or regenerate with trtllm_version: "
            f'"{installed}" if specbuild supports it',
            file=sys.stderr,
        )
        return EXIT_REFUSED
    try:
        options = _read(a.options)
    except Exception as exc:  # noqa: BLE001 - an unreadable file: say what, stop
        print(f"{say} {a.options}: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    try:
        for key in a.drop:
            options.pop(key, None)
        model = str(options.pop("model", None) or a.model or "")
        validate(options, model=model, parser=a.parser, args_class=a.args)
    except Refusal as r:
        print(
            f"{say} TensorRT-LLM {installed} refuses {r.key} in {a.options}: {r.error}\n"
            f"  fix: the options were written for {a.version} by specbuild; report it, or edit {r.key} "
            "by hand",
            file=sys.stderr,
        )
        return EXIT_REFUSED
    print(f"{say} TensorRT-LLM {installed} accepts {a.options}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
