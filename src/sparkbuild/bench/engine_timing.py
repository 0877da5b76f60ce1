"""The engine's own per-request timing, from its Prometheus histograms, and burst detection.

A client on a busy host can receive a whole stream in one burst after the engine finished;
tokens divided by (last chunk - first chunk) then says nothing about the engine. The engine
time-stamps every token itself, so its histograms stay right. Per run of a cell, the delta
of these histograms (read with prometheus-client's parser) gives:

* ``tpot_s``: mean of ``request_time_per_output_token_seconds`` (vLLM; SGLang from 0.5.23):
  per request ``(last token - first token) / (output tokens - 1)``, engine clock. Its inverse is
  the engine's per-request decode rate, what the client's ``decode_tps_request`` should match.
  Where that histogram is missing (SGLang up to 0.5.20), the mean of
  ``inter_token_latency_seconds`` stands in (weighted by token, not by request).
* ITL and TTFT percentiles: the upper bound of the histogram bucket that holds them. Buckets
  are coarse (vLLM's first ITL bucket is 10 ms), so these are bounds, never exact values.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from sparkbuild import net
from sparkbuild.adapters import EngineAdapter
from sparkbuild.bench.client import StreamResult

TPOT = "request_time_per_output_token_seconds"
ITL = "inter_token_latency_seconds"
TTFT = "time_to_first_token_seconds"
HISTOGRAMS = (TPOT, ITL, TTFT)

#: A run whose client decode rate exceeds the engine's by this factor was received in bursts.
BURST_FACTOR = 1.5
#: A stream whose decode tokens arrived less than this far apart on average came in a flush
#: from a socket buffer: a Python-served engine takes longer than 0.2 ms per decode step (the
#: tiny CPU model here takes about 1 ms). With the engine's own time per output token, a
#: stream that arrived more than twice as fast as that is a flush.
FLUSH_GAP_S = 0.0002
FLUSH_FRACTION = 0.5
#: The client's rate agrees with the engine's when within this fraction of it.
AGREEMENT = 0.05


@dataclass(frozen=True)
class Histogram:
    """Cumulative bucket counts ``(le, count)`` ascending (``+Inf`` last), with sum and count."""

    buckets: tuple[tuple[float, float], ...]
    sum: float
    count: float

    def minus(self, before: Histogram | None) -> Histogram | None:
        """The observations since ``before``; None when that cannot be (a count went down:
        the engine restarted, or its histogram is not telling the truth)."""
        if before is None:
            return self
        earlier = dict(before.buckets)
        delta = Histogram(
            tuple((le, n - earlier.get(le, 0.0)) for le, n in self.buckets),
            self.sum - before.sum,
            self.count - before.count,
        )
        if delta.count < 0 or delta.sum < 0 or any(n < 0 for _, n in delta.buckets):
            return None
        return delta

    def plus(self, other: Histogram | None) -> Histogram:
        if other is None:
            return self
        more = dict(other.buckets)
        return Histogram(
            tuple((le, n + more.get(le, 0.0)) for le, n in self.buckets),
            self.sum + other.sum,
            self.count + other.count,
        )

    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None

    def bound(self, quantile: float) -> float | None:
        """The upper bound of the bucket holding ``quantile`` (None: no observations, or it
        falls in the ``+Inf`` bucket)."""
        if self.count <= 0:
            return None
        rank = quantile * self.count
        for le, cumulative in self.buckets:
            if cumulative >= rank:
                return None if math.isinf(le) else le
        return None


def parse_histograms(text: str, prefix: str) -> dict[str, Histogram]:
    """The timing histograms in a /metrics page, summed over label sets (engines, ranks,
    ``is_streaming``), keyed by their name without ``prefix`` (``vllm:`` or ``sglang:``)."""
    buckets: dict[str, dict[float, float]] = {}
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        short = family.name.removeprefix(prefix)
        if not family.name.startswith(prefix) or short not in HISTOGRAMS:
            continue
        for sample in family.samples:
            if not math.isfinite(float(sample.value)) or float(sample.value) < 0:
                raise ValueError(f"{sample.name} is {float(sample.value):g}")
            if sample.name.endswith("_bucket"):
                le = float(sample.labels["le"])
                per = buckets.setdefault(short, {})
                per[le] = per.get(le, 0.0) + float(sample.value)
            elif sample.name.endswith("_sum"):
                sums[short] = sums.get(short, 0.0) + float(sample.value)
            elif sample.name.endswith("_count"):
                counts[short] = counts.get(short, 0.0) + float(sample.value)
    return {
        name: Histogram(tuple(sorted(per.items())), sums.get(name, 0.0), counts.get(name, 0.0))
        for name, per in buckets.items()
    }


@dataclass(frozen=True)
class TimingSnapshot:
    histograms: Mapping[str, Histogram]
    available: bool = True


def snapshot_timing(adapter: EngineAdapter, session: net.Session, base_url: str) -> TimingSnapshot:
    """The engine's timing histograms now (unavailable when the engine exports none, or its
    metrics page cannot be read)."""
    prefix = adapter.bench_counters.timing_prefix
    if prefix is None:
        return TimingSnapshot({}, available=False)
    text = adapter.metrics_text(session, base_url)
    if text is None:
        return TimingSnapshot({}, available=False)
    try:
        return TimingSnapshot(parse_histograms(text, prefix))
    except ValueError:  # a page prometheus-client cannot parse is no timing source
        return TimingSnapshot({}, available=False)


@dataclass(frozen=True)
class EngineDelta:
    """What the engine measured over one interval."""

    source: str  # the histogram the per-request rate came from
    requests: float  # observations of that histogram
    tpot_s: float | None
    itl: Histogram | None
    ttft: Histogram | None

    @property
    def decode_tps_request(self) -> float | None:
        return 1.0 / self.tpot_s if self.tpot_s else None


def engine_delta(before: TimingSnapshot, after: TimingSnapshot, prefix: str) -> EngineDelta | None:
    """The interval's timing, or None when the engine exports none of it."""
    if not (before.available and after.available):
        return None
    deltas = {
        name: delta
        for name, histogram in after.histograms.items()
        if (delta := histogram.minus(before.histograms.get(name))) is not None
    }
    tpot, itl = deltas.get(TPOT), deltas.get(ITL)
    chosen, name = (tpot, TPOT) if tpot is not None and tpot.count > 0 else (itl, ITL)
    if chosen is None or chosen.count <= 0:
        return None
    return EngineDelta(
        source=prefix + name,
        requests=chosen.count if name == TPOT else (deltas[TTFT].count if TTFT in deltas else 0),
        tpot_s=chosen.mean(),
        itl=itl,
        ttft=deltas.get(TTFT),
    )


# --- bursts ---------------------------------------------------------------------------------


def flushed(result: StreamResult, engine_tpot_s: float | None = None) -> bool:
    """Whether the stream's decode tokens arrived in a flush rather than as the engine made
    them: on average less than :data:`FLUSH_GAP_S` apart, or less than half the engine's own
    time per output token when that is known. (An average, not a median: engines and
    frontends often hand over two or three tokens at once without the rate being wrong.)"""
    tpot = result.time_per_output_token
    if tpot is None or result.decode_tokens < 2:
        return False
    bar = max(FLUSH_GAP_S, FLUSH_FRACTION * engine_tpot_s) if engine_tpot_s else FLUSH_GAP_S
    return tpot < bar


def client_tpot(results: Sequence[StreamResult]) -> float | None:
    """Mean client-side seconds per decode token over a run's finished requests."""
    values = [r.time_per_output_token for r in results if r.ok]
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def burst_reason(results: Sequence[StreamResult], engine: EngineDelta | None) -> str | None:
    """Why a run's client decode timing cannot be trusted, or None when it can."""
    tpot = engine.tpot_s if engine else None
    flushes = sum(1 for r in results if r.ok and flushed(r, tpot))
    if flushes:
        return f"{flushes} of {len(results)} streams arrived in a flush"
    mine = client_tpot(results)
    if engine is None or engine.tpot_s is None or mine is None or mine <= 0:
        return None
    factor = engine.tpot_s / mine
    if factor > BURST_FACTOR:
        return f"tokens arrived {factor:.1f}x faster than the engine decoded them"
    return None
