"""What every engine adapter offers (the values it answers in are :mod:`.values`).

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

import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from typing import ClassVar

from packaging.version import Version

from sparkbuild import net
from sparkbuild.adapters import versions
from sparkbuild.adapters.facts import (
    BenchCounters,
    BinaryPreflight,
    MemoryFacts,
    PreflightFacts,
    RecipeFacts,
    ReleaseTags,
    SourceBuild,
)
from sparkbuild.adapters.http import EngineHTTP
from sparkbuild.adapters.values import (
    Acceptance,
    Counters,
    Generation,
    Layout,
    PositionCounts,
    RankCommand,
    RankPlace,
    last_float,
    token_count,
)


def _signal(name: str, kind: str, used_for: str) -> dict[str, str]:
    return {"name": name, "kind": kind, "used_for": used_for}


class EngineAdapter(EngineHTTP, ABC):
    """Everything sparkbuild knows about one engine: launch flags, endpoints, counters and
    log formats, and the facts each stage reads (:mod:`.facts`), behind one interface.

    An engine's module defines one subclass and names it ``ADAPTER``; :mod:`.known` finds
    it. No other module names an engine (``tests/test_engine_names.py``).
    """

    name: ClassVar[str]
    #: How people write the engine's name (messages).
    display_name: ClassVar[str]
    source_build: ClassVar[SourceBuild] = SourceBuild()
    #: How the engine's release tags name versions (``releases``, ``bump``, a spec's ref).
    release_tags: ClassVar[ReleaseTags] = ReleaseTags()
    #: What preflight runs: a Python engine's boot path under the probe, or a built
    #: program's own answers (:class:`BinaryPreflight`).
    preflight: ClassVar[PreflightFacts | BinaryPreflight]
    recipes: ClassVar[RecipeFacts]
    #: How the engine sizes its memory (None: no estimate before its boot).
    memory: ClassVar[MemoryFacts | None] = None
    #: The metrics and response fields smoke and bench rely on, each with what for; preflight
    #: looks for them in the release's source (:meth:`preflight_signals`).
    relied_metrics: ClassVar[tuple[tuple[str, str], ...]] = ()
    relied_fields: ClassVar[tuple[tuple[str, str], ...]] = ()
    #: The engine's own counters and timing histograms bench reads.
    bench_counters: ClassVar[BenchCounters] = BenchCounters()
    default_port: ClassVar[int]
    default_launcher: ClassVar[tuple[str, ...]]
    ready_line: ClassVar[re.Pattern[str]]
    boot_phases: ClassVar[tuple[tuple[str, re.Pattern[str]], ...]] = ()  # boot_phases.py
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
        super().__init__(request_timeout_s)
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
        return token_count(value) if value is not None else None

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
    def distributions(cls) -> tuple[str, ...]:
        """The Python distributions a launch of the engine starts from (the image audit
        follows them to what a launch loads). A built program has none: its own binaries
        and libraries are the device code there is to read."""
        facts = cls.preflight
        return facts.probe.distributions if isinstance(facts, PreflightFacts) else ()

    @classmethod
    def profile_args(cls, model: str, args: Sequence[str]) -> list[str]:
        """A profile's ``args`` as the engine gets them for ``model``: what the adapter
        fills in them (none by default; llama.cpp's ``{model}``, the served model)."""
        return list(args)

    @classmethod
    def launcher_flags(cls, args: Sequence[str]) -> list[str]:
        """Flags the launcher adds to a profile's own ``args`` on every launch (what smoke and
        bench read from the engine), none that ``args`` already has. A recipe exported from
        the profile carries them, so sparkrun runs what smoke ran."""
        return []

    @classmethod
    def recipe_serve_words(cls, model: str) -> list[str]:
        """The serve command sparkrun starts for ``model`` when a recipe has no command (its
        first prefix and the model; an engine whose model flag depends on the model, such
        as a hub repo or a local file, says so)."""
        return [*cls.recipes.prefixes[0], model]

    @classmethod
    def recipe_export_command(cls, model: str) -> str:
        """The first line of the serve command an exported recipe writes for ``model``
        (``{model}``: sparkrun fills it)."""
        return cls.recipes.export_command

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
        return f"{self.endpoints.metrics}: {problem}" if problem else ""

    @abstractmethod
    def acceptance_over(self, before: Counters, after: Counters) -> Acceptance:
        """Acceptance over the interval, from counters known to be possible."""

    def impossible_counts(self, before: Counters, after: Counters) -> str:
        """What the engine's counters claim that cannot be (more accepted than drafted), or
        empty; each engine knows its own counters."""
        return ""

    def acceptance_from_responses(
        self, responses: Sequence[Mapping[str, object]]
    ) -> Acceptance | None:
        """Acceptance from per-response fields (an answer's :attr:`response_extras`), when
        the engine returns them (None otherwise)."""
        return None

    def acceptance_from_generations(self, generations: Sequence[Generation]) -> Acceptance | None:
        """Acceptance from per-request fields, when the engine returns them (None otherwise)."""
        return self.acceptance_from_responses([g.raw for g in generations])

    def acceptance(
        self,
        before: Counters,
        after: Counters,
        generations: Sequence[Generation] = (),
        responses: Sequence[Mapping[str, object]] = (),
    ) -> Acceptance:
        """The best measurement available: per-request fields (of ``generations``, or of
        streamed ``responses``), else counter deltas."""
        per_request = self.acceptance_from_generations(generations) if generations else None
        if per_request is None and responses:
            per_request = self.acceptance_from_responses(responses)
        if per_request is not None and (per_request.active or per_request.impossible):
            return per_request
        return self.acceptance_from_delta(before, after)

    def nan_count_from_delta(self, before: Counters, after: Counters) -> float | None:
        """Requests the engine flagged as NaN/corrupted in the interval (None: no counter)."""
        return None

    def acceptance_from_log(self, lines: Sequence[str]) -> float | None:
        """The last acceptance length the engine logged (a lifetime/windowed figure)."""
        return last_float(self.accept_line, lines)
