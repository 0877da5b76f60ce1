"""One sweep against one engine: boot (or reach) it, calibrate prompts, run every cell.

Per cell: prompts for all its runs are made first (tokenizer calls never overlap a timed run);
then for each run the engine's counters are read once they settle, the cell's ``concurrency``
streams are sent at once, and the counters are read again. The cell's acceptance length comes
from the deltas over its own runs only.

If the engine dies, the sweep stops: the report keeps every finished cell, names the rest in
``pending_cells`` and carries the error; the caller writes it and exits 1.

What the engine says about itself (model, length, version, token counts) is asked in
:mod:`~sparkbuild.bench.served`; how the sweep shows its progress is :mod:`~.progress`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx

from sparkbuild import __version__, console, net
from sparkbuild.adapters import Counters, EngineAdapter
from sparkbuild.bench import HARNESS_VERSION
from sparkbuild.bench.checkpoint import UNFINISHED, ProcessClock, sweep_time, write_checkpoint
from sparkbuild.bench.client import StreamResult, make_client, stream_many
from sparkbuild.bench.engine_timing import (
    Histogram,
    TimingSnapshot,
    engine_delta,
    snapshot_timing,
)
from sparkbuild.bench.host import host_info
from sparkbuild.bench.progress import Progress, SilentProgress
from sparkbuild.bench.prompts import PROMPT_RECIPE, BenchPrompt, PromptFactory
from sparkbuild.bench.results import (
    MAX_ERROR_SAMPLES,
    BenchReport,
    CellResult,
    EngineInfo,
    EngineTiming,
    HarnessInfo,
    NodeInfo,
    ProcessSpan,
    PromptInfo,
    Resumed,
    RunFigures,
    Speculation,
    TargetInfo,
    cell_stats,
    client_percentiles,
    run_figures,
    run_flags,
)
from sparkbuild.bench.served import ServedEngine
from sparkbuild.bench.sweep import CellKey, Sweep, fit_to_length, left_out_warning
from sparkbuild.engines.cluster_target import MultiNodeTarget
from sparkbuild.engines.host_watch import HostRun, HostWatch, Watch
from sparkbuild.engines.launch import settled_counters
from sparkbuild.engines.profiles import Parallel
from sparkbuild.engines.signatures import diagnose
from sparkbuild.engines.targets import ContainerTarget, Target, boot_detail, probe, wait_ready
from sparkbuild.errors import EngineBootError, EngineGoneError, SparkbuildError, UsageError
from sparkbuild.redact import secret_args, secret_env

WARMUP_TOKENS = 8
#: How long one stream may take before the client gives up on it (``--request-timeout``).
STREAM_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class SweepSettings:
    """What is measured: the grid (with runs, seed and warm-up) and the name of the run."""

    sweep: Sweep
    label: str | None = None  # None: named after the profile and target, or the URL


@dataclass(frozen=True)
class BenchPlan:
    """What to measure and how the engine was configured (for the report)."""

    sweep: Sweep
    label: str
    profile: str | None
    model: str
    args: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    request: Mapping[str, object] = field(default_factory=dict)  # extra request fields
    boot_timeout_s: float = 900.0
    request_timeout_s: float = STREAM_TIMEOUT_S
    topology: Parallel | None = None  # the profile's parallel layout; None: unknown
    before_boot: Mapping[str, object] | None = None  # the memory fit and page cache (boot_prep)
    host: HostWatch | None = None  # the nodes' facts and the memory guard (engines/host_watch)
    # bench --resume: the cells already measured (carried, not run), where they came from,
    # the earlier processes' spans, and the check of the engine once it answers.
    done: tuple[CellResult, ...] = ()
    resumed: Resumed | None = None
    earlier: tuple[ProcessSpan, ...] = ()
    engine_check: Callable[[EngineInfo], None] | None = None
    # Where the report is written after every finished cell (None: nowhere until the end).
    checkpoint: Path | None = None


def _target_info(target: Target) -> TargetInfo:
    info = TargetInfo(kind=target.kind, value=target.description)
    if isinstance(target, MultiNodeTarget):
        nodes = [
            NodeInfo(name=n.node, endpoint=n.endpoint, rank=n.rank, image_id=n.ran_image_id)
            for n in target.node_images
        ]
        update = {"image_id": target.image_id, "launcher": target.launcher_name, "nodes": nodes}
        return info.model_copy(update=update)
    if isinstance(target, ContainerTarget) and target.image_id:
        return info.model_copy(
            update={"image_id": target.image_id, "repo_digests": _repo_digests(target.image_id)}
        )
    return info


def _repo_digests(image_id: str) -> list[str]:
    try:
        from sparkbuild import dockerhost

        attrs = dockerhost.client().images.get(image_id).attrs
        return list(attrs.get("RepoDigests") or [])
    except Exception:  # the digest list is a nicety; the image id identifies the image
        return []


class Sweeper:
    """Runs the cells of one plan against a ready engine."""

    def __init__(
        self,
        target: Target,
        adapter: EngineAdapter,
        plan: BenchPlan,
        progress: Progress,
    ) -> None:
        self.target = target
        self.adapter = adapter
        self.plan = plan
        self.progress = progress
        self.session = net.Session(deadline_s=plan.request_timeout_s)
        self.cells: list[CellResult] = []
        self.request_index = 0
        self.all_exact = True
        self.on_cell: Callable[[], None] = lambda: None  # after every finished cell
        self.client: httpx.AsyncClient | None = None  # the streams' client, once made

    def _alive(self) -> bool:
        if self.target.exit_code() is not None:
            return False
        return probe(self.session, self.target.base_url + self.adapter.endpoints.health, 5.0) == 200

    def _counters(self) -> tuple[Counters, TimingSnapshot]:
        """Counters once settled, then the timing histograms (the engine is idle by then)."""
        counters = settled_counters(self.adapter, self.session, self.target.base_url)
        return counters, snapshot_timing(self.adapter, self.session, self.target.base_url)

    def _body(self, engine: ServedEngine, prompt: BenchPrompt, tokens: int) -> dict[str, object]:
        """The adapter's streamed completion of exactly ``tokens`` tokens."""
        return self.adapter.stream_body(engine.served_model, prompt.text, tokens, self.plan.request)

    async def _stream(self, bodies: Sequence[Mapping[str, object]]) -> list[StreamResult]:
        assert self.client is not None, "the sweep's client is made before the first cell"
        extras = self.adapter.response_extras
        return await stream_many(self.client, bodies, self.adapter.endpoints.completions, extras)

    def fit(self, engine: ServedEngine) -> None:
        """Leave out the cells longer than the engine serves (warned); refuse when none fit.
        The profile's own limit was applied before the boot (``fit_plan``)."""
        whose = "the engine's max_model_len"
        limit = engine.max_model_len
        fitted, dropped = fit_to_length(self.plan.sweep, limit, whose)
        if dropped and limit is not None:
            console.warn(left_out_warning(dropped, limit, whose))
            self.plan = replace(self.plan, sweep=fitted)

    async def sweep(self, engine: ServedEngine, factory: PromptFactory) -> None:
        sweep = self.plan.sweep
        if sweep.warmup:
            self.progress.phase("warm-up request")
            warm = await factory.prompts(32, [self._next_indices(1)[0]])
            await self._stream([self._body(engine, warm[0], WARMUP_TOKENS)])
        factory.cell_digest()  # the warm-up's prompt is the sweep's, no cell's
        total = sweep.cell_count
        done = {cell.key: cell for cell in self.plan.done}
        for index, key in enumerate(sweep.cells()):
            if key in done:
                self.progress.carried(index, total, key)
                self.cells.append(await self._carry(factory, done[key]))
            else:
                self.progress.cell(index, total, key)
                self.cells.append(await self.cell(engine, factory, key))
                self.progress.cell_done(self.cells[-1])
            self.on_cell()

    async def _carry(self, factory: PromptFactory, cell: CellResult) -> CellResult:
        """A cell the run resumed measured, as it was. Its prompts are made again, not sent:
        the requests after it keep their numbers, the sweep's fingerprint is an
        uninterrupted sweep's, and they are held against the ones it was measured with."""
        await self._prompts(factory, cell.key)
        made = factory.cell_digest()
        if cell.prompts_sha256 is not None and cell.prompts_sha256 != made:
            raise UsageError(
                f"the prompts this run makes for {cell.key.label()} differ from the ones that "
                "sweep sent (another tokenizer or prompt recipe): its cells cannot be carried",
                "start a new sweep without --resume",
            )
        return cell

    def _next_indices(self, n: int) -> list[int]:
        first = self.request_index
        self.request_index += n
        return list(range(first, first + n))

    async def _prompts(
        self, factory: PromptFactory, key: CellKey
    ) -> tuple[list[BenchPrompt], list[BenchPrompt]]:
        """The cell's prompts and context loads (:meth:`_made_prompts`); an engine that stops
        answering meanwhile ends the sweep as it would during a run."""
        try:
            prompts, loads = await self._made_prompts(factory, key)
        except (SparkbuildError, httpx.HTTPError) as exc:
            if await asyncio.to_thread(self._alive):
                raise
            raise EngineGoneError(
                f"the engine stopped answering while preparing the prompts of {key.label()}: {exc}",
                self._log_hint(),
            ) from exc
        self.all_exact = self.all_exact and all(p.exact for p in [*prompts, *loads])
        return prompts, loads

    async def _made_prompts(
        self, factory: PromptFactory, key: CellKey
    ) -> tuple[list[BenchPrompt], list[BenchPrompt]]:
        """The cell's prompts, and with prefix caching (and depth) each one's context load."""
        indices = self._next_indices(self.plan.sweep.runs * key.concurrency)
        if self.plan.sweep.prefix_caching and key.depth > 0:
            pairs = await factory.context_prompts(key.depth, key.pp, indices)
            return [whole for _, whole in pairs], [context for context, _ in pairs]
        return await factory.prompts(key.prompt_tokens, indices), []

    async def cell(self, engine: ServedEngine, factory: PromptFactory, key: CellKey) -> CellResult:
        runs = self.plan.sweep.runs
        self.progress.phase(f"preparing {runs * key.concurrency} prompts for {key.label()}")
        prompts, loads = await self._prompts(factory, key)
        cell_before, cell_timing = await asyncio.to_thread(self._counters)
        before, timing = cell_before, cell_timing
        skipped = _Skipped()  # the context loads, left out of the cell's engine figures
        figures: list[RunFigures] = []
        context_figures: list[RunFigures] = []
        all_results: list[list[StreamResult]] = []
        samples: list[str] = []
        impossible: list[str] = []
        prefix = self.adapter.bench_counters.timing_prefix or ""
        for run in range(runs):
            self.progress.run(run, runs)
            batch = slice(run * key.concurrency, (run + 1) * key.concurrency)
            if loads:
                load_bodies = [self._body(engine, p, key.tg) for p in loads[batch]]
                load_results = await self._stream(load_bodies)
                after, timing_after = await asyncio.to_thread(self._counters)
                skipped.add(before, after, timing, timing_after)
                context_figures.append(run_figures(load_results))
                samples.extend(self._error_samples(load_results, samples))
                before, timing = after, timing_after
            bodies = [self._body(engine, p, key.tg) for p in prompts[batch]]
            results = await self._stream(bodies)
            after, timing_after = await asyncio.to_thread(self._counters)
            accept = self.adapter.acceptance(before, after, responses=_extras(results))
            if accept.impossible:
                impossible.append(
                    f"run {run + 1}: the engine's counters cannot be true "
                    f"({accept.impossible}); accept len not reported"
                )
            measured = engine_delta(timing, timing_after, prefix)
            figures.append(
                run_figures(results, accept.accept_len, measured, key.pp if loads else None)
            )
            all_results.append(results)
            samples.extend(self._error_samples(results, samples))
            before, timing = after, timing_after
            if any(not r.ok for r in results) and not await asyncio.to_thread(self._alive):
                raise EngineGoneError(
                    f"the engine stopped answering during {key.label()} run {run + 1}/{runs}: "
                    f"{next(r.error for r in results if r.error)}",
                    self._log_hint(),
                )
        cell = self._cell_result(
            key, figures, samples, (skipped.counters(cell_before), before), all_results
        )
        whole = engine_delta(skipped.timing(cell_timing), timing, prefix)
        flags = run_flags(figures)
        if loads:
            flags += _prefix_cache_flags(cell.prefix_cache_hit_tokens, key, cell.requests)
        return cell.model_copy(
            update={
                **client_percentiles(all_results, figures),
                "engine": EngineTiming.of(whole) if whole else None,
                "burst_runs": sum(1 for f in figures if f.burst),
                "flags": [*flags, *impossible],
                "context_runs": context_figures,
                "prompts_sha256": factory.cell_digest(),
            }
        )

    @staticmethod
    def _error_samples(results: Sequence[StreamResult], seen: Sequence[str]) -> list[str]:
        fresh: list[str] = []
        for result in results:
            if result.error and result.error not in seen and result.error not in fresh:
                fresh.append(result.error)
        return fresh[: max(MAX_ERROR_SAMPLES - len(seen), 0)]

    def _log_hint(self) -> str:
        logs = self.target.logs
        if logs is None:
            return "check the engine's own log"
        tail = [line for line in logs.tail(200) if line.strip()]
        found = diagnose(tail, self.adapter.name)
        if found:
            return f"{found[0].diagnosis} {found[0].remedy}"
        where = f" (full log: {logs.path})" if logs.path else ""
        return f"last engine log line: {tail[-1][:200] if tail else '(none)'}{where}"

    def _cell_result(
        self,
        key: CellKey,
        runs: Sequence[RunFigures],
        samples: Sequence[str],
        counters: tuple[Counters, Counters],
        results: Sequence[Sequence[StreamResult]],
    ) -> CellResult:
        """The cell's figures; its acceptance from its requests' own counts where the engine
        returns them, else from the counter deltas over its runs."""
        before, after = counters
        answers = [extras for run in results for extras in _extras(run)]
        accept = self.adapter.acceptance(before, after, responses=answers)
        speculation = None
        if accept.active:
            speculation = Speculation(
                accept_len=round(accept.accept_len or 0.0, 4),
                steps=accept.steps,
                tokens=accept.tokens,
                source=accept.source,
            )
        good_requests = sum(run.requests - run.errors for run in runs)
        generated = self.adapter.bench_counters.generated
        hits = self.adapter.bench_counters.prefix_hits
        stats = cell_stats(runs)
        return CellResult(
            pp=key.pp,
            tg=key.tg,
            depth=key.depth,
            concurrency=key.concurrency,
            ttft_s=stats["ttft_s"],
            prefill_tps=stats["prefill_tps"],
            prefill_tps_aggregate=stats["prefill_tps_aggregate"],
            decode_tps_request=stats["decode_tps_request"],
            decode_tps_aggregate=stats["decode_tps_aggregate"],
            decode_tps_engine=stats["decode_tps_engine"],
            output_tps=stats["output_tps"],
            accept_len=speculation.accept_len if speculation else None,
            speculation=speculation,
            prompt_tokens_target=key.prompt_tokens,
            prompt_tokens=_per_request(sum(r.prompt_tokens for r in runs), good_requests),
            completion_tokens=_per_request(sum(r.completion_tokens for r in runs), good_requests),
            requests=sum(run.requests for run in runs),
            errors=sum(run.errors for run in runs),
            error_samples=list(samples),
            engine_generation_tokens=after.delta(before, generated) if generated else None,
            prefix_cache_hit_tokens=after.delta(before, hits) if hits else None,
            runs=list(runs),
        )


class _Skipped:
    """The engine counters and timing of the context loads, which a cell's engine figures
    leave out: summed here and added to the cell's baseline, so the cell's deltas cover only
    its measured requests."""

    def __init__(self) -> None:
        self._counts: dict[str, float] = {}
        self._histograms: dict[str, Histogram] = {}

    def add(
        self, before: Counters, after: Counters, timing: TimingSnapshot, later: TimingSnapshot
    ) -> None:
        for name, value in after.values.items():
            self._counts[name] = self._counts.get(name, 0.0) + value - before.values.get(name, 0.0)
        for name, histogram in later.histograms.items():
            grown = histogram.minus(timing.histograms.get(name))
            if grown is not None:  # a count that went down is flagged where the cell is read
                self._histograms[name] = grown.plus(self._histograms.get(name))

    def counters(self, baseline: Counters) -> Counters:
        if not self._counts:
            return baseline
        values = {k: v + self._counts.get(k, 0.0) for k, v in baseline.values.items()}
        return replace(baseline, values={**self._counts, **values})

    def timing(self, baseline: TimingSnapshot) -> TimingSnapshot:
        if not self._histograms:
            return baseline
        shifted = {k: h.plus(self._histograms.get(k)) for k, h in baseline.histograms.items()}
        return replace(baseline, histograms={**self._histograms, **shifted})


def _prefix_cache_flags(hits: float | None, key: CellKey, requests: int) -> list[str]:
    """A line when the engine's prefix cache served less than half the context tokens the
    measured requests carried (prefix caching off in the engine, or the cache too small)."""
    expected = key.depth * requests
    if hits is None or hits >= expected / 2:
        return []
    return [
        f"prefix caching: the engine's prefix cache served {hits:.0f} of the {expected} "
        "context tokens of the measured requests (is it on, and large enough?)"
    ]


def _extras(results: Sequence[StreamResult]) -> list[Mapping[str, object]]:
    """The engine's own per-response fields of the requests that finished."""
    return [r.extras for r in results if r.ok and r.extras]


def _per_request(total: int, requests: int) -> int | None:
    return round(total / requests) if requests else None


def _boot(target: Target, adapter: EngineAdapter, plan: BenchPlan, progress: Progress) -> float:
    if not target.owns_engine:
        return 0.0
    progress.phase(f"waiting for {adapter.name} to boot (up to {plan.boot_timeout_s:g} s)")
    readiness = wait_ready(
        target,
        adapter,
        plan.boot_timeout_s,
        waiting=lambda seconds, line: progress.waiting(boot_detail(seconds, line)),
    )
    if readiness.ready:
        return readiness.seconds
    lines = target.logs.since(0) if target.logs is not None else []
    found = diagnose(lines, adapter.name)
    code = readiness.exit_code if readiness.exit_code is not None else -1
    why = (
        target.describe_exit(code)
        if readiness.outcome == "exited"
        else f"the engine was not ready within {plan.boot_timeout_s:g} s"
    )
    hint = f"{found[0].diagnosis} {found[0].remedy}" if found else None
    if hint is None and lines:
        hint = f"last engine log line: {lines[-1][:200]}"
    raise EngineBootError(f"{why} before the benchmark could start", hint)


def fit_plan(plan: BenchPlan, adapter: EngineAdapter) -> BenchPlan:
    """The plan without the cells longer than the profile's own max length (its
    ``--max-model-len``/``--context-length``): known before the boot, so a sweep that cannot
    fit is refused in a second, not after the engine booted."""
    whose = f"the profile's {adapter.max_len_flag}"
    limit = adapter.declared_max_len(plan.args)
    fitted, dropped = fit_to_length(plan.sweep, limit, whose)
    if dropped and limit is not None:
        console.warn(left_out_warning(dropped, limit, whose))
    return replace(plan, sweep=fitted)


def run_bench(
    target: Target,
    adapter: EngineAdapter,
    plan: BenchPlan,
    progress: Progress | None = None,
) -> BenchReport:
    """Run ``plan`` against ``target`` (started and always stopped here).

    Returns a report also when the engine dies mid-sweep (``complete`` False, ``error`` set);
    raises for failures before the first cell (boot, discovery, calibration, bad sweep).
    """
    progress = progress or SilentProgress()
    clock = ProcessClock.start()
    sweep = plan.sweep
    watch = Watch(plan.host, target, adapter)
    with watch, target:
        booted = watch.step(lambda: _boot(target, adapter, plan, progress))
        clock = clock.booted(booted if target.owns_engine else None)
        sweeper = Sweeper(target, adapter, plan, progress)
        report_error: str | None = None
        engine_info: EngineInfo
        prompt_info: PromptInfo | None = None

        async def main() -> tuple[EngineInfo, PromptInfo | None, str | None]:
            connections = max(sweep.concurrency) + 4
            async with make_client(target.base_url, connections, plan.request_timeout_s) as c:
                sweeper.client = c
                engine = ServedEngine(adapter, target.base_url, sweeper.session)
                await engine.discover()
                info = EngineInfo(
                    name=adapter.name,
                    version=engine.version,
                    model=plan.model,
                    served_model=engine.served_model,
                    args=secret_args(plan.args),  # the report goes to JSON, the lock, arena
                    env=secret_env(plan.env),
                    max_model_len=engine.max_model_len,
                )
                if plan.engine_check is not None:  # a resumed sweep: the same engine
                    plan.engine_check(info)
                sweeper.fit(engine)
                progress.phase(f"calibrating prompts with the engine's tokenizer ({adapter.name})")
                factory = PromptFactory(engine.count_tokens, sweep.seed)
                await factory.prepare()

                def prompts() -> PromptInfo:
                    return PromptInfo(
                        recipe=PROMPT_RECIPE,
                        seed=sweep.seed,
                        calibration=engine.calibration,
                        fingerprint=factory.fingerprint.hexdigest(),
                        exact=sweeper.all_exact,
                    )

                if plan.checkpoint is not None:
                    checkpoint = plan.checkpoint
                    sweeper.on_cell = lambda: write_checkpoint(
                        checkpoint,
                        _report(sweeper, info, prompts(), UNFINISHED, clock, complete=False),
                    )
                error: str | None = None
                try:
                    await sweeper.sweep(engine, factory)
                except EngineGoneError as exc:
                    error = f"{exc.message}" + (f"\nhint: {exc.hint}" if exc.hint else "")
                return info, prompts(), error

        engine_info, prompt_info, report_error = watch.step(lambda: asyncio.run(main()))
        report_error = watch.why(report_error)  # the guard stopped the engine under the sweep
        host_run = watch.finish(booted if target.owns_engine else None)
    return _report(
        sweeper,
        engine_info,
        prompt_info,
        report_error,
        clock,
        complete=report_error is None,
        host=host_run,
    )


def _report(
    sweeper: Sweeper,
    engine_info: EngineInfo,
    prompt_info: PromptInfo | None,
    error: str | None,
    clock: ProcessClock,
    *,
    complete: bool,
    host: HostRun | None = None,
) -> BenchReport:
    """The report of the cells finished (all or so far), timed over the sweep's processes."""
    plan, target = sweeper.plan, sweeper.target
    done = {c.key for c in sweeper.cells}
    carried = {c.key for c in plan.done}
    sweep = plan.sweep  # less the cells longer than the engine serves
    spans = [
        *plan.earlier,
        clock.span([c.key.label() for c in sweeper.cells if c.key not in carried]),
    ]
    seconds, boot_seconds = sweep_time(spans)
    return BenchReport(
        created=spans[-1].ended,
        label=plan.label,
        profile=plan.profile,
        harness=HarnessInfo(
            version=HARNESS_VERSION,
            sparkbuild=__version__,
            http_client=f"httpx {httpx.__version__}",
        ),
        host=host_info(clock.load_start),
        target=_target_info(target),
        engine=engine_info,
        topology=plan.topology.model_copy(update={"launcher": None}) if plan.topology else None,
        sweep=sweep,
        prompts=prompt_info,
        boot_seconds=boot_seconds,
        seconds=seconds,
        complete=complete,
        error=error,
        pending_cells=[k.label() for k in sweep.cells() if k not in done],
        cells=list(sweeper.cells),
        before_boot=dict(plan.before_boot) if plan.before_boot else None,
        resumed_from=plan.resumed,
        processes=spans,
        host_facts=dict(host.to_json()) if host is not None else None,
    )
