"""One smoke run: boot (or reach) the engine, send the profile's requests, judge the results."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkbuild.adapters import Acceptance, EngineAdapter, Generation
from sparkbuild.adapters.versions import disagree
from sparkbuild.checks import CheckResult, Verdict
from sparkbuild.engines.cluster_target import MultiNodeTarget, NodeImage
from sparkbuild.engines.compile_cache import (
    CompileCache,
    CompilePhase,
    CompileWatch,
    Usage,
    phase,
)
from sparkbuild.engines.host_watch import HostRun, HostWatch, Watch
from sparkbuild.engines.launch import LaunchSettings, settled_counters
from sparkbuild.engines.logs import engine_lines
from sparkbuild.engines.profiles import CustomPrompt, Parallel, SmokeProfile
from sparkbuild.engines.prompts import PROMPT_SETS, Prompt
from sparkbuild.engines.signatures import Diagnosis, Evidence, diagnose
from sparkbuild.engines.targets import Readiness, Target, boot_detail, wait_ready
from sparkbuild.errors import CompileCapError, EngineHTTPError
from sparkbuild.jsontext import JsonObject
from sparkbuild.smoke import checks
from sparkbuild.smoke.deep.evidence import RequestEvidence
from sparkbuild.smoke.deep.plan import DeepPlan
from sparkbuild.smoke.deep.run import DeepRun

EXCERPT_LINES = 40


@dataclass(frozen=True)
class SmokeResult:
    verdict: Verdict
    profile: str
    engine: str
    model: str
    target_kind: str
    target: str
    boot_seconds: float | None
    accept_len: float | None
    checks: list[CheckResult]
    diagnoses: list[Diagnosis] = field(default_factory=list)
    log_excerpt: list[str] = field(default_factory=list)
    log_file: str | None = None
    image_id: str | None = None
    seconds: float = 0.0  # wall time from start to verdict
    generations: list[Generation] = field(default_factory=list, repr=False)
    engine_version: str | None = None  # the image's label or --engine-version, else the server's
    served_version: str | None = None  # what the engine that answered reported (/version)
    nan_signal: str = ""  # which NaN detection was active, as the engine version reads it
    cluster: ClusterRun | None = None  # a multi-node run: its topology and every node's image
    before_boot: dict[str, Any] | None = None  # the memory fit and page cache (boot_prep)
    # What came back, per request: the first and last characters, finish reason, tokens.
    evidence: list[RequestEvidence] = field(default_factory=list)
    declared: tuple[str, ...] = ()  # the deep checks the profile declares (publish needs them)
    compile: CompilePhase | None = None  # the boot's compiling, with the image's compile cache
    host: HostRun | None = None  # every node's facts, the drift, the memory guard, boot phases

    @property
    def versions_disagree(self) -> bool:
        """The image declares one release and the engine that answered reports another."""
        return disagree(self.engine_version, self.served_version)

    def check(self, name: str) -> CheckResult:
        return next(c for c in self.checks if c.name == name)

    @property
    def verified(self) -> bool:
        """Whether sparkbuild saw which image ran: only containers it started, whose image
        id it read from the containers themselves (on a cluster, every node's must be the
        same). A command or URL run cannot show what ran."""
        if self.target_kind == "cluster":
            return self.cluster is not None and self.cluster.verified(self.image_id)
        return self.target_kind == "image" and bool(self.image_id)

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "profile": self.profile,
            "engine": self.engine,
            "model": self.model,
            "target": {"kind": self.target_kind, "value": self.target, "image_id": self.image_id},
            "boot_seconds": self.boot_seconds,
            "accept_len": self.accept_len,
            "seconds": round(self.seconds, 2),
            "checks": [_check_json(c) for c in self.checks],
            "diagnoses": [
                {
                    "id": d.id,
                    "diagnosis": d.diagnosis,
                    "remedy": d.remedy,
                    "line": d.line,
                    "source": d.source,
                }
                for d in self.diagnoses
            ],
            "log_excerpt": self.log_excerpt,
            "log_file": self.log_file,
            "engine_version": self.engine_version,
            "served_version": self.served_version,
            "versions_disagree": self.versions_disagree,
            "nan_signal": self.nan_signal,
            "cluster": self.cluster.to_json() if self.cluster else None,
            "verified": self.verified,
            "before_boot": self.before_boot,
            "host": self.host.to_json() if self.host else None,
            "declared": list(self.declared),
            "evidence": [e.to_json() for e in self.evidence],
            "compile": self.compile.to_json() if self.compile else None,
        }


@dataclass(frozen=True)
class ClusterRun:
    """What a multi-node run was: its layout and launcher, and the id each node ran."""

    name: str
    topology: Parallel
    launcher: str
    nodes: tuple[NodeImage, ...]
    failed: str | None = None

    @classmethod
    def of(cls, target: MultiNodeTarget) -> ClusterRun:
        return cls(
            target.cluster_name,
            target.parallel,
            target.launcher_name,
            tuple(target.node_images),
            target.failed,
        )

    def verified(self, pin: str | None) -> bool:
        """Every node ran ``pin``, read from its own container."""
        return bool(pin) and bool(self.nodes) and all(n.ran_image_id == pin for n in self.nodes)

    def to_json(self) -> JsonObject:
        return {
            "name": self.name,
            "topology": self.topology.model_dump(exclude={"launcher"}),
            "launcher": self.launcher,
            "nodes": [
                {"name": n.node, "endpoint": n.endpoint, "rank": n.rank, "image_id": n.ran_image_id}
                for n in self.nodes
            ],
            "failed": self.failed,
        }


def _check_json(check: CheckResult) -> dict[str, object]:
    return {
        "name": check.name,
        "status": check.status,
        "value": check.value,
        "detail": check.detail,
    }


def profile_prompts(profile: SmokeProfile) -> list[Prompt]:
    prompts: list[Prompt] = []
    for item in profile.prompts:
        if isinstance(item, CustomPrompt):
            name = item.name or f"custom/{len(prompts) + 1}"
            prompts.append(Prompt(name, item.text, item.expect_repetition))
        else:
            prompts.extend(PROMPT_SETS[item])
    return prompts


def nan_signal(profile: SmokeProfile, adapter: EngineAdapter, owns_engine: bool) -> str:
    """One line for the report: which NaN detection was active in this run."""
    if not owns_engine:
        return "set by whoever started the engine (not by this run)"
    if not profile.expect.nan_switch:
        return "off (expect.nan_switch: false): logprobs and the output only"
    return adapter.nan_switch().describe()


@dataclass
class _Served:
    generations: list[Generation]
    names: list[str]
    exempt: list[bool]
    errors: list[EngineHTTPError]
    acceptance: Acceptance | None
    nan_count: float | None
    engine_version: str | None = None  # as the server reports it


def serve_prompts(
    adapter: EngineAdapter,
    base_url: str,
    prompts: Sequence[Prompt],
    profile: SmokeProfile,
    progress: Callable[[str], None],
    *,
    ranked: int = 0,
    extra: Mapping[str, object] | None = None,
) -> _Served:
    """The profile's requests, one after another (``ranked``: with that many alternatives
    per token and the token ids; ``extra``: the request fields, the profile's by default)."""
    session = adapter.session()
    before = adapter.snapshot_counters(session, base_url)
    served = _Served([], [], [], [], None, None, adapter.server_version(session, base_url))
    for prompt in prompts:
        progress(f"request {prompt.name}")
        try:
            generation = adapter.generate(
                session,
                base_url,
                prompt.text,
                profile.expect.max_tokens,
                profile.request if extra is None else extra,
                ranked=ranked,
            )
        except EngineHTTPError as exc:
            served.errors.append(exc)
            if exc.timed_out:  # a hung engine answers none of the rest either
                left = len(prompts) - len(served.generations) - len(served.errors)
                if left:
                    progress(f"engine hung; {left} request(s) not sent")
                break
            continue
        served.generations.append(generation)
        served.names.append(prompt.name)
        served.exempt.append(prompt.expect_repetition)
    after = settled_counters(adapter, session, base_url)
    for snapshot in (before, after):  # a garbled /metrics is a misbehaving engine
        if snapshot.malformed and not any(e.what.endswith("/metrics") for e in served.errors):
            what, _, detail = snapshot.problem.partition(": ")
            served.errors.append(EngineHTTPError.answered(what, 200, detail))
    impossible = adapter.impossible(before, after)
    if impossible:  # an engine whose counters cannot be true is misbehaving
        metrics = f"GET {base_url}{adapter.endpoints.metrics}"
        served.errors.append(EngineHTTPError.answered(metrics, 200, impossible))
    if served.generations:
        served.acceptance = adapter.acceptance(before, after, served.generations)
    served.nan_count = None if impossible else adapter.nan_count_from_delta(before, after)
    return served


def expecting(profile: SmokeProfile, launch: LaunchSettings) -> SmokeProfile:
    """The profile with the command line's boot and request timeouts as its expectations.

    Smoke reads ``--boot-timeout``/``--request-timeout`` as overrides of the profile's
    ``expect``: the checks, the adapter and the printed bounds all judge by them. (Bench
    keeps the profile's ``expect`` and uses the timeouts for its own plan only.)
    """
    overrides = {
        "boot_timeout_s": launch.boot_timeout_s,
        "request_timeout_s": launch.request_timeout_s,
    }
    chosen = {key: value for key, value in overrides.items() if value is not None}
    if not chosen:
        return profile
    return profile.model_copy(update={"expect": profile.expect.model_copy(update=chosen)})


def request_bound_s(profile: SmokeProfile, prompts: int) -> float:
    """The longest the request phase can take: each request is cut at the profile's
    ``request_timeout_s``, and the first one cut ends the phase (a hung engine answers none
    of the rest), so a hung server costs one timeout, never one per prompt."""
    return prompts * profile.expect.request_timeout_s


def total_bound_s(profile: SmokeProfile, prompts: int) -> float:
    """Boot wait plus the request phase: the most a smoke run waits on the engine."""
    return profile.expect.boot_timeout_s + request_bound_s(profile, prompts)


@dataclass(frozen=True)
class Watched:
    """What a smoke run watches around the engine besides its checks: the compile cache the
    target mounts (measured across the boot, capped by ``expect.compile``) and the hosts (the
    nodes' facts and the memory guard)."""

    compile_cache: CompileCache | None = None
    host: HostWatch | None = None


def run_smoke(
    target: Target,
    adapter: EngineAdapter,
    profile: SmokeProfile,
    profile_name: str,
    *,
    progress: Callable[[str], None] = lambda _message: None,
    waiting: Callable[[str], None] = lambda _detail: None,
    deep: DeepPlan | None = None,
    watched: Watched = Watched(),
) -> SmokeResult:
    """Run every check against ``target``; the target is started and always stopped here.
    ``progress`` hears each stage (boot, each request), ``waiting`` the boot wait's live
    detail (seconds waited, the engine's last log line). ``deep``: the deep checks to run
    as well (smoke/deep/). ``watched``: the compile cache and the hosts around the run."""
    began = time.monotonic()
    deep_run = DeepRun(deep, adapter, profile, progress) if deep is not None else None
    expect = profile.expect
    compile_cache = watched.compile_cache
    cache = (compile_cache, compile_cache.usage()) if compile_cache is not None else None
    with Watch(watched.host, target, adapter) as watch, target:
        try:
            readiness, compiled = (
                _boot(target, adapter, profile, cache, progress, waiting)
                if target.owns_engine
                else (None, None)
            )
        except CompileCapError as over:
            failed = _boot_failure(
                target, adapter, profile, profile_name, Readiness("timeout", 0.0), began
            )
            lines = target.logs.since(0) if target.logs is not None else []
            compiled = phase(*cache, lines, adapter.compile_line) if cache else None
            return _with_host(_over_cap(failed, over, compiled), watch.finish(None))
        if readiness is not None and not readiness.ready:
            failed = _boot_failure(target, adapter, profile, profile_name, readiness, began)
            failed = _with_host(dataclasses.replace(failed, compile=compiled), watch.finish(None))
            return _deep_not_run(failed, deep_run)
        run_from = target.logs.count if target.logs is not None else 0
        prompts = profile_prompts(profile)
        progress(f"requests: at most {request_bound_s(profile, len(prompts)):g} s in all")
        if deep_run is not None:
            deep_run.before_requests(target.base_url)
        served = serve_prompts(
            adapter,
            target.base_url,
            prompts,
            profile,
            progress,
            ranked=deep.ranked if deep else 0,
            extra=deep_run.request_extra(profile.request) if deep_run else None,
        )
        run_to = target.logs.count if target.logs is not None else 0
        answered = _engine_answers(served, target)
        if deep_run is not None and answered:
            if target.kind in ("image", "cluster"):
                deep_run.image_id = getattr(target, "image_id", None)
            deep_run.on_engine(target.base_url, prompts, served.names, served.generations)
        exited = target.exit_code()
        host_run = watch.finish(readiness.seconds if readiness else None)
    if deep_run is not None and answered:
        deep_run.after_engine()
    if exited is None and isinstance(target, MultiNodeTarget) and target.failed:
        # A killed leader fails the requests before its daemon says so; the cluster's stop
        # names the rank that went (never one it stopped itself).
        exited = target.exit_code()
    all_lines = target.logs.since(0) if target.logs is not None else []
    run_lines = target.logs.since(run_from)[: run_to - run_from] if target.logs is not None else []
    nan_lines = [line for line in run_lines if adapter.nan_line.search(line)]
    error_lines = [line for line in run_lines if adapter.error_line.search(line)]
    nan_responses = [e for e in served.errors if adapter.nan_response.search(e.body)]
    if exited is not None:
        error_lines.append(f"{target.describe_exit(exited)} during the requests")
    engine_nans = served.nan_count if expect.nan_counter else None
    results = [
        checks.check_boot(readiness, expect.boot_timeout_s, [], []),
        *_cluster_checks(target),
        checks.check_accept_len(served.acceptance, expect),
        checks.check_nan(served.generations, engine_nans, nan_lines, nan_responses),
        checks.check_output(
            served.generations,
            served.names,
            served.exempt,
            expect,
            len(served.errors),
            len(nan_responses),
        ),
        checks.check_errors(served.errors, error_lines, expect.max_error_lines, nan_responses),
    ]
    if deep_run is not None:
        results += deep_run.checks(_deep_skip(served, exited, target))
    results += host_run.checks() if host_run is not None else []
    verdict: Verdict = "fail" if any(r.status == "fail" for r in results) else "pass"
    interesting = [*nan_lines, *error_lines] if verdict == "fail" else []
    return SmokeResult(
        verdict=verdict,
        profile=profile_name,
        engine=adapter.name,
        model=profile.model,
        target_kind=target.kind,
        target=target.description,
        boot_seconds=round(readiness.seconds, 2) if readiness else None,
        accept_len=_accept_value(served.acceptance),
        checks=results,
        diagnoses=_diagnoses(all_lines, adapter, served, results) if verdict == "fail" else [],
        log_excerpt=_excerpt(interesting, run_lines),
        log_file=_log_file(target),
        image_id=getattr(target, "image_id", None),
        seconds=time.monotonic() - began,
        generations=served.generations,
        engine_version=str(adapter.version) if adapter.version else served.engine_version,
        served_version=served.engine_version,
        nan_signal=nan_signal(profile, adapter, target.owns_engine),
        cluster=ClusterRun.of(target) if isinstance(target, MultiNodeTarget) else None,
        evidence=[
            *(
                RequestEvidence.of("smoke", n, g)
                for n, g in zip(served.names, served.generations, strict=True)
            ),
            *(deep_run.evidence if deep_run else ()),
        ],
        declared=deep.declared if deep else (),
        compile=compiled,
        host=host_run,
    )


def _boot(
    target: Target,
    adapter: EngineAdapter,
    profile: SmokeProfile,
    cache: tuple[CompileCache, Usage] | None,
    progress: Callable[[str], None],
    waiting: Callable[[str], None],
) -> tuple[Readiness, CompilePhase | None]:
    """Wait for the engine, watching its compile cache (``cache``: with its usage before the
    boot): a CompileCapError when the boot keeps compiling past the profile's cap."""
    expect = profile.expect
    progress(
        f"waiting for {adapter.name} to boot (up to {expect.boot_timeout_s:g} s; "
        f"{total_bound_s(profile, len(profile_prompts(profile))):g} s in all at most)"
    )

    def lines() -> list[str]:
        return target.logs.since(0) if target.logs is not None else []

    cap = expect.compile.max_seconds if expect.compile else None
    watch = CompileWatch(*cache, cap, lines, adapter.compile_line) if cache else None

    def waited(seconds: float, line: str) -> None:
        if watch is not None:
            watch(seconds)
        waiting(boot_detail(seconds, line))

    readiness = wait_ready(target, adapter, expect.boot_timeout_s, waiting=waited)
    return readiness, watch.measured() if watch else None


def _over_cap(
    failed: SmokeResult, over: CompileCapError, compiled: CompilePhase | None
) -> SmokeResult:
    """The boot stopped for compiling past the cap: its check says so, and what grew."""
    boot = CheckResult("boot", "fail", over.message)
    return dataclasses.replace(failed, checks=[boot, *failed.checks[1:]], compile=compiled)


def _deep_not_run(failed: SmokeResult, deep_run: DeepRun | None) -> SmokeResult:
    """A failed boot's result with the deep checks it could not run."""
    if deep_run is None:
        return failed
    return dataclasses.replace(
        failed,
        checks=[*failed.checks, *deep_run.checks("engine did not boot")],
        declared=deep_run.plan.declared,
    )


def _with_host(result: SmokeResult, host: HostRun | None) -> SmokeResult:
    """A failed boot's result with its hosts and the guard's check (when the guard stopped
    the boot, the boot check says the engine exited; this one says why)."""
    guarded = host.check() if host is not None else None
    checks = [*result.checks, guarded] if guarded is not None else result.checks
    return dataclasses.replace(result, checks=checks, host=host)


def _engine_answers(served: _Served, target: Target) -> bool:
    """Whether the engine is worth more requests: it did not hang or exit (an engine that
    answered with errors, NaN ones among them, still has the deep checks to fail)."""
    hung = any(e.timed_out for e in served.errors)
    return not hung and target.exit_code() is None


def _deep_skip(served: _Served, exited: int | None, target: Target) -> str:
    if exited is not None:
        return f"not run: {target.describe_exit(exited)} during the requests"
    if any(e.timed_out for e in served.errors):
        return "not run: the engine hung during the smoke's requests"
    return "not run: the smoke's own requests got no answer"


def _diagnoses(
    lines: Sequence[str], adapter: EngineAdapter, served: _Served, results: Sequence[CheckResult]
) -> list[Diagnosis]:
    """Known failures found in the log, the HTTP errors and the failed checks."""
    evidence = Evidence(
        http=[e.message for e in served.errors],
        checks={r.name: r.detail for r in results if r.status == "fail"},
    )
    return diagnose(lines, adapter.name, evidence=evidence)


def _cluster_checks(target: Target) -> list[CheckResult]:
    """A cluster adds one check: every rank joined the engine's world (from its logs)."""
    if not isinstance(target, MultiNodeTarget):
        return []
    expected, world, ranks = target.joined()
    return [checks.check_ranks(expected, world, ranks, [n.name for n in target.nodes])]


def _accept_value(acceptance: Acceptance | None) -> float | None:
    if acceptance is None or acceptance.accept_len is None:
        return None
    return round(acceptance.accept_len, 3)


def _excerpt(interesting: Sequence[str], lines: Sequence[str]) -> list[str]:
    """The lines worth showing, then the log's tail; HTTP access lines (one per request)
    say nothing about a failure and would push out what does."""
    tail = engine_lines(lines)[-EXCERPT_LINES:]
    picked = [line for line in interesting[:10] if line not in tail]
    return [*picked, *tail][-EXCERPT_LINES:]


def _log_file(target: Target) -> str | None:
    if target.logs is not None and target.logs.path is not None:
        return str(target.logs.path)
    return None


def _boot_failure(
    target: Target,
    adapter: EngineAdapter,
    profile: SmokeProfile,
    profile_name: str,
    readiness: Readiness,
    began: float,
) -> SmokeResult:
    lines = target.logs.since(0) if target.logs is not None else []
    diagnoses = diagnose(lines, adapter.name)
    boot = checks.check_boot(
        readiness, profile.expect.boot_timeout_s, lines, diagnoses, target.describe_exit
    )
    skipped = [
        CheckResult(name, "skip", "engine did not boot")
        for name in checks.CHECK_NAMES
        if name != "boot"
    ]
    if isinstance(target, MultiNodeTarget):
        expected, world, ranks = target.joined()
        joined = checks.check_ranks(expected, world, ranks, [n.name for n in target.nodes])
        skipped.insert(
            0,
            joined
            if joined.status == "fail"
            else CheckResult("ranks", "skip", "engine did not boot"),
        )
    return SmokeResult(
        verdict="fail",
        profile=profile_name,
        engine=adapter.name,
        model=profile.model,
        target_kind=target.kind,
        target=target.description,
        boot_seconds=None,
        accept_len=None,
        checks=[boot, *skipped],
        diagnoses=diagnoses,
        log_excerpt=_excerpt([d.line for d in diagnoses], lines),
        log_file=_log_file(target),
        image_id=getattr(target, "image_id", None),
        seconds=time.monotonic() - began,
        engine_version=str(adapter.version) if adapter.version else None,
        nan_signal=nan_signal(profile, adapter, target.owns_engine),
        cluster=ClusterRun.of(target) if isinstance(target, MultiNodeTarget) else None,
    )


__all__ = [
    "ClusterRun",
    "SmokeResult",
    "Watched",
    "expecting",
    "nan_signal",
    "profile_prompts",
    "run_smoke",
    "serve_prompts",
]
