"""``sparkbuild bench``: throughput sweeps of an engine, and ``bench compare`` of two reports.

The stage itself is ``bench.stage.run_stage`` and ``bench.compare.run_compare``; this module
turns the command line into their frozen options (the groups in ``cli/bench_options``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import click

from sparkbuild.bench.compare import CompareOptions, CompareOutputs, run_compare
from sparkbuild.bench.runner import STREAM_TIMEOUT_S
from sparkbuild.bench.stage import BenchOptions, run_stage
from sparkbuild.cli import options
from sparkbuild.cli.bench_options import (
    GRID_OPTIONS,
    Claims,
    Grid,
    Outputs,
    claims_options,
    engine,
    grid_options,
    output_options,
)
from sparkbuild.engines.launch import LaunchSettings
from sparkbuild.settings import Settings


@click.group("bench", invoke_without_command=True)
@options.launch(
    serves=[engine],
    command={
        "help": "Run the engine as a local process (its launcher; the profile adds model, "
        "port, args unless CMD contains {port})."
    },
    url={"help": "Benchmark an engine that is already running."},
    profile={"help": "A profile in smoke/ (by name) or a profile file: engine, model, args, env."},
    gpus={"help": "docker --gpus value for --image."},
    boot_timeout={
        "help": "Wait this long for the engine to be ready before the sweep "
        "[default: the profile's expect.boot_timeout_s]."
    },
    request_timeout={
        "default": STREAM_TIMEOUT_S,
        "show_default": True,
        "help": "Give up on a stream after this long.",
    },
    log={"help": "Keep the engine's log here [default: .sparkbuild/bench-logs/]."},
)
@grid_options
@output_options
@claims_options(claims_json=True)
@click.pass_context
def bench(
    ctx: click.Context, /, launch: LaunchSettings, grid: Grid, out: Outputs, claims: Claims
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
    outputs = out.outputs()
    request = claims.request(ctx.obj, out.markdown_path, stdout_taken=outputs.json_path == "-")
    given = [f"--{name}" for name in GRID_OPTIONS if _typed(ctx, name)]
    sweep_only = ("seed", "no_warmup", "prefix_caching")  # a resumed run keeps the earlier's
    resume = grid.resumed(
        [*given, *(f"--{n.replace('_', '-')}" for n in sweep_only if _typed(ctx, n))]
    )
    measure = resume.settings(grid.label) if resume else grid.settings(given)
    if resume is not None and outputs.json_path is None:  # the file resumed, made whole
        outputs = replace(outputs, json_path=str(resume.path))
    run_stage(ctx.obj, BenchOptions(launch, measure, outputs, request, resume))


def _typed(ctx: click.Context, name: str) -> bool:
    return ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE


def _no_options_before(ctx: click.Context) -> None:
    """`bench compare` has options of its own; bench's, given before it, would be ignored."""
    flags = {param.name: param.opts[0] for param in ctx.command.params}
    given = [flags[name] for name in ctx.params if _typed(ctx, name)]
    if given:
        raise click.UsageError(
            f"`bench {ctx.invoked_subcommand}` takes no bench options before it "
            f"(got {', '.join(given)})"
        )


@bench.command("compare")
@click.argument("report_a", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("report_b", type=click.Path(dir_okay=False, path_type=Path), required=False)
@claims_options()
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
    claims: Claims,
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
    outputs = CompareOutputs(json_path, markdown_path, plot_path)
    outputs.check()
    request = claims.request(
        settings, markdown_path, json_path=json_path, json_option="--json-file"
    )
    run_compare(CompareOptions(report_a, report_b, outputs, request))


COMMANDS: list[click.Command] = [bench]
