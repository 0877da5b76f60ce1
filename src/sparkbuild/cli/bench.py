"""``sparkbuild bench``: throughput sweeps of an engine, and ``bench compare`` of two reports."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import click
import requests
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.progress import Progress as RichProgress

from sparkbuild import console, jsontext, lockfile, net
from sparkbuild.bench import report as bench_report
from sparkbuild.bench.arena import (
    NAMED_SWEEPS,
    check_submission_dir,
    named_sweep,
    refuse_unfit,
    write_submission,
)
from sparkbuild.bench.plot import plot_decode, require_matplotlib
from sparkbuild.bench.results import BenchReport, CellResult
from sparkbuild.bench.runner import (
    STREAM_TIMEOUT_S,
    BenchPlan,
    PlainProgress,
    SweepSettings,
    fit_plan,
    run_bench,
)
from sparkbuild.bench.sweep import MAX_CONCURRENCY, CellKey, Sweep, parse_int_list
from sparkbuild.cli import check_writable, emit_json, options
from sparkbuild.cli.bench_claims import ClaimsRequest, claims_options, claims_request
from sparkbuild.cli.cluster import check_single_box, cluster_target
from sparkbuild.engines.adapters import (
    ADAPTERS,
    MAX_TOKENS,
    EngineAdapter,
    adapter_for,
    first_model,
)
from sparkbuild.engines.cluster import load_cluster
from sparkbuild.engines.cluster_target import cluster_pin
from sparkbuild.engines.launch import (
    LaunchSettings,
    check_cluster_size,
    make_target,
    where_to_look,
)
from sparkbuild.engines.profiles import load_profile
from sparkbuild.engines.targets import Target, UrlTarget, stop_on_signals
from sparkbuild.errors import (
    EngineHTTPError,
    EngineUnreachableError,
    NothingToCompareError,
    SweepIncompleteError,
    UsageError,
)
from sparkbuild.redact import redact, write_redacted
from sparkbuild.settings import Settings


def int_list(minimum: int, maximum: int | None = None) -> Callable[..., list[int]]:
    """A click callback: a comma-separated list of whole numbers within bounds (else exit 2)."""

    def convert(ctx: click.Context, param: click.Parameter, value: str) -> list[int]:
        try:
            values = parse_int_list(str(value), minimum=minimum)
        except ValueError as exc:
            raise click.BadParameter(str(exc), ctx, param) from None
        if maximum is not None and max(values) > maximum:
            raise click.BadParameter(f"at most {maximum} is supported (in {value!r})", ctx, param)
        return values

    return convert


class CellProgress:
    """A rich progress bar on stderr (TTY only, not with --quiet): current cell and run,
    cells done and remaining."""

    def __init__(self, total: int) -> None:
        self.total = total
        self._bar = RichProgress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("cells · {task.fields[remaining]} to go"),
            TimeElapsedColumn(),
            console=console.err,
            transient=True,
        )
        self._task = self._bar.add_task("starting", total=total, remaining=total)
        self._key: CellKey | None = None
        self._phase = ""

    def __enter__(self) -> CellProgress:
        self._bar.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._bar.stop()

    def phase(self, message: str) -> None:
        self._phase = message
        self._bar.update(self._task, description=message)

    def waiting(self, detail: str) -> None:
        self._bar.update(self._task, description=f"{self._phase} · {detail}")

    def cell(self, index: int, total: int, key: CellKey) -> None:
        self._key = key
        self._bar.update(self._task, description=key.label(), remaining=total - index)

    def run(self, run: int, runs: int) -> None:
        label = self._key.label() if self._key else ""
        self._bar.update(self._task, description=f"{label} · run {run + 1}/{runs}")

    def cell_done(self, result: CellResult) -> None:
        done = self._bar.tasks[0].completed + 1
        self._bar.update(self._task, advance=1, remaining=self.total - int(done))


def warn_left_out(left_out: list[str], path: Path) -> None:
    """A plot says what it could not draw (a series with only burst runs has no line)."""
    if left_out:
        console.warn(f"{path} leaves out {len(left_out)} cell(s): " + "; ".join(left_out))


def _detect_engine(url: str, timeout_s: float) -> str:
    """vLLM and SGLang both name themselves in ``/v1/models`` ``owned_by``."""
    try:
        response = net.Session(deadline_s=min(10.0, timeout_s)).get(url.rstrip("/") + "/v1/models")
        owner = str(first_model(jsontext.loads(response.content)).get("owned_by", ""))
    except (requests.RequestException, ValueError, KeyError, IndexError, TypeError) as exc:
        raise EngineUnreachableError(
            f"cannot reach {url}/v1/models to find out which engine serves it: {exc}",
            "check --url, or pass --profile / --engine",
        ) from exc
    if owner in ADAPTERS:
        return owner
    raise UsageError(
        f"{url} does not say which engine it is (owned_by {owner!r})",
        f"pass --engine ({', '.join(sorted(ADAPTERS))})",
    )


def _default_log_path(settings: Settings, name: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return settings.project_dir / ".sparkbuild" / "bench-logs" / f"{name}-{stamp}.log"


@dataclass(frozen=True)
class BenchOutputs:
    """Where the report goes: files, the Markdown table's columns, the lock's bench section."""

    json_path: str | None = None
    markdown_path: Path | None = None
    table_style: str = "sparkbuild"
    csv_path: Path | None = None
    plot_path: Path | None = None
    record_build: str | None = None
    arena_dir: Path | None = None  # a Spark Arena submission (bench/arena.py)

    def write(self, report: BenchReport) -> None:
        from sparkbuild.bench import llama_benchy

        if self.json_path:
            emit_json(report.model_dump(mode="json"), self.json_path)
        if self.markdown_path:
            text = (
                llama_benchy.to_markdown(report)
                if self.table_style == "llama-benchy"
                else bench_report.markdown(report)
            )
            write_redacted(self.markdown_path, text, "--markdown")
        if self.csv_path:
            self.csv_path.parent.mkdir(parents=True, exist_ok=True)
            write_redacted(self.csv_path, llama_benchy.to_csv(report), "--csv")
        if self.plot_path and report.cells:
            warn_left_out(plot_decode([report], self.plot_path), self.plot_path)

    def check(self, claims: ClaimsRequest | None) -> None:
        """Every output path, before the engine boots: a sweep's hour is not lost to a typo."""
        paths: list[tuple[str | Path | None, str]] = [
            (self.json_path, "--json-file"),
            (self.markdown_path, "--markdown"),
            (self.csv_path, "--csv"),
            (self.plot_path, "--plot"),
        ]
        if claims is not None:
            paths.append((claims.json_path, claims.json_option))
        for path, option in paths:
            check_writable(path, option)


@click.group("bench", invoke_without_command=True)
@options.image()
@options.command(
    help="Run the engine as a local process (its launcher; the profile adds model, port, "
    "args unless CMD contains {port})."
)
@options.url(help="Benchmark an engine that is already running.")
@options.cluster()
@options.profile(help="A profile in smoke/ (by name) or a profile file: engine, model, args, env.")
@options.model()
@click.option(
    "--engine",
    type=click.Choice(sorted(ADAPTERS)),
    help="With --url and no --profile: the engine (default: asked from the server).",
)
@options.gpus(help="docker --gpus value for --image.")
@click.option(
    "--pp",
    callback=int_list(1, MAX_TOKENS),
    default="512,2048",
    show_default=True,
    help="Prompt tokens.",
)
@click.option(
    "--tg",
    callback=int_list(1, MAX_TOKENS),
    default="128",
    show_default=True,
    help="Generated tokens.",
)
@click.option(
    "--depth",
    callback=int_list(0, MAX_TOKENS),
    default="0",
    show_default=True,
    help="Context tokens in front of the prompt.",
)
@click.option(
    "--concurrency",
    "-c",
    callback=int_list(1, MAX_CONCURRENCY),
    default="1,4,8",
    show_default=True,
    help="Requests in flight at once.",
)
@click.option(
    "--runs", type=click.IntRange(min=1), default=3, show_default=True, help="Runs per cell."
)
@click.option(
    "--seed", type=int, default=0, show_default=True, help="Prompt seed (changes every prompt)."
)
@click.option("--no-warmup", is_flag=True, help="Skip the warm-up request before the sweep.")
@click.option(
    "--prefix-caching",
    is_flag=True,
    help="Send each run's context (--depth) alone first, so the measured requests find it in "
    "the engine's prefix cache (llama-benchy's --enable-prefix-caching).",
)
@click.option(
    "--sweep",
    "sweep_name",
    type=click.Choice(NAMED_SWEEPS),
    help="Run a published sweep instead of --pp/--tg/--depth/--concurrency/--runs: "
    "spark-arena-v2 is Spark Arena's official profile (depth 0-100000, pp 2048, tg 128, "
    "concurrency 1/2/5/10, prefix caching, its fixed order).",
)
@click.option("--label", metavar="TEXT", help="Name of this run in tables, plots and compare.")
@options.json()
@options.json_file(help="Write the report as JSON to FILE.")
@click.option(
    "--markdown",
    "markdown_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the Markdown table to FILE.",
)
@click.option(
    "--table-style",
    type=click.Choice(["sparkbuild", "llama-benchy"]),
    default="sparkbuild",
    show_default=True,
    help="Columns of the --markdown table: sparkbuild's, or llama-benchy 0.4's (plus the "
    "engine's rate and bursts).",
)
@click.option(
    "--csv",
    "csv_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write a CSV with llama-benchy 0.4's columns (then sparkbuild's) to FILE.",
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write a PNG of decode tok/s against concurrency (needs sparkbuild[plot]).",
)
@click.option(
    "--arena",
    "arena_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write the run as a Spark Arena submission in DIR (recipes/, logs/, metadata/).",
)
@options.record(help="Store a summary in images.lock under BUILD's image id (section bench).")
@options.boot_timeout(
    help="Wait this long for the engine to be ready before the sweep "
    "[default: the profile's expect.boot_timeout_s]."
)
@options.request_timeout(
    default=STREAM_TIMEOUT_S, show_default=True, help="Give up on a stream after this long."
)
@options.log(help="Keep the engine's log here [default: .sparkbuild/bench-logs/].")
@claims_options
@click.option("--claims-json", metavar="FILE", help="Write the claims comparison as JSON.")
@click.pass_context
@options.launch_settings
def bench(
    ctx: click.Context,
    /,
    launch: LaunchSettings,
    pp: list[int],
    tg: list[int],
    depth: list[int],
    concurrency: list[int],
    runs: int,
    seed: int,
    no_warmup: bool,
    prefix_caching: bool,
    sweep_name: str | None,
    label: str | None,
    as_json: bool,
    json_file: str | None,
    markdown_path: Path | None,
    table_style: str,
    csv_path: Path | None,
    plot_path: Path | None,
    arena_dir: Path | None,
    record_build: str | None,
    claims_files: tuple[str, ...],
    claims_setups: tuple[str, ...],
    claims_json: str | None,
) -> None:
    """Sweep prompt length x generation length x depth x concurrency against an engine.

    Reports time to first token, prefill and decode tokens/s (per request and in total) and
    the mean acceptance length of each cell: median (min-max) over --runs. Exit status 0 when
    every cell ran, 1 when the engine failed, 2 on bad usage.

    `sparkbuild bench compare A.json B.json` compares two --json reports.
    """
    if ctx.invoked_subcommand is not None:
        _no_options_before(ctx)
        return
    outputs = BenchOutputs(
        json_path=options.json_destination(as_json, json_file),
        markdown_path=markdown_path,
        table_style=table_style,
        csv_path=csv_path,
        plot_path=plot_path,
        record_build=record_build,
        arena_dir=arena_dir,
    )
    claims = claims_request(
        ctx.obj, claims_files, claims_setups, claims_json, markdown_path,
        stdout_taken=outputs.json_path == "-",
    )  # fmt: skip
    if sweep_name is not None:
        _no_grid_with_sweep(ctx, sweep_name)
        sweep = named_sweep(sweep_name).sweep(seed=seed, warmup=not no_warmup)
    else:
        sweep = Sweep(
            pp=pp, tg=tg, depth=depth, concurrency=concurrency, runs=runs, seed=seed,
            warmup=not no_warmup, prefix_caching=prefix_caching,
        )  # fmt: skip
    _run(ctx.obj, launch, SweepSettings(sweep, label), outputs, claims=claims)


def _no_grid_with_sweep(ctx: click.Context, name: str) -> None:
    """A named sweep fixes its grid: the grid options beside it would be ignored."""
    grid = ("pp", "tg", "depth", "concurrency", "runs")
    given = [
        f"--{p}"
        for p in grid
        if ctx.get_parameter_source(p) == click.core.ParameterSource.COMMANDLINE
    ]
    if given:
        raise UsageError(
            f"--sweep {name} fixes the grid; {', '.join(given)} would be ignored",
            f"drop {', '.join(given)}, or leave out --sweep",
        )


def _no_options_before(ctx: click.Context) -> None:
    """`bench compare` has options of its own; bench's, given before it, would be ignored."""
    flags = {param.name: param.opts[0] for param in ctx.command.params}
    given = [
        flags[name]
        for name in ctx.params
        if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE
    ]
    if given:
        raise click.UsageError(
            f"`bench {ctx.invoked_subcommand}` takes no bench options before it "
            f"(got {', '.join(given)})"
        )


def _run(
    settings: Settings,
    launch: LaunchSettings,
    measure: SweepSettings,
    outputs: BenchOutputs,
    claims: ClaimsRequest | None = None,
) -> None:
    kind = launch.choice.kind("bench")
    if launch.profile is None and kind != "url":
        raise UsageError(
            f"--{kind} needs --profile (engine, model and serve flags)",
            "e.g. sparkbuild bench --command '...' --profile cpu-reference",
        )
    _check_before_boot(settings, launch, measure.sweep, outputs, claims)
    if launch.profile is not None:
        target, adapter, plan = _with_profile(settings, launch, launch.profile, measure)
    else:
        target, adapter, plan = _at_url(launch, measure)
    with stop_on_signals():
        try:
            if console.interactive():
                with CellProgress(plan.sweep.cell_count) as progress:
                    report = run_bench(target, adapter, plan, progress)
            else:
                report = run_bench(target, adapter, plan, PlainProgress())
        except EngineHTTPError as exc:  # the next place to look depends on who runs it
            log = target.logs.path if target.logs is not None else None
            exc.hint = where_to_look(target.kind, log)
            raise
    outputs.write(report)
    if outputs.json_path != "-":
        bench_report.render(report, console.out)
    if claims is not None:
        claims.show(report, append_markdown=True)
    if not report.complete:
        json_path = outputs.json_path
        kept = f"; the {len(report.cells)} finished cells are in {json_path}" if json_path else ""
        unwritten = "; no Spark Arena submission was written" if outputs.arena_dir else ""
        raise SweepIncompleteError(
            f"{report.error or 'the sweep stopped'}; "
            f"{len(report.pending_cells)} cells not measured{kept}{unwritten}",
            "see the engine log and re-run the missing cells",
        )
    if outputs.arena_dir is not None and launch.profile is not None:
        name, profile = load_profile(settings, launch.profile, model=launch.model, need_model=False)
        submission = write_submission(outputs.arena_dir, report, name, profile)
        console.info(f"wrote the Spark Arena submission {submission.directory}")
    if outputs.record_build:
        image_id = bench_report.record(settings.lock_file, outputs.record_build, report)
        console.info(
            f"recorded bench for {outputs.record_build} ({image_id[:19]}) / {plan.profile}"
        )


def _check_before_boot(
    settings: Settings,
    launch: LaunchSettings,
    sweep: Sweep,
    outputs: BenchOutputs,
    claims: ClaimsRequest | None,
) -> None:
    """Everything that would otherwise fail after the boot and the sweep, checked first."""
    outputs.check(claims)
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
        name, profile = load_profile(settings, launch.profile, model=launch.model, need_model=False)
        adapter = adapter_for(profile.engine)
        limit = adapter.declared_max_len(profile.args)
        refuse_unfit(sweep, limit, f"profile {name} ({profile.engine})", adapter.max_len_flag)


def _with_profile(
    settings: Settings, launch: LaunchSettings, profile_name: str, measure: SweepSettings
) -> tuple[Target, EngineAdapter, BenchPlan]:
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
    if choice.cluster is not None and choice.image is not None:
        cluster = load_cluster(settings, choice.cluster)
        check_cluster_size(profile, len(cluster[1].nodes), cluster[0])
        pin = cluster_pin(cluster[1], choice.image)
        target = cluster_target(choice, profile, adapter, logs, "bench", cluster, pin)
    else:
        if choice.url is None:
            check_single_box(profile, name)
        target = make_target(choice, profile, adapter, logs, stage="bench")
    return target, adapter, plan


def _at_url(
    launch: LaunchSettings, measure: SweepSettings
) -> tuple[Target, EngineAdapter, BenchPlan]:
    """An engine someone else started: no profile, the engine asked from the server."""
    url = launch.choice.url
    assert url is not None
    adapter = adapter_for(launch.engine or _detect_engine(url, _request_timeout_s(launch)))
    plan = BenchPlan(
        sweep=measure.sweep,
        label=measure.label or redact(url),
        profile=None,
        model=launch.model or "(as served)",
        request_timeout_s=_request_timeout_s(launch),
    )
    return UrlTarget(url), adapter, plan


def _request_timeout_s(launch: LaunchSettings) -> float:
    given = launch.request_timeout_s
    return STREAM_TIMEOUT_S if given is None else given


@bench.command("compare")
@click.argument("report_a", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("report_b", type=click.Path(dir_okay=False, path_type=Path), required=False)
@claims_options
@options.json()
@options.json_file(help="Write the comparison as JSON to FILE.")
@click.option(
    "--markdown",
    "markdown_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the comparison table as Markdown.",
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write a PNG with both runs' decode curves.",
)
@click.pass_obj
def compare(
    settings: Settings,
    report_a: Path,
    report_b: Path | None,
    claims_files: tuple[str, ...],
    claims_setups: tuple[str, ...],
    as_json: bool,
    json_file: str | None,
    markdown_path: Path | None,
    plot_path: Path | None,
) -> None:
    """Side-by-side medians of two `bench --json` reports with deltas in percent (B vs A).

    Either side may be a llama-benchy 0.4 `--format json` file (its means stand in for
    medians), to set a sparkbuild run beside a published llama-benchy table.

    Warns when the runs differ in more than the one thing compared (harness version, prompts
    or seed, cells, runs, host, or several engine settings at once).

    `bench compare RUN.json --claims FILE` holds one run against published figures instead.
    """
    json_path = options.json_destination(as_json, json_file)
    for path, option in ((json_path, "--json-file"), (markdown_path, "--markdown"),
                         (plot_path, "--plot")):  # fmt: skip
        check_writable(path, option)
    claims = claims_request(
        settings, claims_files, claims_setups, json_path, markdown_path, json_option="--json-file"
    )
    if claims is not None or report_b is None:
        if claims is None or report_b is not None or plot_path is not None:
            raise UsageError(
                "bench compare takes two reports, or one report and --claims FILE (no --plot)",
                "e.g. sparkbuild bench compare run.json --claims claims/NAME.yaml",
            )
        claims.show(bench_report.load_report(report_a), append_markdown=False)
        return
    a, b = bench_report.load_report(report_a), bench_report.load_report(report_b)
    label_a = a.label if a.label != b.label else f"{a.label} ({report_a.name})"
    label_b = b.label if a.label != b.label else f"{b.label} ({report_b.name})"
    subject, warnings = bench_report.compare_warnings(a, b)
    rows = bench_report.compare_rows(a, b)
    if subject:
        console.info(f"comparing {subject}")
    for warning in warnings:
        console.warn(warning)
    if not rows:
        raise NothingToCompareError(
            f"{report_a.name} and {report_b.name} have no cell in common",
            "run both with the same --pp/--tg/--depth/--concurrency",
        )
    if json_path:
        emit_json(
            {"a": str(report_a), "b": str(report_b), "subject": subject,
             "warnings": warnings, "cells": rows},
            json_path,
        )  # fmt: skip
    if markdown_path:
        write_redacted(
            markdown_path, bench_report.markdown_compare(rows, label_a, label_b), "--markdown"
        )
    if plot_path:
        both = [a.model_copy(update={"label": label_a}), b.model_copy(update={"label": label_b})]
        warn_left_out(plot_decode(both, plot_path), plot_path)
    if json_path != "-":
        bench_report.render_compare(rows, label_a, label_b, console.out)


COMMANDS: list[click.Command] = [bench]
