"""The bench report (JSON schema) and how one run's requests become its figures.

Definitions (per run of a cell, i.e. ``concurrency`` requests sent at once):

* ``ttft_s``: mean time from sending a request to its first token chunk.
* ``prefill_tps``: mean over requests of ``usage.prompt_tokens / ttft`` (the whole prompt,
  context depth included, is prefilled: no request can hit the prefix cache).
* ``decode_tps_request``: mean over requests of ``decode tokens / (last - first token
  chunk)``, where decode tokens are ``completion_tokens`` minus those in the first chunk
  (usage on every chunk, ``continuous_usage_stats``; 1 when the engine does not send it):
  the rate one user sees once tokens flow.
* ``decode_tps_aggregate``: ``sum(decode tokens) / (latest last chunk - earliest first
  chunk)``: what the engine decodes in total while the cell's streams are running.
* ``output_tps``: ``sum(completion_tokens) / (last stream done - first request sent)``.
* ``prefill_tps_aggregate``: ``sum(prompt_tokens) / (latest first chunk - earliest send)``.
* ``decode_tps_engine``: the engine's own per-request decode rate over the same requests,
  ``1 / mean(request_time_per_output_token_seconds)`` from its histogram delta
  (:mod:`sparkbuild.bench.engine_timing`); ``client_engine_ratio`` = client / engine rate.

A run is a **burst** when its streams arrived in one flush or far faster than the engine
decoded them (a starved client reading a socket buffer). A burst run reports no client decode
rate (``decode_tps_request``/``decode_tps_aggregate`` null, ``burst`` says why); the engine's
figure stands beside it. ``flags`` on a cell name every run whose client and engine rates
differ by more than 5 %.

Percentiles (cell, all runs pooled): ``ttft_p50_s``/``ttft_p99_s`` over requests;
``itl_p50_s``/``itl_p99_s`` over the gaps between decode chunks (per token) of non-burst runs.
``engine`` holds the engine's own view: TTFT/ITL percentiles as histogram bucket bounds.

A cell reports the median, min and max of each over its runs. Acceptance length is one number
per cell, from the engine's counter deltas over that cell alone; it is ``null`` when the
engine proposed no drafts (speculation off), never 1.0 by assumption.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from sparkbuild.bench.client import StreamResult
from sparkbuild.bench.engine_timing import AGREEMENT, EngineDelta, burst_reason, client_tpot
from sparkbuild.bench.sweep import CellKey, Sweep
from sparkbuild.engines.profiles import Parallel

SCHEMA_VERSION: Literal[1] = 1
MAX_ERROR_SAMPLES = 5
METRICS = (
    "ttft_s",
    "prefill_tps",
    "prefill_tps_aggregate",
    "decode_tps_request",
    "decode_tps_aggregate",
    "decode_tps_engine",
    "output_tps",
)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Stat(_Model):
    """Median, min and max over the runs that produced a value (``n`` of them)."""

    median: float | None = None
    min: float | None = None
    max: float | None = None
    n: int = 0

    @classmethod
    def of(cls, values: Sequence[float | None]) -> Stat:
        present = [v for v in values if v is not None]
        if not present:
            return cls()
        return cls(
            median=round(statistics.median(present), 4),
            min=round(min(present), 4),
            max=round(max(present), 4),
            n=len(present),
        )


class RunFigures(_Model):
    """One run of a cell."""

    ttft_s: float | None
    prefill_tps: float | None
    decode_tps_request: float | None
    decode_tps_aggregate: float | None
    output_tps: float | None
    seconds: float
    requests: int
    errors: int
    prompt_tokens: int  # summed over the run's successful requests (engine usage)
    completion_tokens: int
    accept_len: float | None = None
    prefill_tps_aggregate: float | None = None
    decode_tps_engine: float | None = None  # the engine's own per-request rate
    client_engine_ratio: float | None = None  # client / engine per-request decode rate
    burst: str | None = None  # why the client's decode timing was discarded


class EngineTiming(_Model):
    """The engine's own timing over a whole cell (histogram deltas; percentiles are the
    upper bounds of the buckets that hold them)."""

    source: str
    requests: float
    tpot_s: float | None
    decode_tps_request: float | None
    itl_mean_s: float | None = None
    itl_p50_le_s: float | None = None
    itl_p99_le_s: float | None = None
    ttft_p50_le_s: float | None = None
    ttft_p99_le_s: float | None = None

    @classmethod
    def of(cls, delta: EngineDelta) -> EngineTiming:
        itl, ttft = delta.itl, delta.ttft
        return cls(
            source=delta.source,
            requests=delta.requests,
            tpot_s=_round(delta.tpot_s, 6),
            decode_tps_request=_round(delta.decode_tps_request, 4),
            itl_mean_s=_round(itl.mean(), 6) if itl else None,
            itl_p50_le_s=itl.bound(0.5) if itl else None,
            itl_p99_le_s=itl.bound(0.99) if itl else None,
            ttft_p50_le_s=ttft.bound(0.5) if ttft else None,
            ttft_p99_le_s=ttft.bound(0.99) if ttft else None,
        )


class Speculation(_Model):
    """Counter deltas over one cell (vLLM: drafts/accepted; SGLang: verify steps/tokens)."""

    accept_len: float | None
    steps: float
    tokens: float
    source: str


class CellResult(_Model):
    pp: int
    tg: int
    depth: int
    concurrency: int
    ttft_s: Stat
    prefill_tps: Stat
    decode_tps_request: Stat
    decode_tps_aggregate: Stat
    output_tps: Stat
    prefill_tps_aggregate: Stat = Stat()
    decode_tps_engine: Stat = Stat()
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    itl_p50_s: float | None = None
    itl_p99_s: float | None = None
    engine: EngineTiming | None = None
    burst_runs: int = 0
    flags: list[str] = []
    accept_len: float | None  # null: no drafts proposed in this cell (speculation off)
    speculation: Speculation | None = None
    prompt_tokens_target: int
    prompt_tokens: int | None  # median per request, as the engine counted them
    completion_tokens: int | None  # median per request
    requests: int
    errors: int
    error_samples: list[str] = []
    engine_generation_tokens: float | None = None  # the engine's own counter over the cell
    prefix_cache_hit_tokens: float | None = None
    runs: list[RunFigures]
    # With the sweep's prefix caching, each run's context load (the context alone, sent just
    # before the measured requests); the engine figures above leave these requests out.
    context_runs: list[RunFigures] = []
    # sha256 over the prompts the cell sent, in order (its context loads' too): what a
    # resumed sweep holds the prompts it would send against before carrying the cell.
    prompts_sha256: str | None = None

    @property
    def key(self) -> CellKey:
        return CellKey(self.pp, self.tg, self.depth, self.concurrency)


class HarnessInfo(_Model):
    name: Literal["sparkbuild-bench", "llama-benchy"] = "sparkbuild-bench"
    version: str
    sparkbuild: str
    http_client: str


class HostInfo(_Model):
    hostname: str
    platform: str
    machine: str
    cpus: int | None
    python: str
    # Recorded since sparkbuild-bench reports carry them; None in older reports.
    cpu_model: str | None = None
    memory_gib: float | None = None
    load_start: list[float] | None = None  # 1-, 5-, 15-minute load average when the run began
    load_end: list[float] | None = None  # ... and when it ended

    def load_per_core(self) -> float | None:
        """The busier of the 1-minute load at start and end, per core: ~0 an idle host,
        1 every core busy with other work."""
        loads = [load[0] for load in (self.load_start, self.load_end) if load]
        if not loads or not self.cpus:
            return None
        return round(max(loads) / self.cpus, 2)

    @property
    def summary(self) -> str:
        """One word for the host, as comparisons and images.lock show it."""
        return f"{self.hostname}/{self.machine}/{self.cpus}cpu"


class NodeInfo(_Model):
    """One node of a cluster run: its rank and the image id its container ran."""

    name: str
    endpoint: str
    rank: int | None = None
    image_id: str | None = None


class TargetInfo(_Model):
    kind: str  # image | command | url | cluster
    value: str
    image_id: str | None = None
    repo_digests: list[str] = []
    nodes: list[NodeInfo] = []  # a cluster run: every node's image
    launcher: str | None = None  # a cluster run: the engine's multi-node runtime


class EngineInfo(_Model):
    name: str
    version: str | None = None
    model: str
    served_model: str
    args: list[str] = []
    env: dict[str, str] = {}
    max_model_len: int | None = None


class PromptInfo(_Model):
    recipe: str
    seed: int
    calibration: Literal["tokenize", "usage"]
    fingerprint: str  # sha256 over every prompt sent (same model + seed: same value)
    exact: bool  # every prompt had exactly its target length by the engine's count


TIME_FORMAT = "%Y-%m-%dT%H:%M:%S%z"


class ProcessSpan(_Model):
    """One process's part of a sweep: an uninterrupted sweep has one, a resumed sweep one
    per process that measured (the earlier ones carried from the file resumed)."""

    started: str  # when the process began (before the boot)
    ended: str  # when it wrote its report
    seconds: float  # its wall time, boot included
    boot_seconds: float | None = None
    cells: list[str] = []  # the cells it measured

    @classmethod
    def ending(
        cls, ended: str, seconds: float, boot_seconds: float | None, cells: list[str]
    ) -> ProcessSpan:
        """The span of a process that ended at ``ended`` after ``seconds``."""
        try:
            end = datetime.strptime(ended, TIME_FORMAT)
            started = (end - timedelta(seconds=seconds)).strftime(TIME_FORMAT)
        except (ValueError, OverflowError):
            started = ended  # another harness's time: the span's length is still known
        return cls(
            started=started, ended=ended, seconds=seconds, boot_seconds=boot_seconds, cells=cells
        )


class Resumed(_Model):
    """The earlier run a resumed sweep continued (``bench --resume``): its file and the cells
    carried over from it as they were measured."""

    file: str
    cells: list[str]


class BenchReport(_Model):
    # Only the layout this code reads: a report of another layout is refused, not misread.
    schema_version: Literal[1] = SCHEMA_VERSION
    created: str
    label: str
    profile: str | None
    harness: HarnessInfo
    host: HostInfo
    target: TargetInfo
    engine: EngineInfo
    # How the engine was spread (the profile's `parallel:`); None: not known (a --url run
    # without a profile). A claim of another topology is not compared with this run.
    topology: Parallel | None = None
    sweep: Sweep
    prompts: PromptInfo | None = None
    boot_seconds: float | None = None
    seconds: float = 0.0
    complete: bool
    error: str | None = None
    pending_cells: list[str] = []
    cells: list[CellResult] = Field(default_factory=list)
    # Before the boot on a DGX Spark: the memory fit and the page cache (engines/boot_prep).
    before_boot: dict[str, object] | None = None
    resumed_from: Resumed | None = None  # bench --resume: the earlier run it continued
    # Each process's span, in order; ``seconds`` and ``boot_seconds`` are their sums (a
    # report from before sparkbuild kept them has none).
    processes: list[ProcessSpan] = []
    # Every node's facts, the drift named before the boot, the memory guard's record and the
    # boot's phases (engines/host_watch); None in reports made before they were recorded.
    host_facts: dict[str, object] | None = None

    def cell(self, key: CellKey) -> CellResult | None:
        return next((c for c in self.cells if c.key == key), None)


def run_figures(
    results: Sequence[StreamResult],
    accept_len: float | None = None,
    engine: EngineDelta | None = None,
    prefill_tokens: int | None = None,
) -> RunFigures:
    """One run's figures from its requests (failed requests only count as errors), checked
    against the engine's own timing of the same requests when there is one.
    ``prefill_tokens``: the tokens each request had to prefill, when the engine's prefix
    cache held the rest of its prompt (prefill rates count only those)."""
    good = [r for r in results if r.ok and r.completion_tokens is not None]
    burst = burst_reason(good, engine)
    engine_rate = engine.decode_tps_request if engine else None
    mine = client_tpot(good)
    ratio = engine.tpot_s / mine if engine and engine.tpot_s and mine else None
    ttfts = [r.ttft for r in good if r.ttft is not None]
    prefill = [
        (prefill_tokens or r.prompt_tokens) / r.ttft
        for r in good
        if r.prompt_tokens and r.ttft and r.ttft > 0
    ]
    per_request: list[float] = []
    for r in good:
        span = r.decode_seconds
        if span and span > 0 and r.decode_tokens > 0:
            per_request.append(r.decode_tokens / span)
    decoded = sum(r.decode_tokens for r in good)
    firsts = [r.first_token for r in good if r.first_token is not None]
    lasts = [r.last_token for r in good if r.last_token is not None]
    window = (max(lasts) - min(firsts)) if firsts and lasts else 0.0
    wall = max(r.done for r in results) - min(r.sent for r in results) if results else 0.0
    produced = sum(r.completion_tokens or 0 for r in good)
    prompted = sum((prefill_tokens or r.prompt_tokens or 0) for r in good if r.prompt_tokens)
    prefill_window = max(firsts) - min(r.sent for r in good) if firsts else 0.0
    trusted = burst is None  # never a client decode rate computed from a burst
    return RunFigures(
        ttft_s=_mean(ttfts),
        prefill_tps=_mean(prefill),
        decode_tps_request=_mean(per_request) if trusted else None,
        decode_tps_aggregate=(
            round(decoded / window, 4) if decoded and window > 0 and trusted else None
        ),
        output_tps=round(produced / wall, 4) if produced and wall > 0 else None,
        seconds=round(wall, 4),
        requests=len(results),
        errors=len(results) - len(good),
        prompt_tokens=sum(r.prompt_tokens or 0 for r in good),
        completion_tokens=produced,
        accept_len=accept_len,
        prefill_tps_aggregate=(
            round(prompted / prefill_window, 4) if prompted and prefill_window > 0 else None
        ),
        decode_tps_engine=_round(engine_rate, 4),
        client_engine_ratio=_round(ratio, 4),
        burst=burst,
    )


def _mean(values: Sequence[float]) -> float | None:
    return round(statistics.fmean(values), 4) if values else None


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (an observed value, no interpolation)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]


def client_percentiles(
    runs: Sequence[Sequence[StreamResult]], figures: Sequence[RunFigures]
) -> dict[str, float | None]:
    """TTFT p50/p99 over every finished request of a cell; ITL p50/p99 over the decode chunk
    gaps of its non-burst runs (a burst's gaps are the client's read loop, not the engine)."""
    ttfts = [r.ttft for run in runs for r in run if r.ok and r.ttft is not None]
    gaps = [
        gap
        for run, fig in zip(runs, figures, strict=True)
        if fig.burst is None
        for r in run
        if r.ok
        for gap in r.chunk_gaps()
    ]
    return {
        "ttft_p50_s": _round(percentile(ttfts, 0.5), 6),
        "ttft_p99_s": _round(percentile(ttfts, 0.99), 6),
        "itl_p50_s": _round(percentile(gaps, 0.5), 6),
        "itl_p99_s": _round(percentile(gaps, 0.99), 6),
    }


def run_flags(figures: Sequence[RunFigures]) -> list[str]:
    """A line per run whose client figure is a burst or strays from the engine's."""
    flags: list[str] = []
    for index, run in enumerate(figures, start=1):
        if run.burst:
            flags.append(f"run {index}: burst ({run.burst}); client decode rate not reported")
        elif run.client_engine_ratio is not None and abs(run.client_engine_ratio - 1) > AGREEMENT:
            flags.append(
                f"run {index}: client decode rate {100 * (run.client_engine_ratio - 1):+.1f} % "
                "from the engine's"
            )
    return flags


def cell_stats(runs: Sequence[RunFigures]) -> dict[str, Stat]:
    return {name: Stat.of([getattr(run, name) for run in runs]) for name in METRICS}
