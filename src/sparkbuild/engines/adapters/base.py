"""What every engine adapter offers, and the values they share.

An adapter turns one engine's dialect into common values: how to launch and probe it,
one greedy generation with logprobs (:class:`Generation`), a snapshot of its Prometheus
counters (:class:`Counters`), and the mean acceptance length of speculative decoding over an
interval (:class:`Acceptance`), from counter deltas or from per-request fields. The bench stage
uses the same calls per sweep cell: snapshot before, run, snapshot after, ``acceptance(...)``.

Each engine's formats live in its own module (:mod:`.vllm`, :mod:`.sglang`), checked against
SGLang 0.5.10/0.5.23 wheels and vLLM 0.32 on the CPU. What an engine reads changes with its
release (:mod:`sparkbuild.engines.versions`): an adapter is made with the engine's version,
so its launch arguments (:meth:`EngineAdapter.serve_args`) and NaN switch
(:meth:`EngineAdapter.nan_switch`) are the ones that version reads.
"""

from __future__ import annotations

import math
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import requests
from packaging.version import Version
from prometheus_client.parser import text_string_to_metric_families

from sparkbuild.engines import versions
from sparkbuild.errors import EngineHTTPError

if TYPE_CHECKING:
    from sparkbuild.engines.profiles import Parallel


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
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class Counters:
    """Prometheus samples summed over label sets, keyed by sample name (``..._total``)."""

    values: Mapping[str, float]
    available: bool = True  # False when /metrics could not be read
    taken_at: float = 0.0
    problem: str = ""  # why not available, naming the endpoint
    malformed: bool = False  # the engine answered /metrics, with something that is not Prometheus

    def get(self, name: str) -> float | None:
        return self.values.get(name)

    def delta(self, before: Counters, name: str) -> float | None:
        after_value = self.values.get(name)
        if after_value is None:
            return None
        return after_value - (before.values.get(name) or 0.0)


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


@dataclass(frozen=True)
class RankPlace:
    """Where one rank of a multi-node launch sits: its rank, the world, the rendezvous."""

    rank: int
    nodes: int
    leader_address: str  # the leader's address between nodes (rendezvous host)
    port: int  # the rendezvous port on the leader
    address: str  # this rank's own address between nodes

    @property
    def leader(self) -> bool:
        return self.rank == 0


@dataclass(frozen=True)
class RankCommand:
    """What one rank's container runs: entrypoint and arguments, and whether it serves HTTP."""

    entrypoint: list[str]
    args: list[str]
    serves_http: bool


def parse_prometheus(text: str) -> dict[str, float]:
    """Sample values by name, summed over label sets (counters of all engines/ranks)."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + float(sample.value)
    return values


def _no_counters(problem: str) -> Counters:
    return Counters({}, available=False, taken_at=time.monotonic(), problem=problem)


def _short(text: str, limit: int = 120) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def whole_number(value: Any, name: str) -> int:
    """An engine's count field; a string, float or list there is a malformed response."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} is {_short(repr(value), 40)}, not a whole number")
    if isinstance(value, float) and not value.is_integer():
        raise ValueError(f"{name} is {value!r}, not a whole number")
    return int(value)


def first_model(payload: Any) -> Mapping[str, Any]:
    """The first entry of an OpenAI ``/v1/models`` answer, or ValueError saying what is off."""
    if not isinstance(payload, Mapping):
        raise ValueError(f"the answer is a JSON {type(payload).__name__}, not an object")
    data = payload.get("data")
    if not isinstance(data, list) or not data:
        raise ValueError(f"'data' is {_short(repr(data), 40)}, not a non-empty list")
    first = data[0]
    if not isinstance(first, Mapping) or not isinstance(first.get("id"), str):
        raise ValueError(f"data[0] is {_short(repr(first), 60)}, not a model with an 'id'")
    return first


def parse_or_fail(what: str, parse: Callable[[], Generation]) -> Generation:
    """Run ``parse`` over a 200 answer; a wrong shape becomes EngineHTTPError naming ``what``."""
    try:
        return parse()
    except (TypeError, ValueError, AttributeError, KeyError, IndexError) as exc:
        raise EngineHTTPError(what, 200, f"malformed response: {_short(str(exc))}") from exc


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


class EngineAdapter(ABC):
    """One engine's launch flags, endpoints, counters and log formats."""

    name: ClassVar[str]
    default_port: ClassVar[int]
    default_launcher: ClassVar[tuple[str, ...]]
    health_path: ClassVar[str] = "/health"
    metrics_path: ClassVar[str] = "/metrics"
    ready_line: ClassVar[re.Pattern[str]]
    #: Log lines that mean NaN/inf logits were seen.
    nan_line: ClassVar[re.Pattern[str]]
    #: Log lines that mean something went wrong while serving.
    error_line: ClassVar[re.Pattern[str]]
    #: An HTTP error body that means the response held NaN/inf (it could not be serialized).
    nan_response: ClassVar[re.Pattern[str]] = re.compile(
        r"Out of range float values are not JSON compliant|\bNaN\b"
    )
    #: The engine's periodic acceptance-length log line (group 1: the value).
    accept_line: ClassVar[re.Pattern[str]]

    def __init__(self, request_timeout_s: float = 300.0, version: Version | None = None) -> None:
        self.request_timeout_s = request_timeout_s
        self.version = version  # of the engine under test, when known

    def nan_switch(self) -> versions.NanSwitch:
        """The NaN detection this engine version reads (environment and flags to add)."""
        return versions.UNKNOWN_VERSION

    def ignored_variables(self, env: Mapping[str, str]) -> list[str]:
        """Variables in ``env`` that this engine version is known not to read."""
        return []

    @abstractmethod
    def serve_args(self, model: str, host: str, port: int, args: Sequence[str]) -> list[str]:
        """Arguments after the launcher: model, bind address and the profile's flags.

        Each engine's module makes its own, per release where the flags differ
        (``self.version``): the place for launch arguments that differ by engine and release.
        """

    #: The launcher of a multi-node rank (vLLM's headless workers need ``vllm serve``).
    cluster_launcher: ClassVar[tuple[str, ...]] = ()
    #: Flags the multi-node launch sets itself; a profile that sets one is refused.
    parallel_flags: ClassVar[tuple[str, ...]] = ()
    #: A log line naming one rank joining the world (named groups ``world`` and ``rank``).
    rank_line: ClassVar[re.Pattern[str] | None] = None

    def rank_command(
        self,
        launcher: Sequence[str],
        serve: Sequence[str],
        parallel: Parallel,
        place: RankPlace,
    ) -> RankCommand:
        """One rank of a multi-node launch: ``launcher`` (``vllm serve``, ...), ``serve``
        (:meth:`serve_args`), and the engine's own multi-node flags for ``parallel`` (a
        :class:`~sparkbuild.engines.profiles.Parallel`) at ``place``."""
        raise NotImplementedError(f"{self.name} has no multi-node launch")

    def joined_ranks(self, lines: Iterable[str]) -> tuple[int | None, set[int]]:
        """(world size, ranks) the engine logged as joined, from :attr:`rank_line`."""
        world: int | None = None
        ranks: set[int] = set()
        if self.rank_line is None:
            return world, ranks
        for line in lines:
            match = self.rank_line.search(line)
            if match:
                world = int(match.group("world"))
                ranks.add(int(match.group("rank")))
        return world, ranks

    @abstractmethod
    def generate(
        self,
        session: requests.Session,
        base_url: str,
        prompt: str,
        max_tokens: int,
        extra: Mapping[str, Any] | None = None,
    ) -> Generation:
        """One greedy completion with logprobs; raises EngineHTTPError on an HTTP failure."""

    @abstractmethod
    def acceptance_from_delta(self, before: Counters, after: Counters) -> Acceptance:
        """Acceptance over the interval between two counter snapshots."""

    def acceptance_from_generations(self, generations: Sequence[Generation]) -> Acceptance | None:
        """Acceptance from per-request fields, when the engine returns them (None otherwise)."""
        return None

    def acceptance(
        self, before: Counters, after: Counters, generations: Sequence[Generation] = ()
    ) -> Acceptance:
        """The best measurement available: per-request fields, else counter deltas."""
        per_request = self.acceptance_from_generations(generations)
        if per_request is not None and per_request.active:
            return per_request
        return self.acceptance_from_delta(before, after)

    def nan_count_from_delta(self, before: Counters, after: Counters) -> float | None:
        """Requests the engine flagged as NaN/corrupted in the interval (None: no counter)."""
        return None

    def acceptance_from_log(self, lines: Sequence[str]) -> float | None:
        """The last acceptance length the engine logged (a lifetime/windowed figure)."""
        return last_float(self.accept_line, lines)

    def snapshot_counters(self, session: requests.Session, base_url: str) -> Counters:
        """All Prometheus samples of the engine right now."""
        where = f"GET {base_url}{self.metrics_path}"
        try:
            response = session.get(base_url + self.metrics_path, timeout=10)
        except requests.RequestException as exc:
            return _no_counters(f"{where}: no response ({type(exc).__name__})")
        if response.status_code != 200:
            return _no_counters(f"{where}: HTTP {response.status_code}")
        try:
            values = parse_prometheus(response.text)
        except (ValueError, TypeError, IndexError) as exc:
            problem = f"{where}: not Prometheus text ({_short(str(exc))})"
            return Counters({}, False, time.monotonic(), problem, malformed=True)
        return Counters(values, taken_at=time.monotonic())

    def _post(
        self, session: requests.Session, url: str, body: Mapping[str, Any]
    ) -> tuple[dict[str, Any], float]:
        started = time.monotonic()
        try:
            response = session.post(url, json=body, timeout=self.request_timeout_s)
        except requests.Timeout as exc:
            raise EngineHTTPError(
                f"POST {url}",
                None,
                f"no answer within {self.request_timeout_s:g} s (request timeout)",
                timed_out=True,
            ) from exc
        except requests.RequestException as exc:
            raise EngineHTTPError(f"POST {url}", None, str(exc)) from exc
        seconds = time.monotonic() - started
        if response.status_code != 200:
            raise EngineHTTPError(f"POST {url}", response.status_code, response.text)
        try:
            payload = response.json()  # Python's json reads NaN/Infinity literals too
        except ValueError as exc:
            raise EngineHTTPError(f"POST {url}", response.status_code, "not JSON") from exc
        if not isinstance(payload, dict):
            raise EngineHTTPError(f"POST {url}", response.status_code, "not a JSON object")
        return payload, seconds


def optional_float(value: Any) -> float | None:
    """A number an engine sent, or None where it sent null or something else."""
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
