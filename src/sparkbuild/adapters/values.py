"""The engine-neutral values adapters turn each engine's answers into, and the readers they
share: one greedy generation (:class:`Generation`), a snapshot of Prometheus counters
(:class:`Counters`), the mean acceptance length over an interval (:class:`Acceptance`),
per-position acceptance (:class:`PositionCounts`), a multi-node rank's place and command;
and the checks every engine's numbers go through (:func:`whole_number`, :func:`first_model`,
:func:`parse_or_fail`), launch-flag and Prometheus readers.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from prometheus_client.parser import text_string_to_metric_families

from sparkbuild.errors import EngineHTTPError

#: The most tokens a prompt, a request or an answer may count: more than any context a DGX
#: Spark serves. An engine that reports more, or fewer than none, is not telling the truth.
MAX_TOKENS = 1 << 22
#: Prometheus sample suffixes of counters and histograms: these never go down.
_MONOTONIC_SUFFIXES = ("_total", "_count", "_bucket")
_MONOTONIC_TYPES = frozenset({"counter", "histogram", "summary"})
_Parsed = TypeVar("_Parsed")


@dataclass(frozen=True)
class Generation:
    """One completion, in engine-neutral terms."""

    prompt: str
    text: str
    finish_reason: str | None
    completion_tokens: int
    tokens: tuple[str, ...]  # token strings (vLLM) or ids (SGLang), for repetition checks
    logprobs: tuple[float | None, ...]  # of each generated token; None where the engine sent null
    seconds: float
    spec_verify_ct: int | None = None  # SGLang: verify steps for this request
    spec_accept_length: float | None = None
    raw: Mapping[str, object] = field(default_factory=dict, repr=False)
    # With ``generate(..., ranked=k)``: the generated token ids, and per position the k most
    # likely token ids with their logprobs (what the lossless and burn-in checks compare).
    token_ids: tuple[int, ...] = ()
    top_logprobs: tuple[Mapping[int, float], ...] = field(default=(), repr=False)
    token_texts: tuple[str, ...] = field(default=(), repr=False)  # when the engine sends them


@dataclass(frozen=True)
class PositionCounts:
    """The engine's per-position acceptance counters at one moment: accepted draft tokens at
    each draft position, and the drafts proposed. ``note`` says why there are none."""

    accepted: tuple[float, ...] = ()
    drafts: float = 0.0
    note: str = ""

    def rates_since(self, before: PositionCounts) -> list[float] | None:
        """The share of drafts whose token at each position was accepted, in between."""
        drafts = self.drafts - before.drafts
        if not self.accepted or drafts <= 0:
            return None
        earlier = list(before.accepted) + [0.0] * (len(self.accepted) - len(before.accepted))
        return [(now - then) / drafts for now, then in zip(self.accepted, earlier, strict=True)]


@dataclass(frozen=True)
class Counters:
    """Prometheus samples summed over label sets, keyed by sample name (``..._total``)."""

    values: Mapping[str, float]
    available: bool = True  # False when /metrics could not be read
    taken_at: float = 0.0
    problem: str = ""  # why not available, naming the endpoint
    malformed: bool = False  # the engine answered /metrics, with something that is not Prometheus
    monotonic: frozenset[str] = frozenset()  # counter and histogram samples: never go down

    def get(self, name: str) -> float | None:
        return self.values.get(name)

    def delta(self, before: Counters, name: str) -> float | None:
        after_value = self.values.get(name)
        if after_value is None:
            return None
        return after_value - (before.values.get(name) or 0.0)

    def went_backwards(self, before: Counters) -> str:
        """A counter lower now than in ``before`` (empty when none): counters only grow."""
        for name in sorted(self.monotonic & before.monotonic):
            if self.values[name] < before.values[name]:
                return (
                    f"counter {name} went backwards ({before.values[name]:g} -> "
                    f"{self.values[name]:g})"
                )
        return ""


@dataclass(frozen=True)
class Acceptance:
    """Mean acceptance length over an interval (tokens per verify step, bonus token included).

    ``active`` is False when the engine shows no speculative decoding at all; ``accept_len``
    is None then. ``source`` names where the number came from.
    """

    active: bool
    accept_len: float | None
    source: str
    steps: float = 0.0  # drafts (vLLM) or verify calls (SGLang)
    tokens: float = 0.0  # accepted draft tokens (vLLM) or generated tokens (SGLang)
    detail: str = ""
    #: Counters that cannot be true (backwards, more accepted than drafted), naming the
    #: endpoint: the measurement is void, and the engine failed the ``errors`` check.
    impossible: str = ""


@dataclass(frozen=True)
class RankPlace:
    """Where one rank of a multi-node launch sits: its rank, the world, the rendezvous."""

    rank: int
    nodes: int
    leader_address: str  # the leader's address between nodes (rendezvous host)
    port: int  # the rendezvous port on the leader
    address: str  # this rank's own address between nodes
    #: How the command writes the rank, when not as its number: one template for every
    #: worker (Kubernetes fills ``$(LWS_WORKER_INDEX)`` per pod).
    rank_word: str | None = None

    @property
    def leader(self) -> bool:
        return self.rank == 0

    @property
    def rank_arg(self) -> str:
        """The rank as the command line writes it."""
        return self.rank_word or str(self.rank)


class Layout(Protocol):
    """How a multi-node launch spreads the engine (a profile's ``parallel``, read only)."""

    @property
    def tp(self) -> int: ...
    @property
    def ep(self) -> int: ...
    @property
    def pp(self) -> int: ...
    @property
    def launcher(self) -> str | None: ...


@dataclass(frozen=True)
class RankCommand:
    """What one rank's container runs: entrypoint and arguments, and whether it serves HTTP."""

    entrypoint: list[str]
    args: list[str]
    serves_http: bool


def flag_value(args: Sequence[str], *names: str) -> str | None:
    """The value launch flags ``args`` give the first of ``names`` found, written as
    ``--flag value`` or ``--flag=value`` ("" for a flag with nothing after it; None when
    absent)."""
    for at, word in enumerate(args):
        flag, eq, value = word.partition("=")
        if flag in names:
            return value if eq else (args[at + 1] if at + 1 < len(args) else "")
    return None


def parse_prometheus(text: str) -> dict[str, float]:
    """Sample values by name, summed over label sets (counters of all engines/ranks)."""
    return dict(parse_counters(text).values)


def parse_counters(text: str) -> Counters:
    """A /metrics page as :class:`Counters`: values summed over label sets, and which of them
    are monotonic (counters, histogram counts and buckets).

    A counter that is not a finite number of at least 0 is a ValueError (an engine reporting
    ``+Inf`` accepted tokens is broken, not fast); a gauge that is not finite is left out.
    """
    values: dict[str, float] = {}
    monotonic: set[str] = set()
    for family in text_string_to_metric_families(text):
        counting = family.type in _MONOTONIC_TYPES
        for sample in family.samples:
            value = float(sample.value)
            untyped_total = family.type == "unknown" and sample.name.endswith("_total")
            if (counting and sample.name.endswith(_MONOTONIC_SUFFIXES)) or untyped_total:
                if not math.isfinite(value) or value < 0:
                    raise ValueError(f"counter {sample.name} is {value:g}")
                monotonic.add(sample.name)
            elif not math.isfinite(value):
                continue
            values[sample.name] = values.get(sample.name, 0.0) + value
    return Counters(values, taken_at=time.monotonic(), monotonic=frozenset(monotonic))


def no_counters(problem: str) -> Counters:
    return Counters({}, available=False, taken_at=time.monotonic(), problem=problem)


def shortened(text: str, limit: int = 120) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def whole_number(value: object, name: str, maximum: int = MAX_TOKENS) -> int:
    """An engine's count field, 0 to ``maximum``; a string, a fraction, a negative or huge
    number, NaN or infinity there is a malformed response (ValueError)."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} is {shortened(repr(value), 40)}, not a whole number")
    if isinstance(value, float) and not value.is_integer():
        raise ValueError(f"{name} is {value!r}, not a whole number")
    if not 0 <= value <= maximum:
        raise ValueError(f"{name} is {int(value)}, not a count from 0 to {maximum}")
    return int(value)


def first_model(payload: object) -> Mapping[str, object]:
    """The first entry of an OpenAI ``/v1/models`` answer, or ValueError saying what is off."""
    if not isinstance(payload, Mapping):
        raise ValueError(f"the answer is a JSON {type(payload).__name__}, not an object")
    data = payload.get("data")
    if not isinstance(data, list) or not data:
        raise ValueError(f"'data' is {shortened(repr(data), 40)}, not a non-empty list")
    first = data[0]
    if not isinstance(first, Mapping) or not isinstance(first.get("id"), str):
        raise ValueError(f"data[0] is {shortened(repr(first), 60)}, not a model with an 'id'")
    return first


def parse_or_fail(what: str, parse: Callable[[], _Parsed]) -> _Parsed:
    """Run ``parse`` over a 200 answer; a wrong shape becomes EngineHTTPError naming ``what``."""
    try:
        return parse()
    except (TypeError, ValueError, AttributeError, KeyError, IndexError) as exc:
        raise EngineHTTPError.answered(
            what, 200, f"malformed response: {shortened(str(exc))}"
        ) from exc


def non_finite(values: Iterable[float | None]) -> int:
    """How many logprobs are null, NaN or infinite."""
    return sum(1 for v in values if v is None or not math.isfinite(v))


def last_float(pattern: re.Pattern[str], lines: Sequence[str]) -> float | None:
    """The number captured by ``pattern`` in the last line that matches it."""
    for line in reversed(lines):
        match = pattern.search(line)
        if match:
            return float(match.group(1))
    return None


def token_count(text: str) -> int | None:
    """``1024``, ``8k``, ``1M`` (the engines take k/m suffixes, powers of 1000 and 1024
    alike are common; vLLM reads ``k`` as 1000 and ``K`` as 1024)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*", text)
    if not match:
        return None
    number, unit = float(match.group(1)), match.group(2)
    scale = {"": 1, "k": 1000, "K": 1024, "m": 1000**2, "M": 1024**2}[unit]
    return int(number * scale)


def reported_version(payload: object) -> str | None:
    """The ``version`` of a version endpoint's JSON, if it has one (cut: it is engine text)."""
    value = payload.get("version") if isinstance(payload, dict) else None
    return str(value)[:200] if value and isinstance(value, str | int | float) else None


def optional_float(value: Any) -> float | None:
    """A number an engine sent, or None where it sent null or something else."""
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def per_position(text: str, family: str, drafts_name: str) -> tuple[list[float], float]:
    """A Prometheus page's accepted tokens by draft position (``family``'s samples with a
    ``position`` label, summed over every other label) and its drafts counter."""
    by_position: dict[int, float] = {}
    drafts = 0.0
    for metric in text_string_to_metric_families(text):
        for sample in metric.samples:
            if sample.name == family + "_total" and "position" in sample.labels:
                position = int(sample.labels["position"])
                by_position[position] = by_position.get(position, 0.0) + float(sample.value)
            elif sample.name == drafts_name:
                drafts += float(sample.value)
    if not by_position:
        return [], drafts
    return [by_position.get(i, 0.0) for i in range(max(by_position) + 1)], drafts
