"""Commands of the model-repository stage: `specbuild repo BUILD_DIR --out REPO` and `specbuild repo check
REPO`.

`repo` is a group whose default command is `build`: `specbuild repo BUILD_DIR ...` is the same as
`specbuild repo build BUILD_DIR ...`. Only typer is imported here; the generator loads in the bodies.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from typer.core import TyperGroup

from specbuild.cli.common import EXIT_CHECK_FAILED, INPUT, OUT_DIR, Force, console, group, group_command


class _DefaultToBuild(TyperGroup):
    """A group that runs `build` when the first word is not one of its commands (a BUILD_DIR).

    A build folder may itself be named like a command: `specbuild repo build --out R` names no
    BUILD_DIR after `build`, so when a folder `build` exists here it is the BUILD_DIR (the usual
    `compile --out build`); `specbuild repo check` works the same way for a folder named `check`
    holding a build (a repository named `check` is checked as before).
    """

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["build", *args]
        elif args and args[0] in self.commands and not _has_positional(args[1:], self.commands[args[0]]):
            if _is_build_folder(Path(args[0])):
                args = ["build", *args]
            elif args[0] == "build" and not {"--help", "-h"} & set(args[1:]):
                raise _usage_error()(
                    "no BUILD_DIR given: `build` here is the subcommand (`specbuild repo build BUILD_DIR "
                    "--out REPO`), "
                    "and there is no build folder named `build` in the current folder",
                    ctx=ctx,
                )
        return super().parse_args(ctx, args)


def _usage_error() -> type:
    """click's UsageError as the running Typer uses it (Typer >= 0.20 vendors click as typer._click)."""
    try:
        from typer._click.exceptions import UsageError
    except ImportError:  # older Typer: plain click
        from click.exceptions import UsageError
    return UsageError


def _has_positional(rest: list[str], command) -> bool:
    """Does `rest` hold a positional argument of `command` (an option's value is not one)?"""
    valued = {
        opt
        for p in command.params
        if p.param_type_name == "option" and not getattr(p, "is_flag", False)
        for opt in p.opts
    }
    skip = False
    for token in rest:
        if skip:
            skip = False
        elif token.startswith("-"):
            skip = token in valued  # `--out R` (not `--out=R`)
        else:
            return True
    return False


def _is_build_folder(folder: Path) -> bool:
    """A folder written by `specbuild compile` (its manifest says kind "build")."""
    if not (folder / "specbuild.json").is_file():
        return False
    from specbuild.core.errors import SpecbuildError
    from specbuild.core.formats.safe_io import read_json

    try:
        return read_json(folder / "specbuild.json", kind="manifest").get("kind") == "build"
    except SpecbuildError:
        return False


repo_app = group(
    "repo",
    typer.Typer(
        cls=_DefaultToBuild,
        no_args_is_help=True,
        help=(
            "Triton model repositories: `specbuild repo BUILD_DIR --out REPO` lays one out from a "
            "`specbuild compile` folder; `specbuild repo check REPO` checks it against its engines."
        ),
    ),
)


@group_command(repo_app, "build")
def build(
    build_dir: Annotated[
        Path,
        typer.Argument(help="The folder `specbuild compile` wrote (specbuild.json kind build)."),
        INPUT("build folder"),
    ],
    out: Annotated[
        Path,
        typer.Option("--out", help="Model repository folder to write (must not exist unless --force)."),
        OUT_DIR,
    ],
    backend: Annotated[
        str | None,
        typer.Option(
            "--backend",
            help="tensorrtllm: the C++ TensorRT-LLM backend (NVIDIA tritonserver trtllm-python-py3 "
            "containers, GPU "
            "hosts only); python: Python-backend models running the reference engine on CPU, same tensors. "
            "Default: tensorrtllm when the build used --engine trtllm, else python. LLM-API builds (compile "
            "--flow llmapi): llmapi (Triton's LLM-API model, trtllm-python-py3 containers; model.py is "
            "the container's) | llmapi-local (the same tensors over the reference engine, this CPU; needs "
            "--engine reference at compile); default llmapi-local when the build has reference "
            "engines.",
        ),
    ] = None,
    trtllm_version: Annotated[
        str | None,
        typer.Option(
            "--trtllm-version",
            help="TensorRT-LLM version of the serving container (default: the spec's). Before 0.20 the "
            "inputs are "
            "min_length/random_seed, from 0.20 min_tokens/seed.",
        ),
    ] = None,
    engine_root: Annotated[
        str | None,
        typer.Option(
            "--engine-root",
            help="Where BUILD_DIR is mounted in the serving container (e.g. /engines): engine paths become "
            "ROOT/<path inside BUILD_DIR>. Default: absolute paths on this host.",
        ),
    ] = None,
    tokenizer_dir: Annotated[
        str | None,
        typer.Option(
            "--tokenizer-dir",
            help="Tokenizer folder as the server sees it (default: the build's target HF folder on this "
            "host).",
        ),
    ] = None,
    schedule: Annotated[
        str | None,
        typer.Option(
            "--schedule",
            help="Requests in flight -> K for the BLS, e.g. 1:4,3:2,6:0 (replaces the spec's "
            "speculation.schedule; off: none).",
        ),
    ] = None,
    guard: Annotated[
        str | None,
        typer.Option(
            "--guard",
            help="The BLS's acceptance guard WINDOW:MIN_ACCEPTANCE, e.g. 8:0.3 (replaces the spec's "
            "speculation.guard; off: none).",
        ),
    ] = None,
    decoupled: Annotated[
        bool | None,
        typer.Option(
            "--decoupled/--no-decoupled",
            help="The transaction policy of the model clients call (tensorrt_llm_bls; tensorrt_llm of an "
            "LLM-API repository). Decoupled: it streams over gRPC, and unary gRPC ModelInfer / HTTP infer "
            "are refused; not decoupled: one response per request on every endpoint, no streaming. "
            "Default: the spec's serving.decoupled, else true for the engine flow and false for the LLM-API "
            "flow (upstream's model.yaml).",
        ),
    ] = None,
    force: Force = False,
) -> None:
    """Lay out ensemble, preprocessing, postprocessing, tensorrt_llm, tensorrt_llm_draft (draft/target) and
    tensorrt_llm_bls, each with config.pbtxt and 1/, from a `specbuild compile` folder.

    Production repositories (--backend tensorrtllm) serve TensorRT-LLM engines in the NVIDIA Triton
    TensorRT-LLM container and need a GPU host; --backend python repositories serve the reference engine on
    any CPU with the bundled tritonserver. `specbuild repo BUILD_DIR` is short for `specbuild repo build
    BUILD_DIR`."""
    from specbuild.model_repo.generate import generate_repo

    path = generate_repo(
        build_dir,
        out,
        backend=backend,
        trtllm_version=trtllm_version,
        force=force,
        engine_root=engine_root,
        tokenizer_dir=tokenizer_dir,
        schedule=schedule,
        guard=guard,
        decoupled=decoupled,
    )
    console().print(f"wrote {path}")
    console().print(entry_policy(path))


def entry_policy(repo: Path) -> str:
    """What the written repository's entry model serves (its transaction policy, from its manifest)."""
    from specbuild.core.artifacts import read_repo_manifest
    from specbuild.model_repo.transaction import serves

    manifest = read_repo_manifest(repo)
    layout, entry = manifest.layout, manifest.kind.entry_model
    return serves(entry, bool(layout["decoupled" if manifest.kind.llmapi else "bls_decoupled"]))


@group_command(repo_app, "check")
def check(
    repo: Annotated[
        Path,
        typer.Argument(help="A model repository written by `specbuild repo`."),
        INPUT("model repository"),
    ],
) -> None:
    """Parse every config.pbtxt as inference.ModelConfig and check the repository against its engines.

    LLM-API repositories: the tensor interface against upstream's table of the version, model.yaml's
    triton_config and every other key against the version's recorded keys, the model folders, the
    method x flow x version matrix and speculative_config's decoding_type.

    Checks: engine folders, max_draft_len vs the default num_draft_tokens, Medusa tree vs heads and
    max_draft_len, decoding_mode vs the engine's speculative mode, logits dtypes, tokenizer folders,
    ensemble tensor mapping and types, required parameters. Each failure names the file, the field and the
    fix; exit code 1 when anything is wrong."""
    from specbuild.model_repo.check import check_repo, kind_note

    findings = check_repo(repo)
    out = console()
    note = kind_note(repo)
    if note:
        out.print(f"NOTE {note}")
    for finding in findings:
        out.print(f"FAIL {finding}")
    if findings:
        out.print(f"{len(findings)} problem(s) in {repo}")
        raise typer.Exit(EXIT_CHECK_FAILED)
    out.print(f"OK {repo}: every config parses and matches its engines")
