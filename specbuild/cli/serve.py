"""Commands of the serve stage: `serve` (the local tritonserver, or GPU launch lines) and `doctor`.

Only typer is imported at module level: `specbuild --help` stays instant.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from specbuild.cli.common import EXIT_CHECK_FAILED, INPUT, OUT_FILE, AsJson, command, console, err_console
from specbuild.serve import tritonserver as S  # stdlib-only at import: the defaults


@command("serve")
def serve(
    repo: Annotated[
        Path, typer.Argument(help="Model repository (from `specbuild repo`)."), INPUT("model repository")
    ],
    grpc_port: int = typer.Option(
        S.DEFAULT_GRPC_PORT, "--grpc-port", help="gRPC port (clients: --url HOST:PORT)."
    ),
    http_port: int = typer.Option(
        S.DEFAULT_HTTP_PORT, "--http-port", help="HTTP/REST port (health, repository index)."
    ),
    metrics_port: int = typer.Option(
        S.DEFAULT_METRICS_PORT, "--metrics-port", help="Prometheus metrics port."
    ),
    host: str = typer.Option(
        S.DEFAULT_HOST,
        "--host",
        help="Address every endpoint binds to. Loopback by default; "
        "another address exposes an unauthenticated server to that network.",
    ),
    log_file: Annotated[
        Path | None,
        typer.Option("--log-file", help="Write the server log here instead of following it on stderr."),
        OUT_FILE,
    ] = None,
    log_verbose: int = typer.Option(0, "--log-verbose", help="tritonserver --log-verbose level (0 = quiet)."),
    print_launch: bool = typer.Option(
        False,
        "--print-launch",
        help="GPU hosts: start nothing; print the "
        "TensorRT-LLM Triton container run line and MPI server launch for REPO "
        "(image matched to the spec's TensorRT-LLM version; world size from TP/PP; "
        "orchestrator mode --multi-model for draft/target). LLM-API flow: REPO may be a `compile --flow "
        "llmapi` build (docker run of the TensorRT-LLM release image + trtllm-serve) or an LLM-API "
        "repository (Triton container + tritonserver); --nodes N adds the trtllm-llmapi-launch line.",
    ),
    container_tag: str | None = typer.Option(
        None,
        "--container-tag",
        help="With --print-launch: use this "
        "yy.mm tag instead of the newest one matching the TensorRT-LLM version (LLM-API build: the "
        "TensorRT-LLM release image tag).",
    ),
    openai_port: int | None = typer.Option(
        None,
        "--openai-port",
        help="Also serve the OpenAI-compatible API (/v1/models, /v1/completions, /v1/chat/completions, "
        "SSE streaming, usage, per-request speculative metrics) on this port, on --host.",
    ),
    served_model_name: str | None = typer.Option(
        None,
        "--served-model-name",
        help="The model id the OpenAI API answers to (default: REPO's folder name).",
    ),
    chat_template: Annotated[
        Path | None,
        typer.Option(
            "--chat-template",
            help="A Hugging Face Jinja chat template for /v1/chat/completions (default: the tokenizer's; "
            "without one chat requests are refused).",
        ),
        INPUT("chat template"),
    ] = None,
    nodes: int = typer.Option(
        1, "--nodes", help="With --print-launch, LLM-API flow: nodes; > 1 adds the trtllm-llmapi-launch line."
    ),
    gpus_per_node: int | None = typer.Option(
        None,
        "--gpus-per-node",
        help="With --print-launch --nodes N: GPUs (ranks) per node (default tp*pp/N).",
    ),
    launcher: str = typer.Option("srun", "--launcher", help="With --nodes N: srun | mpirun."),
) -> None:
    """Serve a model repository with the local tritonserver (bundled in nvidia-pytriton, Python backend, CPU).

    Waits until every model is READY, then serves until Ctrl-C / SIGTERM and stops the server and its
    Python-backend processes. A busy port, a model that fails to load or a missing libpython stop
    with the log lines that explain it. The production repository (backend tensorrtllm) needs the
    NVIDIA container on a GPU host: see --print-launch.
    """
    import sys

    if openai_port is not None:
        from specbuild.core.addresses import check_port
        from specbuild.core.errors import ServerError

        check_port(openai_port, option="--openai-port", error=ServerError)
    if print_launch:
        from specbuild.serve.llmapi_launch import format_lines, is_llmapi, llmapi_launch_lines

        if is_llmapi(repo):  # a `compile --flow llmapi` build or an LLM-API repository
            lines = llmapi_launch_lines(
                repo,
                tag=container_tag,
                host=host,
                port=http_port,
                grpc_port=grpc_port,
                http_port=http_port,
                metrics_port=metrics_port,
                nodes=nodes,
                gpus_per_node=gpus_per_node,
                launcher=launcher,
            )
            typer.echo(format_lines(lines))
            return
        from specbuild.serve.launch import format_commands, launch_commands

        commands = launch_commands(
            repo,
            tag=container_tag,
            host=host,
            grpc_port=grpc_port,
            http_port=http_port,
            metrics_port=metrics_port,
            log_file=str(log_file) if log_file else None,
        )
        typer.echo(format_commands(commands))
        return
    from specbuild.serve.serve_command import run_server

    options = S.ServerOptions(
        host=host,
        grpc_port=grpc_port,
        http_port=http_port,
        metrics_port=metrics_port,
        log_file=log_file,
        log_verbose=log_verbose,
    )
    if host not in ("127.0.0.1", "localhost", "::1"):
        err_console().print(
            f"[yellow]warning:[/] binding to {host}: anyone who can reach it can use the server"
        )
    on_ready = None
    if openai_port is not None:
        from specbuild.frontend.run import FrontendOptions, start_frontend

        frontend_options = FrontendOptions(
            host=host,
            port=openai_port,
            model_name=served_model_name,
            chat_template=chat_template,
            metrics_url=f"http://{'[' + host + ']' if ':' in host else host}:{metrics_port}/metrics",
            repo=Path(repo),
        )

        def on_ready(server):
            frontend = start_frontend(
                server.grpc_url, frontend_options, default_name=Path(repo).resolve().name
            )
            console().print(f"  OpenAI  {frontend.url} (model {frontend.model!r})")
            return frontend.stop

    code = run_server(
        repo, options, console=console(), log_stream=None if log_file else sys.stderr, on_ready=on_ready
    )
    raise typer.Exit(code)


@command("doctor")
def doctor(
    as_json: AsJson = False,
    facts: Annotated[
        bool,
        typer.Option(
            "--facts",
            help="Print every upstream fact specbuild writes for the LLM-API flow per TensorRT-LLM version, "
            "and for `deploy --engine vllm | sglang` per release, with where it was read (repository, path, "
            "revision) and whether it is verified or INFERRED.",
        ),
    ] = False,
    version: Annotated[
        str | None,
        typer.Option("--version", help="--facts: only this TensorRT-LLM version, or vllm==V / sglang==V."),
    ] = None,
) -> None:
    """Report the environment: Python, torch (+CUDA, GPUs), tensorrt_llm and trtllm-build (GPU hosts only),
    the local tritonserver binary from the nvidia-pytriton wheel, its Python backend stub and the libpython
    the stub loads. `--facts`: the recorded upstream facts instead.

    Exit code 1 when something required is missing (a fail row).
    """
    if facts:
        _print_facts(version, as_json)
        return
    from specbuild.serve.doctor import run_doctor

    rows = run_doctor()
    if as_json:
        typer.echo(json.dumps([r.__dict__ for r in rows], indent=2))
    else:
        from specbuild.cli.render import render_doctor

        render_doctor(rows, console())
    if any(r.status == "fail" for r in rows):
        raise typer.Exit(EXIT_CHECK_FAILED)


def _print_facts(version: str | None, as_json: bool) -> None:
    from specbuild.core.errors import SpecbuildError
    from specbuild.core.facts import sglang as sglang_facts
    from specbuild.core.facts import vllm as vllm_facts
    from specbuild.core.facts.deploy_sources import triton_facts
    from specbuild.core.facts.llmapi import LLMAPI_VERSIONS, release_facts
    from specbuild.core.methods import SGLANG_ALGORITHMS, VLLM_METHODS
    from specbuild.deploy.dynamo import DYNAMO_TRTLLM, PAIRING_SOURCE

    servers = {
        f"vllm=={vllm_facts.VLLM_VERSION}": ("vLLM", vllm_facts.release_facts, VLLM_METHODS),
        f"sglang=={sglang_facts.SGLANG_VERSION}": ("SGLang", sglang_facts.release_facts, SGLANG_ALGORITHMS),
    }
    if version is not None and version not in (*LLMAPI_VERSIONS, *servers):
        raise SpecbuildError(
            f"no recorded facts for TensorRT-LLM {version}",
            expected=" | ".join((*LLMAPI_VERSIONS, *servers)),
            found=version,
            fix="pass one of the versions above, or leave --version out",
        )

    def row(topic: str, value: str, f) -> dict[str, str]:
        return {
            "topic": topic,
            "value": value,
            "status": f.status,
            "source": f.cite(),
            "repo": f.repo,
            "path": f.path,
            "at": f.at,
        }

    rows = {
        v: [
            row(*fact)
            for fact in [
                *release_facts(v),
                (
                    "Dynamo tensorrtllm-runtime images that ship it",
                    ", ".join(tag for tag, ships in DYNAMO_TRTLLM.items() if ships == v) or "none",
                    PAIRING_SOURCE,
                ),
                *[
                    (f"deploy --engine triton: {t}", value, f)
                    for t, value, f in triton_facts()
                    if v == "1.2.1"
                ],
            ]
        ]
        for v in LLMAPI_VERSIONS
        if version in (None, v)
    }
    for key, (_, facts_of, names) in servers.items():
        if version in (None, key):
            rows[key] = [row(*fact) for fact in facts_of(key.split("==")[1], names)]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    for v, facts in rows.items():
        inferred = sum(r["status"] != "verified" for r in facts)
        title = f"{servers[v][0]} {v.split('==')[1]}" if v in servers else f"TensorRT-LLM {v}"
        typer.echo(f"{title}: {len(facts)} facts, {inferred} INFERRED")
        for r in facts:
            mark = "verified" if r["status"] == "verified" else "INFERRED"
            typer.echo(f"  [{mark}] {r['topic']}: {r['value']}\n      source: {r['source']}")
