"""The bench stage's entry point: ``run_stage`` takes frozen ``BenchOptions`` (how the engine
is launched, what is measured, where the report goes, the claims to hold it against) and
returns a frozen ``BenchResult``.

Everything that could fail after the boot and the sweep is checked before the boot. The
engine is the one a profile describes (started as ``--image``, ``--command`` or ``--cluster``
say, or reached at ``--url``), or, at a URL without a profile, the one the server names. A
sweep that stopped early still writes its report, then fails; only a complete one becomes a
Spark Arena submission or a record in the lock.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path

from sparkbuild import console, fileio, lockfile, net
from sparkbuild.adapters import (
    ADAPTERS,
    MAX_TOKENS,
    EngineAdapter,
    adapter_for,
    first_model,
)
from sparkbuild.bench import report as bench_report
from sparkbuild.bench.arena import check_submission_dir, refuse_unfit, write_submission
from sparkbuild.bench.claims_request import ClaimsRequest
from sparkbuild.bench.outputs import BenchOutputs
from sparkbuild.bench.plot import require_matplotlib
from sparkbuild.bench.progress import CellProgress, PlainProgress, Progress
from sparkbuild.bench.results import BenchReport
from sparkbuild.bench.resume import Launch, Resume, check_same_answer, check_same_engine
from sparkbuild.bench.runner import STREAM_TIMEOUT_S, BenchPlan, SweepSettings, fit_plan, run_bench
from sparkbuild.bench.sweep import Sweep
from sparkbuild.engines.boot_prep import before_boot
from sparkbuild.engines.cluster import load_cluster
from sparkbuild.engines.cluster_target import node_pin
from sparkbuild.engines.host_watch import choose_floor
from sparkbuild.engines.host_watch import prepare as prepare_hosts
from sparkbuild.engines.launch import (
    LaunchSettings,
    check_cluster_size,
    check_single_box,
    cluster_target,
    compile_cache_for,
    make_target,
    where_to_look,
)
from sparkbuild.engines.profiles import load_profile
from sparkbuild.engines.targets import Target, UrlTarget, local_image_id, stop_on_signals
from sparkbuild.errors import (
    EngineHTTPError,
    EngineUnreachableError,
    LocalImageError,
    SweepIncompleteError,
    UsageError,
)
from sparkbuild.outputs import check_writable
from sparkbuild.redact import redact
from sparkbuild.settings import Settings


@dataclass(frozen=True)
class BenchOptions:
    """One bench run, as the command line (or a caller) asked for it."""

    launch: LaunchSettings
    measure: SweepSettings  # with resume: the earlier run's (Resume.settings)
    outputs: BenchOutputs = field(default_factory=BenchOutputs)
    claims: ClaimsRequest | None = None
    resume: Resume | None = None  # bench --resume FILE: the sweep this run continues


@dataclass(frozen=True)
class BenchResult:
    """A complete run: its report, and what was kept of it besides the outputs."""

    report: BenchReport
    submission: Path | None = None  # the Spark Arena submission written (--arena)
    image_id: str | None = None  # the image id the run was recorded under (--record)


@dataclass(frozen=True)
class BenchRun:
    """The engine to measure and the plan to measure it with, checked before the boot."""

    target: Target
    adapter: EngineAdapter
    plan: BenchPlan


def run_stage(
    settings: Settings, options: BenchOptions, progress: Progress | None = None
) -> BenchResult:
    """Check, boot (or reach) the engine, sweep, write the outputs and show the report, then
    keep a complete run (submission, lock record). ``progress`` None: a live bar on a
    terminal, else a line per stage and cell. Raises ``SweepIncompleteError`` (after the
    outputs are written) when the sweep stopped early."""
    run = prepare(settings, options)
    report = measure(run, progress)
    outputs = options.outputs
    outputs.write(report)
    if outputs.json_path != "-":
        bench_report.render(report, console.out)
    if options.claims is not None:
        options.claims.show(report, append_markdown=True)
    check_complete(report, outputs)
    submission = export_arena(settings, options, report)
    image_id = None
    if outputs.record_build:
        image_id = bench_report.record(settings.lock_file, outputs.record_build, report)
        console.info(
            f"recorded bench for {outputs.record_build} ({image_id[:19]}) / {run.plan.profile}"
        )
    return BenchResult(report, submission, image_id)


def prepare(settings: Settings, options: BenchOptions) -> BenchRun:
    """The target, adapter and plan; every check that can fail runs here, before a boot."""
    launch = options.launch
    kind = launch.choice.kind("bench")
    if launch.profile is None and kind != "url":
        raise UsageError(
            f"--{kind} needs --profile (engine, model and serve flags)",
            "e.g. sparkbuild bench --command '...' --profile cpu-reference",
        )
    check_before_boot(settings, options)
    if launch.profile is not None:
        run = _with_profile(settings, launch, launch.profile, options.measure)
    else:
        run = _at_url(launch, options.measure)
    return _continuing(run, options)


def _continuing(run: BenchRun, options: BenchOptions) -> BenchRun:
    """Where the report goes after each cell (``--json-file``, else the file resumed), and
    with ``--resume``: the cells carried over, once the engine is shown to be the same."""
    json_path, resume = options.outputs.json_path, options.resume
    checkpoint = Path(json_path) if json_path and json_path != "-" else None
    plan = replace(run.plan, checkpoint=checkpoint or (resume.path if resume else None))
    if resume is not None:
        check_same_engine(resume, plan, _launched(run, options.launch))
        plan = replace(
            plan,
            done=resume.done,
            resumed=resume.record(),
            earlier=resume.spans(),
            engine_check=lambda info: check_same_answer(resume, info),
        )
        console.info(
            f"resuming {resume.path}: {len(resume.done)} cells measured, "
            f"{plan.sweep.cell_count - len(resume.done)} to go"
        )
    return replace(run, plan=plan)


def _launched(run: BenchRun, launch: LaunchSettings) -> Launch:
    """What this run's engine is, for a resumed sweep's check: the engine, the target's kind
    and description as the report keeps them, and the local image's id."""
    choice = launch.choice
    image_id = None
    if choice.image is not None and choice.cluster is None:
        try:
            image_id = local_image_id(choice.image)
        except LocalImageError:
            image_id = None  # the boot says so; the check compares what it can
    return Launch(run.adapter.name, run.target.kind, run.target.description, image_id)


def measure(run: BenchRun, progress: Progress | None = None) -> BenchReport:
    """The sweep, stopped on SIGINT/SIGTERM with the engine; an engine's HTTP error says
    where its log is."""
    with stop_on_signals(), ExitStack() as stack:
        if progress is None:
            progress = (
                stack.enter_context(CellProgress(run.plan.sweep.cell_count))
                if console.interactive()
                else PlainProgress()
            )
        try:
            return run_bench(run.target, run.adapter, run.plan, progress)
        except EngineHTTPError as exc:  # the next place to look depends on who runs it
            log = run.target.logs.path if run.target.logs is not None else None
            exc.hint = where_to_look(run.target.kind, log)
            raise


def check_complete(report: BenchReport, outputs: BenchOutputs) -> None:
    """A sweep that stopped early fails, naming what was kept and what was not."""
    if report.complete:
        return
    json_path = outputs.json_path
    kept = f"; the {len(report.cells)} finished cells are in {json_path}" if json_path else ""
    unwritten = "; no Spark Arena submission was written" if outputs.arena_dir else ""
    resume = (
        f"; then run the same launch with --resume {json_path} (only the missing cells run)"
        if json_path and json_path != "-"
        else ""
    )
    raise SweepIncompleteError(
        f"{report.error or 'the sweep stopped'}; "
        f"{len(report.pending_cells)} cells not measured{kept}{unwritten}",
        f"see the engine log{resume}",
    )


def export_arena(settings: Settings, options: BenchOptions, report: BenchReport) -> Path | None:
    """The run as a Spark Arena submission (``--arena DIR``), from the profile's launch."""
    launch, arena_dir = options.launch, options.outputs.arena_dir
    if arena_dir is None or launch.profile is None:
        return None
    name, profile = load_profile(settings, launch.profile, model=launch.model, need_model=False)
    submission = write_submission(arena_dir, report, name, profile)
    console.info(f"wrote the Spark Arena submission {submission.directory}")
    return submission.directory


def check_before_boot(settings: Settings, options: BenchOptions) -> None:
    """Everything that would otherwise fail after the boot and the sweep, checked first."""
    launch, sweep, outputs = options.launch, options.measure.sweep, options.outputs
    outputs.check(options.claims)
    check_writable(launch.log_path, "--log")
    longest = max(sweep.cells(), key=lambda k: k.prompt_tokens + k.tg)
    if longest.prompt_tokens + longest.tg > MAX_TOKENS:
        raise UsageError(
            f"{longest.label()} needs {longest.prompt_tokens + longest.tg} tokens "
            f"(depth+pp+tg), more than any engine serves ({MAX_TOKENS})",
            "lower --pp/--depth/--tg",
        )
    if outputs.plot_path is not None:
        require_matplotlib()  # a missing matplotlib fails now, not after an hour of benchmarking
    if outputs.record_build:
        lockfile.pinned_image_id(settings.lock_file, outputs.record_build)
    if outputs.arena_dir is not None:
        if launch.profile is None:
            raise UsageError(
                "--arena needs --profile: a submission's recipe is the profile's launch",
                "e.g. sparkbuild bench --url URL --profile NAME --arena DIR",
            )
        check_submission_dir(outputs.arena_dir)
    if sweep.name is not None and launch.profile is not None:
        _check_named_sweep_fits(settings, launch, sweep)


def _check_named_sweep_fits(settings: Settings, launch: LaunchSettings, sweep: Sweep) -> None:
    """A published sweep runs whole or not at all: the profile's length must hold it."""
    assert launch.profile is not None
    name, profile = load_profile(settings, launch.profile, model=launch.model, need_model=False)
    adapter = adapter_for(profile.engine)
    limit = adapter.declared_max_len(profile.args)
    refuse_unfit(sweep, limit, f"profile {name} ({profile.engine})", adapter.max_len_flag)


def _with_profile(
    settings: Settings, launch: LaunchSettings, profile_name: str, measure: SweepSettings
) -> BenchRun:
    """The engine a profile describes, started (or reached) as ``launch`` says."""
    name, profile = load_profile(settings, profile_name, model=launch.model)
    if launch.engine is not None and launch.engine != profile.engine:
        raise UsageError(f"--engine {launch.engine} contradicts profile {name} ({profile.engine})")
    adapter = adapter_for(profile.engine)
    choice = launch.choice
    plan = BenchPlan(
        sweep=measure.sweep,
        label=measure.label or f"{name} · {choice.image or choice.kind('bench')}",
        profile=name,
        model=profile.model,
        args=profile.args,
        env=profile.env,
        request=profile.request,
        boot_timeout_s=launch.boot_timeout_s or profile.expect.boot_timeout_s,
        request_timeout_s=_request_timeout_s(launch),
        topology=profile.parallel,
    )
    plan = fit_plan(plan, adapter)  # before the boot: a sweep that cannot fit stops here
    logs = None if choice.url else (launch.log_path or _default_log_path(settings, name))
    cluster = None
    if choice.cluster is not None and choice.image is not None:
        cluster = load_cluster(settings, choice.cluster)
        check_cluster_size(profile, len(cluster[1].nodes), cluster[0])
    elif choice.url is None:
        check_single_box(profile, name)
    cells = list(plan.sweep.cells())
    prep = before_boot(
        name,
        profile,
        launch,
        None,
        cluster,
        concurrency=max(c.concurrency for c in cells),
        context=max(c.prompt_tokens + c.tg for c in cells),
    )
    plan = replace(plan, before_boot=prep.to_json())
    if cluster is not None:
        assert choice.image is not None
        pin = node_pin(cluster[1], choice.image)
        target = cluster_target(choice, profile, adapter, logs, "bench", cluster, pin)
    else:
        cache = compile_cache_for(launch, settings.cache_dir)
        target = make_target(choice, profile, adapter, logs, stage="bench", compile_cache=cache)
    floor = choose_floor(launch.memory_floor, profile.expect.memory_floor, prep.spark)
    host = prepare_hosts(target, floor, allow_drift=launch.allow_host_drift)
    return BenchRun(target, adapter, replace(plan, host=host))


def _at_url(launch: LaunchSettings, measure: SweepSettings) -> BenchRun:
    """An engine someone else started: no profile, the engine asked from the server."""
    url = launch.choice.url
    assert url is not None
    adapter = adapter_for(launch.engine or detect_engine(url, _request_timeout_s(launch)))
    plan = BenchPlan(
        sweep=measure.sweep,
        label=measure.label or redact(url),
        profile=None,
        model=launch.model or "(as served)",
        request_timeout_s=_request_timeout_s(launch),
    )
    return BenchRun(UrlTarget(url), adapter, plan)


def detect_engine(url: str, timeout_s: float) -> str:
    """Which engine serves ``url``: the registered adapter that owns the first model the
    server lists (vLLM, SGLang and llama.cpp name themselves in its ``owned_by``)."""
    base = url.rstrip("/")
    session = net.Session(deadline_s=min(10.0, timeout_s))
    adapters = [adapter_for(name, request_timeout_s=min(10.0, timeout_s)) for name in ADAPTERS]
    where = base + adapters[0].endpoints.models
    try:
        entry = first_model(adapters[0].get_json(session, where))
    except (EngineHTTPError, ValueError) as exc:
        raise EngineUnreachableError(
            f"cannot reach {where} to find out which engine serves it: {exc}",
            "check --url, or pass --profile / --engine",
        ) from exc
    owner = next((adapter.name for adapter in adapters if adapter.owns(entry)), None)
    if owner is not None:
        return owner
    raise UsageError(
        f"{url} does not say which engine it is (owned_by {entry.get('owned_by')!r})",
        f"pass --engine ({', '.join(sorted(ADAPTERS))})",
    )


def _default_log_path(settings: Settings, name: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    relative = f".sparkbuild/bench-logs/{name}-{stamp}.log"
    return fileio.project_output(settings.project_dir, relative, "--log FILE")


def _request_timeout_s(launch: LaunchSettings) -> float:
    given = launch.request_timeout_s
    return STREAM_TIMEOUT_S if given is None else given
