"""`specbuild deploy SPEC --out DIR`: Kubernetes manifests for existing engines (Triton + TensorRT-LLM,
vLLM, NVIDIA Dynamo); nothing is applied to a cluster. See docs/deploy.md.

Only typer is imported at module level: `specbuild --help` stays instant.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer

from specbuild.cli.common import INPUT, OUT_DIR, Force, SpecArg, command, console
from specbuild.core.errors import DeployError

ENGINES = ("triton", "vllm", "sglang", "dynamo")


@command("deploy")
def deploy(
    spec: SpecArg,
    out: Annotated[
        Path | None, typer.Option("--out", help="Folder for the manifests (created)."), OUT_DIR
    ] = None,
    engine: Annotated[
        str, typer.Option("--engine", help="triton (engine flow) | vllm | sglang | dynamo (LLM-API flow).")
    ] = "triton",
    nodes: Annotated[
        int, typer.Option("--nodes", help="Nodes per replica (>1: LeaderWorkerSet / Dynamo multinode).")
    ] = 1,
    replicas: Annotated[int, typer.Option("--replicas", help="Replicas (e.g. from `specbuild plan`).")] = 1,
    max_replicas: Annotated[
        int | None, typer.Option("--max-replicas", help="HPA ceiling (default 4 x replicas).")
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="Kubernetes name (default: the spec's).")] = None,
    image: Annotated[
        str | None, typer.Option("--image", help="Container image (default: the engine's documented image).")
    ] = None,
    container_tag: Annotated[
        str | None, typer.Option("--container-tag", help="triton: the yy.mm tag.")
    ] = None,
    storage: Annotated[str, typer.Option("--storage", help="triton: size of the models volume.")] = "1Ti",
    storage_class: Annotated[
        str | None, typer.Option("--storage-class", help="triton: its StorageClass.")
    ] = None,
    gpu_product: Annotated[
        str | None,
        typer.Option(
            "--gpu-product", help="nodeSelector nvidia.com/gpu.product, e.g. NVIDIA-H100-80GB-HBM3."
        ),
    ] = None,
    options: Annotated[
        Path | None,
        typer.Option(
            "--options", help="dynamo: an LLM-API options YAML to use instead of the one built from the spec."
        ),
        INPUT("--options file"),
    ] = None,
    models_claim: Annotated[
        str | None,
        typer.Option(
            "--models-claim", help="vllm / sglang / dynamo: a PVC with the model folders, mounted at /models."
        ),
    ] = None,
    print_command: Annotated[
        bool,
        typer.Option(
            "--print",
            help="Print the server command only (vllm, sglang: the loopback line of a host); write nothing.",
        ),
    ] = False,
    force: Force = False,
) -> None:
    """Kubernetes manifests for the spec on an existing engine: Triton + TensorRT-LLM (build Job,
    Deployment or LeaderWorkerSet, Service, probes, queue/compute-ratio HPA), vLLM (`vllm serve` with the
    spec's speculation, Deployment or LeaderWorkerSet) or NVIDIA Dynamo (DynamoGraphDeployment with the
    LLM-API options). Validated offline (tests); nothing is applied. See docs/deploy.md."""
    from specbuild.core.spec import load_spec
    from specbuild.deploy.readme import readme_for
    from specbuild.deploy.write import write_folder

    if engine not in ENGINES:
        raise DeployError(
            f"unknown engine {engine!r}",
            expected=" | ".join(ENGINES),
            found=engine,
            fix="use --engine triton, vllm, sglang or dynamo",
        )
    if nodes < 1 or replicas < 1 or (max_replicas is not None and max_replicas < replicas):
        raise DeployError(
            "impossible layout",
            expected="--nodes >= 1, --replicas >= 1 (the HPA scales from it), --max-replicas >= --replicas",
            found=f"--nodes {nodes}, --replicas {replicas}, --max-replicas {max_replicas}",
            fix="fix the numbers",
        )
    from specbuild.deploy.k8s import check_quantity

    check_quantity(storage, option="--storage")
    s = load_spec(spec)
    extra: dict[str, str] = {}
    notes: list[str] = []
    recipe: tuple[tuple[str, str], ...] = ()
    if engine == "triton":
        from specbuild.deploy.triton import DeployOptions, triton_manifests

        m = triton_manifests(
            s,
            DeployOptions(
                name=name,
                nodes=nodes,
                replicas=replicas,
                max_replicas=max_replicas,
                image=image,
                container_tag=container_tag,
                storage=storage,
                storage_class=storage_class,
                gpu_product=gpu_product,
            ),
        )
        files, commands, notes, recipe = m.files, m.commands, list(m.notes), m.recipe
    elif engine == "vllm":
        from specbuild.deploy.vllm import serve_argv, unmapped, vllm_manifests

        line = shlex.join(serve_argv(s))
        if print_command:
            typer.echo(line)
            return
        files = vllm_manifests(
            s, name=name or s.name, nodes=nodes, replicas=replicas, image=image, models_claim=models_claim
        )
        commands = {"vllm (loopback, one host)": line}
        extra["vllm-serve.sh"] = (
            "#!/usr/bin/env bash\n# vLLM command for spec " + repr(s.name) + "\n" + line + "\n"
        )
        notes = ["no vLLM equivalent: " + "; ".join(unmapped(s))]
    elif engine == "sglang":
        from specbuild.deploy import sglang

        extra = sglang.host_files(s)
        if print_command:
            typer.echo(extra["sglang-serve.sh"].splitlines()[-1])
            return
        files = sglang.sglang_manifests(
            s, name=name or s.name, nodes=nodes, replicas=replicas, image=image, models_claim=models_claim
        )
        commands = {"sglang (loopback, one host)": extra["sglang-serve.sh"].splitlines()[-1]}
        notes = ["no SGLang equivalent: " + "; ".join(sglang.unmapped(s))]
    else:
        from specbuild.core.formats.safe_io import read_text
        from specbuild.core.spec import parse_spec_yaml
        from specbuild.deploy.dynamo import dynamo_graph
        from specbuild.deploy.llmapi_options import MODEL_ROOT, spec_options
        from specbuild.deploy.pods import pod_model_root
        from specbuild.deploy.vllm import pod_model

        root = MODEL_ROOT if models_claim else None
        if options is None:  # the options `compile --flow llmapi` would write, with the pod's model paths
            opts = spec_options(load_spec(spec, overrides={"flow": "llmapi"}), model_root=root)
        else:
            opts = parse_spec_yaml(
                read_text(options, kind="spec", what="LLM-API options"), where=str(options)
            )
            if not isinstance(opts, dict):
                raise DeployError(
                    f"{options}: not a mapping",
                    expected="LLM-API options (a YAML mapping)",
                    found=type(opts).__name__,
                    fix="point at the options YAML",
                )
        pod_model_root(s, models_claim, engine="dynamo", speculative=options is None)  # refuses host folders
        files = dynamo_graph(
            opts,
            version=s.trtllm_version,
            name=name or s.name,
            model_path=pod_model(s, s.target.model, root),
            image=image,
            tp=s.target.tp_size,
            pp=s.target.pp_size,
            nodes=nodes,
            replicas=replicas,
            models_claim=models_claim,
        )
        commands = {}
    if print_command:
        typer.echo("\n".join(f"# {k}\n{v}" for k, v in commands.items()))
        return
    if out is None:
        raise DeployError(
            "no output folder", expected="--out DIR", found="none", fix="add --out DIR (or --print)"
        )
    written = write_folder(
        out,
        files,
        readme=readme_for(s, engine, files, commands, notes, nodes=nodes, recipe=recipe),
        extra=extra,
        force=force,
        inputs={**s.inputs(), "--options file": options},  # also checked before the command ran
    )
    c = console()
    for n in notes:
        c.print(f"[yellow]note:[/] {n}")
    c.print("wrote " + ", ".join(str(p) for p in written))
