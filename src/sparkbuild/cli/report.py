"""``sparkbuild report``: the static site of images.lock, and ``--diff`` of two builds."""

from __future__ import annotations

from pathlib import Path

import click

from sparkbuild import console, fileio
from sparkbuild.cli import emit_json, options
from sparkbuild.errors import UsageError
from sparkbuild.settings import Settings


@click.command("report")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    metavar="DIR",
    help="Write the site to DIR, replacing the report there [default: .sparkbuild/report].",
)
@click.option(
    "--diff",
    "diff_sides",
    nargs=2,
    metavar="BUILD[@WHERE] BUILD[@WHERE]",
    help="Only a page comparing two builds. WHERE: a git revision of images.lock (HEAD~1, a "
    "tag, a commit), or published / published~N (the build's publish history); none: the "
    "lock as it is.",
)
@click.option(
    "--bench-runs",
    "bench_runs",
    multiple=True,
    type=click.Path(file_okay=False, path_type=Path),
    metavar="DIR",
    help="Read the JSON reports `bench --json-file` wrote in DIR (repeatable): flags, min-max "
    "and claims beside the lock's medians.",
)
@click.option(
    "--attach",
    "attach",
    multiple=True,
    metavar="BUILD=FILE",
    help="Show the bench run FILE (a `bench --json-file` report; a --command run such as the "
    "quick start's names no image) on BUILD's page, marked attached (repeatable).",
)
@click.option(
    "--stale-days",
    type=click.FloatRange(min=0),
    default=30,
    show_default=True,
    help="A verdict recorded longer ago than this is shown stale.",
)
@options.json()
@click.pass_obj
def report(
    settings: Settings,
    out: Path | None,
    diff_sides: tuple[str, str] | None,
    bench_runs: tuple[Path, ...],
    attach: tuple[str, ...],
    stale_days: float,
    as_json: bool,
) -> None:
    """A static HTML report of every build in images.lock: a table of builds by stages
    (source, image, preflight, smoke per profile, bench, publish), a page per build, bench
    charts, and each build against its previous published image. No server, no script:
    open DIR/index.html, or publish DIR as a GitHub Pages site.

    `sparkbuild report --diff BUILD@A BUILD@B` writes one page of what changed between
    two images: commits, PRs, patches, wheels, digests, verdicts and bench figures.
    """
    from sparkbuild.report import ReportOptions, write_diff, write_site

    target = out or fileio.project_output(settings.project_dir, ".sparkbuild/report", "--out DIR")
    if diff_sides:
        if bench_runs or attach:
            raise UsageError(
                "--bench-runs and --attach are for the whole report, not --diff",
                "leave them out (a diff compares what the lock records)",
            )
        result = write_diff(settings, diff_sides, target)
    else:
        attached = tuple(_attachment(value) for value in attach)
        result = write_site(
            settings, ReportOptions(target, bench_runs, stale_days, attached=attached)
        )
    if as_json:
        emit_json(result.to_json())
        return
    for note in result.notes:
        console.warn(note)
    if not diff_sides:
        console.out.print(
            f"report: {console.plural(result.builds, 'build')}, "
            f"{console.plural(len(result.pages), 'page')} in {result.out}",
            markup=False,
        )
    console.out.print(f"open {result.index}", markup=False)


def _attachment(value: str) -> tuple[str, Path]:
    build, sep, file = value.partition("=")
    if not sep or not build or not file:
        raise UsageError(
            f"--attach {value!r}: expected BUILD=FILE", "e.g. --attach cpu=my-run.json"
        )
    return build, Path(file)


COMMANDS = [report]
