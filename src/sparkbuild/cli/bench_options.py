"""The options of ``sparkbuild bench`` and ``bench compare``, as groups defined once (after
pip's cmdoptions): the grid (``GRID``), the outputs (``OUTPUTS``) and the claims
(``CLAIMS``). Each group reaches the command as one frozen value; the launch group
is shared with smoke (``options.launch``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import click

from sparkbuild.adapters import ADAPTERS
from sparkbuild.bench.arena import named_sweep
from sparkbuild.bench.claims_request import ClaimsRequest, claims_request
from sparkbuild.bench.outputs import BenchOutputs
from sparkbuild.bench.resume import Resume, load_resume
from sparkbuild.bench.runner import SweepSettings
from sparkbuild.bench.sweep import BOUNDS, MAX_CELLS, Bound, Sweep, parse_int_list
from sparkbuild.cli import options
from sparkbuild.errors import UsageError
from sparkbuild.settings import Settings

R = TypeVar("R")


def int_list(bound: Bound) -> Callable[..., list[int]]:
    """A click callback: a comma-separated list of whole numbers within bounds (else exit 2)."""

    def convert(ctx: click.Context, param: click.Parameter, value: str) -> list[int]:
        try:
            values = parse_int_list(str(value), minimum=bound.low)
        except ValueError as exc:
            raise click.BadParameter(str(exc), ctx, param) from None
        if max(values) > bound.high:
            raise click.BadParameter(
                f"at most {bound.high} is supported (in {value!r})", ctx, param
            )
        return values

    return convert


engine: options.Decorator = click.option(
    "--engine",
    type=click.Choice(sorted(ADAPTERS)),
    help="With --url and no --profile: the engine (default: asked from the server).",
)

# The grid: what is measured. A named sweep (--sweep) fixes all of it but the seed.
GRID_OPTIONS = ("pp", "tg", "depth", "concurrency", "runs")


@dataclass(frozen=True)
class Grid:
    """The grid as given: --pp/--tg/--depth/--concurrency/--runs, or a named --sweep."""

    pp: list[int]
    tg: list[int]
    depth: list[int]
    concurrency: list[int]
    runs: int
    seed: int
    no_warmup: bool
    prefix_caching: bool
    sweep_name: str | None
    label: str | None
    resume: Path | None = None

    def resumed(self, given: list[str]) -> Resume | None:
        """``--resume FILE``'s earlier run; the grid options beside it are refused (the
        earlier run's grid is the one measured)."""
        if self.resume is None:
            return None
        typed = [*given, *(["--sweep"] if self.sweep_name else [])]
        if typed:
            raise UsageError(
                f"--resume {self.resume} measures that run's grid; {', '.join(typed)} would "
                "be ignored",
                f"drop {', '.join(typed)}",
            )
        return load_resume(self.resume)

    def settings(self, given: list[str]) -> SweepSettings:
        """The sweep and the run's name; ``given`` names the grid options typed on the
        command line, refused beside a named sweep (they would be ignored)."""
        if self.sweep_name is None:
            sweep = Sweep(
                pp=self.pp,
                tg=self.tg,
                depth=self.depth,
                concurrency=self.concurrency,
                runs=self.runs,
                seed=self.seed,
                warmup=not self.no_warmup,
                prefix_caching=self.prefix_caching,
            )
            cells = sweep.grid_size
            if cells > MAX_CELLS:
                raise UsageError(
                    f"--pp, --tg, --depth and --concurrency make {cells} cells, more than "
                    f"{MAX_CELLS}",
                    "measure fewer values at once",
                )
            return SweepSettings(sweep, self.label)
        if given:
            raise UsageError(
                f"--sweep {self.sweep_name} fixes the grid; {', '.join(given)} would be ignored",
                f"drop {', '.join(given)}, or leave out --sweep",
            )
        named = named_sweep(self.sweep_name)
        return SweepSettings(named.sweep(seed=self.seed, warmup=not self.no_warmup), self.label)


def _sweep_name(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``--sweep``: a published sweep's name or a sweep file, checked as given."""
    if value is None:
        return None
    try:
        named_sweep(value)
    except UsageError as exc:
        raise click.BadParameter(f"{exc.message} ({exc.hint})", ctx, param) from None
    return value


def _int_list(name: str, *decls: str, default: str, help: str) -> options.Decorator:
    bound = BOUNDS[name]
    return click.option(
        bound.flag, *decls, callback=int_list(bound), default=default, show_default=True, help=help
    )


#: The grid's options, in their --help order; their bounds are ``sweep.BOUNDS``.
GRID: tuple[options.Decorator, ...] = (
    _int_list("pp", default="512,2048", help="Prompt tokens."),
    _int_list("tg", default="128", help="Generated tokens."),
    _int_list("depth", default="0", help="Context tokens in front of the prompt."),
    _int_list("concurrency", "-c", default="1,4,8", help="Requests in flight at once."),
    click.option(
        BOUNDS["runs"].flag,
        type=click.IntRange(BOUNDS["runs"].low, BOUNDS["runs"].high),
        default=3,
        show_default=True,
        help="Runs per cell.",
    ),
    click.option(
        "--seed",
        type=int,
        default=0,
        show_default=True,
        help="Prompt seed (changes every prompt).",
    ),
    click.option("--no-warmup", is_flag=True, help="Skip the warm-up request before the sweep."),
    click.option(
        "--prefix-caching",
        is_flag=True,
        help="Send each run's context (--depth) alone first, so the measured requests find "
        "it in the engine's prefix cache (llama-benchy's --enable-prefix-caching).",
    ),
    click.option(
        "--sweep",
        "sweep_name",
        metavar="NAME|FILE",
        callback=_sweep_name,
        help="Run a published sweep instead of --pp/--tg/--depth/--concurrency/--runs: "
        "spark-arena-v2 is Spark Arena's official profile (depth 0-100000, pp 2048, tg "
        "128, concurrency 1/2/5/10, prefix caching, its fixed order); or a .yaml file in "
        "its format.",
    ),
    click.option("--label", metavar="TEXT", help="Name of this run in tables, plots and compare."),
    click.option(
        "--resume",
        type=click.Path(dir_okay=False, path_type=Path),
        metavar="FILE",
        help="Go on with the sweep of an earlier run's --json-file FILE: only its missing "
        "cells run, against the same engine (checked); the report is written after every "
        "cell, so an interrupted sweep keeps what it finished.",
    ),
)


def grid_options(function: Callable[..., R]) -> Callable[..., R]:
    """The grid's options, handed over as one ``grid: Grid``."""
    return options.stack(GRID, options.grouped("grid", Grid)(function))


@dataclass(frozen=True)
class Outputs:
    """Where the report goes, as given."""

    as_json: bool
    json_file: str | None
    markdown_path: Path | None
    table_style: str
    csv_path: Path | None
    plot_path: Path | None
    arena_dir: Path | None
    record_build: str | None

    def outputs(self) -> BenchOutputs:
        return BenchOutputs(
            json_path=options.json_destination(self.as_json, self.json_file),
            markdown_path=self.markdown_path,
            table_style=self.table_style,
            csv_path=self.csv_path,
            plot_path=self.plot_path,
            record_build=self.record_build,
            arena_dir=self.arena_dir,
        )


def _file(*decls: str, help: str) -> options.Decorator:
    return click.option(*decls, type=click.Path(dir_okay=False, path_type=Path), help=help)


#: Bench's outputs, in their --help order.
OUTPUTS: tuple[options.Decorator, ...] = (
    options.json(),
    options.json_file(help="Write the report as JSON to FILE."),
    _file("--markdown", "markdown_path", help="Write the Markdown table to FILE."),
    click.option(
        "--table-style",
        type=click.Choice(["sparkbuild", "llama-benchy"]),
        default="sparkbuild",
        show_default=True,
        help="Columns of the --markdown table: sparkbuild's, or llama-benchy 0.4's (plus "
        "the engine's rate and bursts).",
    ),
    _file(
        "--csv",
        "csv_path",
        help="Write a CSV with llama-benchy 0.4's columns (then sparkbuild's) to FILE.",
    ),
    _file(
        "--plot",
        "plot_path",
        help="Write a PNG of decode tok/s against concurrency (needs sparkbuild[plot]).",
    ),
    click.option(
        "--arena",
        "arena_dir",
        type=click.Path(file_okay=False, path_type=Path),
        help="Write the run as a Spark Arena submission in DIR (recipes/, logs/, metadata/).",
    ),
    options.record(help="Store a summary in images.lock under BUILD's image id (section bench)."),
)


def output_options(function: Callable[..., R]) -> Callable[..., R]:
    """Bench's outputs, handed over as one ``out: Outputs``."""
    return options.stack(OUTPUTS, options.grouped("out", Outputs)(function))


@dataclass(frozen=True)
class Claims:
    """``--claims``, ``--claims-setup`` and (bench's) ``--claims-json``, as given."""

    claims_files: tuple[str, ...]
    claims_setups: tuple[str, ...]
    claims_json: str | None = None

    def request(
        self,
        settings: Settings,
        markdown_path: Path | None,
        *,
        json_path: str | None = None,
        json_option: str = "--claims-json",
        stdout_taken: bool = False,
    ) -> ClaimsRequest | None:
        """The claims loaded and checked. ``json_path`` and ``json_option`` stand in for
        ``--claims-json`` where the command's own JSON is the claims' (``bench compare``)."""
        return claims_request(
            settings,
            self.claims_files,
            self.claims_setups,
            json_path or self.claims_json,
            markdown_path,
            stdout_taken=stdout_taken,
            json_option=json_option,
        )


#: ``--claims`` and ``--claims-setup``: bench's and bench compare's.
CLAIMS: tuple[options.Decorator, ...] = (
    click.option(
        "--claims",
        "claims_files",
        multiple=True,
        metavar="FILE|NAME",
        help="A claims file (or a name in claims/) of published figures to hold the run "
        "against (repeatable).",
    ),
    click.option(
        "--claims-setup",
        "claims_setups",
        multiple=True,
        metavar="NAME",
        help="Hold the run against this setup of the claims files, whatever its model "
        "(repeatable; default: the setups naming the run's profile or model).",
    ),
)
CLAIMS_JSON: options.Decorator = click.option(
    "--claims-json", metavar="FILE", help="Write the claims comparison as JSON."
)


def claims_options(*, claims_json: bool = False) -> options.Decorator:
    """--claims and --claims-setup (with bench's --claims-json), handed over as one
    ``claims: Claims``."""
    group = (*CLAIMS, CLAIMS_JSON) if claims_json else CLAIMS

    def decorate(function: Callable[..., object]) -> Callable[..., object]:
        return options.stack(group, options.grouped("claims", Claims)(function))

    return decorate
