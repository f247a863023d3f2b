"""Preflight rows for Medusa: the heads folder is readable and consistent, and the tree is valid."""

from __future__ import annotations

from specbuild.builder.check_rows import FAIL, PASS, WARN, CheckResult, LoadedModel, short_path
from specbuild.builder.memory_plan import MedusaShape
from specbuild.builder.resolve import resolve_model
from specbuild.core.errors import SpecbuildError
from specbuild.core.formats.medusa_heads import WEIGHT_FILES, read_medusa_heads
from specbuild.core.methods import method_of
from specbuild.core.spec import BuildSpec


def check_medusa_heads(spec: BuildSpec, target: LoadedModel | None, out: list[CheckResult]) -> MedusaShape:
    """Append the heads' rows; return the head counts the memory plan should use (the spec's)."""
    section = method_of(spec).heads_of(spec)
    assert section is not None
    want_heads, want_layers = section.num_heads, section.num_layers
    shape = MedusaShape(want_heads, want_layers)
    try:
        folder = resolve_model(section.heads, base=spec.base_dir, what="Medusa heads")
    except SpecbuildError as exc:
        out.append(CheckResult("medusa: heads", FAIL, f"{exc.what} ({exc.found})", exc.fix or ""))
        return shape
    try:
        info = read_medusa_heads(folder)
    except SpecbuildError as exc:  # unreadable weights file
        out.append(CheckResult("medusa: heads", FAIL, f"{exc.what} ({exc.found})", exc.fix or ""))
        return shape
    if info.weights_file is None and info.config_num_heads is None:
        out.append(
            CheckResult(
                "medusa: heads",
                FAIL,
                f"{short_path(folder)} has neither config.json with medusa_num_heads nor "
                f"{' / '.join(WEIGHT_FILES)}",
                "point medusa.heads at the folder of the trained heads (FasterDecoding/Medusa layout)",
            )
        )
        return shape
    if info.problems:
        out.append(
            CheckResult(
                "medusa: heads",
                FAIL,
                f"{info.weights_file}: " + "; ".join(info.problems),
                "re-save the heads with keys {h}.{j}.linear.weight/bias and {h}.{L}.weight",
            )
        )
        return shape
    if info.weights_file is None:
        out.append(
            CheckResult(
                "medusa: weights",
                WARN,
                f"{short_path(folder)}: config.json only, no {' / '.join(WEIGHT_FILES)}; counts and shapes "
                "come from the spec and config",
                "download the heads' weights before `specbuild compile`",
            )
        )
        heads, layers, source = want_heads, want_layers, "spec"
    else:
        heads, layers, source = info.num_heads, info.num_layers, info.weights_file.name
        if heads < want_heads or layers != want_layers:
            out.append(
                CheckResult(
                    "medusa: head counts",
                    FAIL,
                    f"{source} holds {heads} heads x {layers} ResBlocks; the spec says num_heads "
                    f"{want_heads}, num_layers {want_layers}",
                    f"set medusa.num_heads: {heads} and medusa.num_layers: {layers}",
                )
            )
        elif heads > want_heads:
            out.append(
                CheckResult(
                    "medusa: head counts",
                    WARN,
                    f"{source} holds {heads} heads; the spec uses the first {want_heads}",
                    f"set medusa.num_heads: {heads} to use them all (a deeper tree)",
                )
            )
        else:
            out.append(
                CheckResult(
                    "medusa: head counts",
                    PASS,
                    f"{source}: {heads} heads x {layers} ResBlock(s), as the spec says",
                )
            )
    if info.config_num_heads is not None and (info.config_num_heads, info.config_num_layers or 1) != (
        heads,
        layers,
    ):
        # medusa-vicuna-7b-v1.3's config.json says 2 heads for weights holding 4 (TensorRT-LLM README)
        out.append(
            CheckResult(
                "medusa: config.json",
                WARN,
                f"config.json says medusa_num_heads {info.config_num_heads}, medusa_num_layers "
                f"{info.config_num_layers}; the {source} says {heads} x {layers}",
                "the weights decide; specbuild passes num_heads/num_layers explicitly (TensorRT-LLM's "
                "converter ignores config.json)",
            )
        )
    if target is not None:
        hidden = info.hidden_size or info.config_hidden_size
        vocab = info.vocab_size or info.config_vocab_size
        c = target.config
        bad = [
            f"{name} {got} vs target {want}"
            for name, got, want in (("hidden", hidden, c.hidden_size), ("vocab", vocab, c.vocab_size))
            if got is not None and got != want
        ]
        if bad:
            out.append(
                CheckResult(
                    "medusa: shapes",
                    FAIL,
                    "heads do not fit the target: " + "; ".join(bad),
                    "use heads trained on this target model",
                )
            )
        elif hidden is None and vocab is None:
            out.append(
                CheckResult(
                    "medusa: shapes",
                    WARN,
                    "no hidden/vocab size known for the heads (no weights, none in config.json)",
                    "download the heads' weights to check their shapes",
                )
            )
        else:
            out.append(
                CheckResult("medusa: shapes", PASS, f"hidden {hidden}, vocab {vocab} match the target")
            )
    return shape


def check_tree(spec: BuildSpec) -> CheckResult:

    section = method_of(spec).heads_of(spec)
    assert section is not None
    tree = spec.medusa_choices()
    problems = tree.problems(num_heads=section.num_heads, max_draft_len=spec.speculation.max_draft_len)
    if problems:
        return CheckResult(
            "medusa: tree",
            FAIL,
            "; ".join(problems),
            "list every prefix, keep depth <= medusa.num_heads and size <= speculation.max_draft_len, or use "
            "mc_sim_7b_63",
        )
    return CheckResult(
        "medusa: tree",
        PASS,
        f"{tree.size} nodes, depth {tree.depth} (heads {section.num_heads}), "
        f"size <= max_draft_len {spec.speculation.max_draft_len}, prefix-closed",
    )
