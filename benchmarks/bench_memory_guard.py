"""What the memory guard costs a bench run, measured in one run against the same run without
it.

The guard (engines/memory_guard) samples /proc/meminfo four times a second while the engine
boots and serves, and reads the engine's new log lines for its phase. Here the same bench
sweep runs against the real vLLM CPU engine (the tiny Llama, the CPU reference's flags),
alternately with the guard and without it, each run a boot of its own; printed: each run's
wall time, the ratio of the guarded runs' median to the unguarded runs', and the sampler
thread's own CPU time over the guarded run's wall time (the guard's cost without the noise
of a boot). The goal: under 1 % of a bench run's wall time.

    python benchmarks/bench_memory_guard.py [--rounds N] [--runs R]
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.vllm_cpu import ENGINE_ARGS, ENGINE_ENV, tiny_llama, vllm_server_command  # noqa: E402

from sparkbuild.adapters import adapter_for  # noqa: E402
from sparkbuild.bench.runner import BenchPlan, run_bench  # noqa: E402
from sparkbuild.bench.sweep import Sweep  # noqa: E402
from sparkbuild.engines.host_facts import this_host  # noqa: E402
from sparkbuild.engines.host_watch import HostWatch  # noqa: E402
from sparkbuild.engines.memory_floor import parse_floor  # noqa: E402
from sparkbuild.engines.memory_guard import LocalSampler  # noqa: E402
from sparkbuild.engines.targets import ProcessTarget, free_port  # noqa: E402


def one_run(guarded: bool, runs: int) -> tuple[float, float | None]:
    """(wall seconds of one bench run, the sampler's CPU seconds when guarded)."""
    adapter = adapter_for("vllm")
    port = free_port()
    serve = adapter.serve_args(str(tiny_llama()), "127.0.0.1", port, list(ENGINE_ARGS))
    argv = [*shlex.split(vllm_server_command()), *serve]
    sweep = Sweep(pp=[256], tg=[32], depth=[0], concurrency=[1, 2], runs=runs, seed=7)
    sampler = ("this host", LocalSampler)
    host = HostWatch([this_host()], parse_floor("256MiB"), [sampler]) if guarded else None
    plan = BenchPlan(sweep=sweep, label=f"guard {'on' if guarded else 'off'}", profile=None,
                     model=str(tiny_llama()), args=list(ENGINE_ARGS), host=host)  # fmt: skip
    target = ProcessTarget(argv, port=port, env=dict(ENGINE_ENV))
    began = time.monotonic()
    report = run_bench(target, adapter, plan)
    wall = time.monotonic() - began
    if not report.complete:
        raise SystemExit(f"the sweep did not complete: {report.error}")
    memory = (report.host_facts or {}).get("memory") if guarded else None
    cpu = float(memory["sampler_cpu_s"]) if isinstance(memory, dict) else None
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    walls: dict[bool, list[float]] = {True: [], False: []}
    shares: list[float] = []
    for round_ in range(args.rounds):
        for guarded in (round_ % 2 == 0, round_ % 2 != 0):  # alternate which goes first
            wall, cpu = one_run(guarded, args.runs)
            walls[guarded].append(wall)
            if cpu is not None:
                shares.append(cpu / wall)
            sampled = f", sampler CPU {cpu:.3f} s ({100 * cpu / wall:.3f} %)" if cpu else ""
            print(f"round {round_ + 1} guard {'on ' if guarded else 'off'}: {wall:7.1f} s{sampled}")
    on, off = statistics.median(walls[True]), statistics.median(walls[False])
    print(f"median wall: guard on {on:.1f} s, off {off:.1f} s: ratio {on / off:.3f}")
    print(f"sampler CPU over wall time: {100 * statistics.median(shares):.3f} % (median)")


if __name__ == "__main__":
    main()
