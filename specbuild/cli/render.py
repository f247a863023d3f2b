"""Rich tables for check, the memory plan, inspect and doctor (printing only; no logic)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

    from specbuild.builder.inspect_model import ModelInspection
    from specbuild.builder.memory_plan import MemoryPlan
    from specbuild.builder.preflight import CheckReport
    from specbuild.serve.doctor import DoctorRow

STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red"}
GIB = 2**30


def _status(s: str) -> str:
    return f"[{STYLE.get(s, '')}]{s}[/]"


def _rows_table(title: str, rows, *, with_fix: bool = True):
    from rich.table import Table

    table = Table(title=title, show_lines=False, title_justify="left")
    table.add_column("check", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("found")
    if with_fix:
        table.add_column("fix")
    for r in rows:
        cells = [r.name, _status(r.status), r.found] + ([r.fix] if with_fix else [])
        table.add_row(*cells)
    return table


def render_check(report: CheckReport, console: Console) -> None:
    from specbuild.builder.preflight import short_path

    title = f"specbuild check {short_path(report.spec.source) if report.spec.source else report.spec.name}"
    console.print(_rows_table(title, report.results))
    if report.plan is not None:
        render_plan(report.plan, console)
    counts = ", ".join(f"{report.count(s)} {s}" for s in ("pass", "warn", "fail"))
    verdict = "[green]OK[/]" if report.ok else "[bold red]FAILED[/]"
    console.print(f"{verdict}: {counts}")


def render_check_rows(rows, console: Console, *, title: str) -> None:
    """Check rows without a spec (`inspect DRAFT --target`)."""
    console.print(_rows_table(title, rows))


def render_plan(plan: MemoryPlan, console: Console) -> None:
    from rich.table import Table

    table = Table(title=f"memory plan, GPU 0 of {plan.gpu_memory_bytes / GIB:g} GiB", title_justify="left")
    table.add_column("per GPU")
    for e in plan.engines:
        table.add_column(f"{e.role} (tp {e.tp_size}, pp {e.pp_size})", justify="right")
    rows = [
        (
            "weights (whole model)",
            lambda e: f"{e.weight_bytes_total / GIB:.2f} GiB ({e.num_parameters / 1e9:.2f} B params)",
        ),
        (
            "weights on this GPU",
            lambda e: (
                f"{e.weight_bytes / GIB:.2f} GiB {e.dtype}"
                + (f" {e.weight_only}" if e.weight_only != "none" else "")
            ),
        ),
        ("Medusa heads", lambda e: f"{e.medusa_bytes / GIB:.2f} GiB" if e.medusa_bytes else "-"),
        (
            "activations (estimate)",
            lambda e: f"{e.activation_bytes / GIB:.2f} GiB (max_num_tokens {e.max_num_tokens})",
        ),
        (
            "KV heads on this GPU",
            lambda e: (
                f"{e.kv_heads_per_gpu}"
                + (f" (duplicated x{e.kv_duplication})" if e.kv_duplication > 1 else "")
            ),
        ),
        ("KV bytes / token", lambda e: f"{e.kv_bytes_per_token:,} (model {e.kv_bytes_per_token_total:,})"),
        ("KV cache", lambda e: f"{e.kv_bytes / GIB:.2f} GiB"),
        ("KV tokens", lambda e: f"{e.kv_tokens:,}"),
        ("kv_cache_free_gpu_mem_fraction", lambda e: f"{e.kv_fraction}"),
    ]
    for label, cell in rows:
        table.add_row(label, *(cell(e) for e in plan.engines))
    console.print(table)
    console.print(
        f"runtime reserve {plan.runtime_reserve_bytes / GIB:g} GiB; free after weights "
        f"{plan.free_after_weights_bytes / GIB:.2f} GiB; "
        f"KV budget ({plan.kv_fraction_total:g} of it) {plan.kv_budget_bytes / GIB:.2f} GiB -> "
        f"{plan.kv_tokens:,} tokens per engine "
        f"= {plan.full_sequences} sequences of max_seq_len {plan.max_seq_len} (max_batch_size "
        f"{plan.max_batch_size})"
    )
    t, d = plan.engine("target"), plan.engine("draft")
    if d is not None and not plan.llmapi and t.tp_size * t.pp_size > d.tp_size * d.pp_size:
        idle = (d.resident_bytes + d.kv_bytes) / GIB
        console.print(
            f"GPUs {d.tp_size * d.pp_size}..{t.tp_size * t.pp_size - 1} hold only the target: {idle:.2f} GiB "
            "(the draft's share on GPU 0) stays unused there"
        )
    if plan.llmapi:
        console.print(
            f"LLM-API options: kv_cache_config: {{free_gpu_memory_fraction: {plan.kv_fraction_total:g}, "
            f"max_tokens: {plan.kv_tokens}}} (one pool for every model; the smaller limit applies)"
        )
    else:
        console.print(
            "set on each Triton model: kv_cache_free_gpu_mem_fraction as above and "
            f"max_tokens_in_paged_kv_cache {plan.kv_tokens} (together: equal pools in either load order)"
        )
    console.print("assumptions: " + "; ".join(plan.assumptions), style="dim")


def render_inspection(report: ModelInspection, console: Console) -> None:
    from rich.table import Table

    from specbuild.builder.preflight import short_path

    table = Table(
        title=f"specbuild inspect {short_path(report.folder)}", title_justify="left", show_header=False
    )
    table.add_column("field", no_wrap=True)
    table.add_column("value")
    for key, value in report.rows():
        table.add_row(key, value)
    console.print(table)


def render_doctor(rows: list[DoctorRow], console: Console) -> None:
    console.print(_rows_table("specbuild doctor", rows))
