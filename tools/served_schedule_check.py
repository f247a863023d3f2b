"""`python tools/served_schedule_check.py OUT SCHEDULE ROUNDS FIXED_KS` (e.g. `/tmp/c8 1:4,6:0 2 4`).

Served schedule check: draft/target demo family, repo with a given schedule, bls_instance_count 8,
bench --concurrency 1,2,4,8 with baseline, fixed K and the schedule interleaved."""

import json
import sys
from pathlib import Path

from rich.console import Console

from lab.benchmarks.load import CONCURRENCY, _load, _server_options, write_spec
from specbuild.builder.compile import compile_spec
from specbuild.bench.bench import run_bench
from specbuild.bench.load_bench import load_summary, load_table_lines
from specbuild.bench.options import BenchConfig, load_prompts
from specbuild.bench.report import write_report
from specbuild.core.spec import load_spec
from specbuild.demo.models import build_family
from specbuild.model_repo.generate import generate_repo
from specbuild.serve.tritonserver import TritonServer

out = Path(sys.argv[1])
schedule = sys.argv[2]
rounds = int(sys.argv[3])
fixed = tuple(int(k) for k in sys.argv[4].split(","))
console = Console(width=160)
out.mkdir(parents=True, exist_ok=True)
family = build_family(cache=Path(".cache/demo"), log=console.print)
texts = list(load_prompts(family.prompts))
held = texts[-8:]
spec = load_spec(write_spec(out, family, k=4))
build = compile_spec(spec, out / "build", engine="reference", force=True)
repo = generate_repo(build, out / "repo", backend="python", force=True, schedule=schedule)
loads = {"start": _load()}
with TritonServer(repo, _server_options()) as server:
    config = BenchConfig(
        url=server.grpc_url,
        prompts=tuple(held),
        max_tokens=48,
        concurrency=CONCURRENCY,
        temperatures=(0.0,),
        timeout_s=600,
        rounds=rounds,
        fixed_ks=fixed,
    )
    runs, context = run_bench(config, console=console)
loads["end"] = _load()
write_report(runs, context, out / "triton")
rows = load_summary(runs)
for line in load_table_lines(rows):
    console.print(line, markup=False)
print(json.dumps(loads))
(out / "rows.json").write_text(
    json.dumps({"rows": rows, "loads": loads, "schedule": schedule}, indent=1, default=str)
)
for row in rows:
    u = row.get("schedule_over_baseline_unary")
    f = row.get("schedule_over_best_fixed")
    print(
        f"c={row['concurrency']}: schedule/one-call {u['median']:.3f} ({u['min']:.3f}-{u['max']:.3f})  "
        f"schedule/best fixed {row.get('best_fixed')} {f['median']:.3f} ({f['min']:.3f}-{f['max']:.3f})"
    )
