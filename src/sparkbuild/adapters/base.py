"""What every engine adapter offers, and the values they share.

An adapter turns one engine's dialect into common values: how to launch and probe it,
one greedy generation with logprobs (:class:`Generation`), a snapshot of its Prometheus
counters (:class:`Counters`), and the mean acceptance length of speculative decoding over an
interval (:class:`Acceptance`), from counter deltas or from per-request fields. The bench stage
uses the same calls per sweep cell: snapshot before, run, snapshot after, ``acceptance(...)``.

Each engine's formats live in its own module (:mod:`.vllm`, :mod:`.sglang`), checked against
SGLang 0.5.10/0.5.23 wheels and vLLM 0.32 on the CPU. What an engine reads changes with its
release (its module's tables; :mod:`sparkbuild.adapters.versions`): an adapter is made with
the engine's version, so its launch arguments (:meth:`EngineAdapter.serve_args`) and NaN
switch (:meth:`EngineAdapter.nan_switch`) are the ones that version reads.
"""

from __future__ import annotations

import math
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeVar

import requests
from packaging.version import Version
from prometheus_client.parser import text_string_to_metric_families

from sparkbuild import jsontext, net
from sparkbuild.adapters import versions
from sparkbuild.adapters.facts import MemoryFacts, PreflightFacts, RecipeFacts, SourceBuild
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


def _no_counters(problem: str) -> Counters:
    return Counters({}, available=False, taken_at=time.monotonic(), problem=problem)


def _short(text: str, limit: int = 120) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def whole_number(value: object, name: str, maximum: int = MAX_TOKENS) -> int:
    """An engine's count field, 0 to ``maximum``; a string, a fraction, a negative or huge
    number, NaN or infinity there is a malformed response (ValueError)."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} is {_short(repr(value), 40)}, not a whole number")
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
        raise ValueError(f"'data' is {_short(repr(data), 40)}, not a non-empty list")
    first = data[0]
    if not isinstance(first, Mapping) or not isinstance(first.get("id"), str):
        raise ValueError(f"data[0] is {_short(repr(first), 60)}, not a model with an 'id'")
    return first


def parse_or_fail(what: str, parse: Callable[[], _Parsed]) -> _Parsed:
    """Run ``parse`` over a 200 answer; a wrong shape becomes EngineHTTPError naming ``what``."""
    try:
        return parse()
    except (TypeError, ValueError, AttributeError, KeyError, IndexError) as exc:
        raise EngineHTTPError.answered(
            what, 200, f"malformed response: {_short(str(exc))}"
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


def _token_count(text: str) -> int | None:
    """``1024``, ``8k``, ``1M`` (the engines take k/m suffixes, powers of 1000 and 1024
    alike are common; vLLM reads ``k`` as 1000 and ``K`` as 1024)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*", text)
    if not match:
        return None
    number, unit = float(match.group(1)), match.group(2)
    scale = {"": 1, "k": 1000, "K": 1024, "m": 1000**2, "M": 1024**2}[unit]
    return int(number * scale)


#: Where vLLM and SGLang report their version (each answers at least one).
VERSION_PATHS = ("/version", "/get_server_info", "/server_info")


def reported_version(payload: object) -> str | None:
    """The ``version`` of a version endpoint's JSON, if it has one (cut: it is engine text)."""
    value = payload.get("version") if isinstance(payload, dict) else None
    return str(value)[:200] if value and isinstance(value, str | int | float) else None


def _signal(name: str, kind: str, used_for: str) -> dict[str, str]:
    return {"name": name, "kind": kind, "used_for": used_for}


class EngineAdapter(ABC):
    """Everything sparkbuild knows about one engine: launch flags, endpoints, counters and
    log formats, and the facts each stage reads (:mod:`.facts`), behind one interface.

    An engine's module defines one subclass and names it ``ADAPTER``; :mod:`.known` finds
    it. No other module names an engine (``tests/test_engine_names.py``).
    """

    name: ClassVar[str]
    #: How people write the engine's name (messages).
    display_name: ClassVar[str]
    source_build: ClassVar[SourceBuild] = SourceBuild()
    preflight: ClassVar[PreflightFacts]
    recipes: ClassVar[RecipeFacts]
    #: How the engine sizes its memory (None: no estimate before its boot).
    memory: ClassVar[MemoryFacts | None] = None
    #: The metrics and response fields smoke and bench rely on, each with what for; preflight
    #: looks for them in the release's source (:meth:`preflight_signals`).
    relied_metrics: ClassVar[tuple[tuple[str, str], ...]] = ()
    relied_fields: ClassVar[tuple[tuple[str, str], ...]] = ()
    #: Bench's counters: the engine's own count of generated tokens (all requests), and of
    #: prompt tokens served from its prefix cache (None: the engine has none).
    generation_counter: ClassVar[str | None] = None
    prefix_hit_counter: ClassVar[str | None] = None
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
    compile_line: ClassVar[re.Pattern[str]] = re.compile(r"(?i)\btorch\.compile\b|\bcompiling\b")
    compile_cache_vars: ClassVar[tuple[str, ...]] = ()
    #: The launch flag that caps prompt plus generated tokens per request.
    max_len_flag: ClassVar[str]

    def __init__(self, request_timeout_s: float = 300.0, version: Version | None = None) -> None:
        self.request_timeout_s = request_timeout_s
        self.version = version  # of the engine under test, when known

    def nan_switch(self) -> versions.NanSwitch:
        """The NaN detection this engine version reads (environment and flags to add)."""
        return versions.UNKNOWN_VERSION

    def declared_max_len(self, args: Sequence[str]) -> int | None:
        """The longest request (prompt plus generated tokens) ``args`` allow, when they set
        it (``--max-model-len 1024``, ``--context-length=8k``); None when they do not."""
        value: str | None = None
        for position, word in enumerate(args):
            flag, equals, given = word.partition("=")
            if flag == self.max_len_flag:
                value = (
                    given if equals else (args[position + 1] if position + 1 < len(args) else None)
                )
        return _token_count(value) if value is not None else None

    def ignored_variables(self, env: Mapping[str, str]) -> list[str]:
        """Variables in ``env`` that this engine version is known not to read."""
        return []

    @classmethod
    def preflight_signals(cls, version: Version | str | None) -> list[dict[str, str]]:
        """Every metric and response field this adapter relies on for the engine
        ``version`` (``{"name", "kind": "metric"|"field", "used_for"}``); an engine whose
        signals differ by release drops those a version lacks."""
        return [
            *(_signal(name, "metric", used_for) for name, used_for in cls.relied_metrics),
            *(_signal(name, "field", used_for) for name, used_for in cls.relied_fields),
        ]

    @classmethod
    def draft_model(cls, args: Sequence[str]) -> str | None:
        """The speculative draft model the launch flags ``args`` name, if any."""
        return None

    @classmethod
    def speculative_method(cls, args: Sequence[str]) -> str | None:
        """The speculative algorithm or method the launch flags ``args`` ask for (None: off)."""
        return None

    @classmethod
    def load_format(cls, version: Version | None, name: str) -> versions.LoadFormatFact | None:
        """Whether the engine ``version`` loads weights by ``--load-format name`` (None:
        the engine has no such facts)."""
        return None

    @classmethod
    def recipe_runtime(cls, runtime: str, defaults: Mapping[str, object], command: str) -> str:
        """sparkrun's runtime ``runtime`` as sparkrun resolves it for this engine (a bare
        engine name may stand for one of several); any other runtime as it is."""
        return runtime

    @classmethod
    def launcher_flags(cls, args: Sequence[str]) -> list[str]:
        """Flags the launcher adds to a profile's own ``args`` on every launch (what smoke and
        bench read from the engine), none that ``args`` already has. A recipe exported from
        the profile carries them, so sparkrun runs what smoke ran."""
        return []

    @abstractmethod
    def serve_args(self, model: str, host: str, port: int, args: Sequence[str]) -> list[str]:
        """Arguments after the launcher: model, bind address and the profile's flags.

        Each engine's module makes its own, per release where the flags differ
        (``self.version``): the place for launch arguments that differ by engine and release.
        """

    #: The launcher of a multi-node rank (vLLM's headless workers need ``vllm serve``).
    cluster_launcher: ClassVar[tuple[str, ...]] = ()
    #: The multi-node runtimes a profile's ``parallel.launcher`` may name; the first is the
    #: default.
    parallel_launchers: ClassVar[tuple[str, ...]] = ()
    #: Flags the multi-node launch sets itself; a profile that sets one is refused.
    parallel_flags: ClassVar[tuple[str, ...]] = ()
    #: A log line naming one rank joining the world (named groups ``world`` and ``rank``).
    rank_line: ClassVar[re.Pattern[str] | None] = None

    def rank_command(
        self,
        launcher: Sequence[str],
        serve: Sequence[str],
        parallel: Layout,
        place: RankPlace,
    ) -> RankCommand:
        """One rank of a multi-node launch: ``launcher`` (``vllm serve``, ...), ``serve``
        (:meth:`serve_args`), and the engine's own multi-node flags for ``parallel`` (a
        profile's :class:`~sparkbuild.engines.profiles.Parallel`) at ``place``."""
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
        session: net.Session,
        base_url: str,
        prompt: str,
        max_tokens: int,
        extra: Mapping[str, object] | None = None,
        *,
        ranked: int = 0,
    ) -> Generation:
        """One greedy completion with logprobs; raises EngineHTTPError on an HTTP failure.
        With ``ranked=k`` (k >= 2) it also returns the token ids and, per position, the k
        most likely ids with their logprobs (:attr:`Generation.top_logprobs`)."""

    @abstractmethod
    def without_speculation(self, args: Sequence[str]) -> list[str]:
        """``args`` with every flag that turns this engine's speculative decoding on
        dropped: the same engine as its own reference, for the lossless check."""

    #: Why the engine has no per-position acceptance counter (empty when it has one).
    per_position_missing: ClassVar[str] = ""

    def position_counts(self, session: net.Session, base_url: str) -> PositionCounts:
        """The engine's per-position acceptance counters now (empty, with a note, when the
        engine exports none or they cannot be read)."""
        return PositionCounts(note=self.per_position_missing or f"{self.name}: none")

    #: The request field of a sampling seed (vLLM's body, SGLang's ``sampling_params``).
    seed_field: ClassVar[str] = "seed"

    #: Where the answer's reasoning is, in the order the engine's releases have used.
    reasoning_fields: ClassVar[tuple[str, ...]] = ("reasoning_content",)

    def request_model(self, session: net.Session, base_url: str) -> str:
        """The model name an OpenAI-style request names (engines that serve one model take
        any)."""
        return "default"

    def acceptance_from_delta(self, before: Counters, after: Counters) -> Acceptance:
        """Acceptance over the interval between two counter snapshots; void (``impossible``)
        when the counters cannot be true."""
        problem = self.impossible(before, after)
        if problem:
            return Acceptance(False, None, "counters", detail=problem, impossible=problem)
        return self.acceptance_over(before, after)

    def impossible(self, before: Counters, after: Counters) -> str:
        """Why the counters between two snapshots cannot be true (a counter that went
        backwards, more accepted than drafted), naming the endpoint; empty when they can."""
        if not (before.available and after.available):
            return ""
        problem = after.went_backwards(before) or self.impossible_counts(before, after)
        return f"{self.metrics_path}: {problem}" if problem else ""

    @abstractmethod
    def acceptance_over(self, before: Counters, after: Counters) -> Acceptance:
        """Acceptance over the interval, from counters known to be possible."""

    def impossible_counts(self, before: Counters, after: Counters) -> str:
        """What the engine's counters claim that cannot be (more accepted than drafted), or
        empty; each engine knows its own counters."""
        return ""

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

    def session(self) -> net.Session:
        """An HTTP session for this engine: no exchange outlives the request timeout."""
        return net.Session(deadline_s=self.request_timeout_s)

    def server_version(self, session: net.Session, base_url: str) -> str | None:
        """The version the running server reports (vLLM ``/version``, SGLang
        ``/get_server_info``), or None when it reports none."""
        for path in VERSION_PATHS:
            try:
                response = session.get(base_url + path, timeout=10)
                value = reported_version(response.json()) if response.status_code == 200 else None
            except (requests.RequestException, ValueError, RecursionError):  # nested too deep
                continue
            if value:
                return value
        return None

    def snapshot_counters(self, session: net.Session, base_url: str) -> Counters:
        """All Prometheus samples of the engine right now."""
        where = f"GET {base_url}{self.metrics_path}"
        try:
            response = session.get(base_url + self.metrics_path, timeout=10)
        except (net.BodyTooLarge, net.RedirectRefused) as exc:
            return Counters({}, False, time.monotonic(), f"{where}: {exc}", malformed=True)
        except requests.RequestException as exc:
            return _no_counters(f"{where}: no response ({type(exc).__name__})")
        if response.status_code != 200:
            return _no_counters(f"{where}: HTTP {response.status_code}")
        try:
            return parse_counters(response.text)
        except (ValueError, TypeError, IndexError) as exc:
            problem = f"{where}: not Prometheus text ({_short(str(exc))})"
            return Counters({}, False, time.monotonic(), problem, malformed=True)

    def post_json(
        self, session: net.Session, url: str, body: Mapping[str, object]
    ) -> tuple[dict[str, object], float]:
        """One JSON POST to the engine: its answer object and the seconds it took;
        EngineHTTPError (named, with the request) on any failure."""
        started = time.monotonic()
        try:
            response = session.post(url, json=body, timeout=self.request_timeout_s)
        except requests.Timeout as exc:
            raise EngineHTTPError.answered(
                f"POST {url}",
                None,
                f"no answer within {self.request_timeout_s:g} s (request timeout)",
                timed_out=True,
            ) from exc
        except requests.RequestException as exc:
            raise EngineHTTPError.answered(f"POST {url}", None, str(exc)) from exc
        seconds = time.monotonic() - started
        if response.status_code != 200:
            raise EngineHTTPError.answered(f"POST {url}", response.status_code, response.text)
        try:  # NaN/Infinity literals are read: a NaN logprob is what the nan check looks for
            payload = jsontext.loads(response.content, nonfinite=True)
        except ValueError as exc:
            raise EngineHTTPError.answered(f"POST {url}", response.status_code, "not JSON") from exc
        if not isinstance(payload, dict):
            raise EngineHTTPError.answered(f"POST {url}", response.status_code, "not a JSON object")
        return payload, seconds


def optional_float(value: Any) -> float | None:
    """A number an engine sent, or None where it sent null or something else."""
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
