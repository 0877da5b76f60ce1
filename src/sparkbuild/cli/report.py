"""``sparkbuild report``: the static site of images.lock, and ``--diff`` of two builds."""

from __future__ import annotations

from pathlib import Path

import click

from sparkbuild import console
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

    target = out or settings.project_dir / ".sparkbuild" / "report"
    if diff_sides:
        if bench_runs:
            raise UsageError(
                "--bench-runs is for the whole report, not --diff",
                "leave out --bench-runs (a diff compares what the lock records)",
            )
        result = write_diff(settings, diff_sides, target)
    else:
        result = write_site(settings, ReportOptions(target, bench_runs, stale_days))
    if as_json:
        emit_json(result.to_json())
        return
    for note in result.notes:
        console.warn(note)
    if not diff_sides:
        console.out.print(
            f"report: {result.builds} builds, {len(result.pages)} pages in {result.out}",
            markup=False,
        )
    console.out.print(f"open {result.index}", markup=False)


COMMANDS = [report]
