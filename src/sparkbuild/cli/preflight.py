"""`sparkbuild preflight`: the engine's own boot path on the CPU, per build and profile."""

from __future__ import annotations

from pathlib import Path

import click

from sparkbuild import console, lockfile
from sparkbuild.cli import emit_json, render_error
from sparkbuild.errors import ItemsDoNotApplyError, SparkbuildError, UsageError, VerdictFailedError
from sparkbuild.preflight import PreflightReport, Where, record, run_preflight
from sparkbuild.settings import Settings
from sparkbuild.source import prepare_source
from sparkbuild.spec import Build, load_builds, select


def _profiles(build: Build, chosen: tuple[str, ...]) -> list[str]:
    if not chosen:
        return list(build.smoke_profiles)
    return list(chosen)


def _print(report: PreflightReport) -> None:
    console.out.print(
        f"{report.build} ({report.engine} {report.version}, {report.where}): {report.verdict}",
        markup=False,
    )
    for check in report.package_checks:
        console.out.print(f"  {check.name:<9} {check.status:<4} {check.detail}", markup=False)
    for profile in report.profiles:
        console.out.print(f"  {profile.profile}: {report.verdict_for(profile)}", markup=False)
        for check in profile.checks:
            console.out.print(f"    {check.name:<7} {check.status:<4} {check.detail}", markup=False)


def preflight_one(
    settings: Settings, build: Build, profiles: list[str], where: Where, *, locked: bool
) -> PreflightReport:
    prepared = prepare_source(build, settings, locked=locked)
    if not prepared.ok:
        raise ItemsDoNotApplyError(
            f"{build.name}: the source does not prepare (a PR or patch conflicts)",
            f"see `sparkbuild patches {build.name}`",
        )
    return run_preflight(settings, prepared, profiles, where)


@click.command(name="preflight")
@click.argument("builds", nargs=-1)
@click.option(
    "--profile",
    "profiles",
    multiple=True,
    metavar="P",
    help="Only these profiles (a name in smoke/ or a file) [default: the build's own].",
)
@click.option(
    "--image",
    default=None,
    metavar="IMAGE",
    help="Run inside this built image (no GPU) instead of a local venv.",
)
@click.option(
    "--in-image",
    is_flag=True,
    help="Run inside the build's image pinned in images.lock (what CI and publish use).",
)
@click.option(
    "--python",
    "python",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Run under this interpreter (e.g. a vLLM CPU venv's bin/python) instead of a cached venv.",
)
@click.option("--locked", is_flag=True, help="Prepare exactly what images.lock pins.")
@click.option(
    "--json", "json_file", default=None, metavar="FILE", help="Write the report (- for stdout)."
)
@click.option(
    "--record",
    "record_verdicts",
    is_flag=True,
    help="Record each verdict in images.lock under builds.<name>.preflight.",
)
@click.pass_obj
def preflight_command(
    settings: Settings,
    builds: tuple[str, ...],
    profiles: tuple[str, ...],
    image: str | None,
    in_image: bool,
    python: Path | None,
    locked: bool,
    json_file: str | None,
    record_verdicts: bool,
) -> None:
    """Check BUILDS (default: all) on the CPU: compile, imports, flags, env, config, signals."""
    if sum(bool(x) for x in (image, in_image, python)) > 1:
        raise UsageError("--image, --in-image and --python are places to run; pass one")
    selected = select(load_builds(settings), builds)
    if image and len(selected) != 1:
        raise UsageError("--image checks one build's image; name that build")
    reports = []
    errors: list[tuple[str, SparkbuildError]] = []
    for build in selected:
        try:
            pinned = lockfile.pinned_image_id(settings.lock_file, build.name) if in_image else None
            where = Where(image=image or pinned, python=python.absolute() if python else None)
            report = preflight_one(
                settings, build, _profiles(build, profiles), where, locked=locked
            )
        except SparkbuildError as exc:
            if len(selected) == 1:
                raise
            errors.append((build.name, exc))  # one build's problem does not stop the others
            render_error(exc, build=build.name)
            continue
        reports.append(report)
        if json_file != "-":
            _print(report)
    if json_file:
        payload = {
            "results": [r.to_json() for r in reports],
            "failed": [{"build": n, "error": e.message, "hint": e.hint} for n, e in errors],
        }
        emit_json(payload, json_file)
    failed = [r for r in reports if r.verdict != "pass"]
    for report in failed:
        for line in report.failures():
            console.err.print(f"{report.build}: {line}", markup=False)
    if record_verdicts:
        for report in reports:
            record(settings, report)
    if failed or errors:
        names = ", ".join(
            [f"{r.build} ({r.verdict})" for r in failed] + [f"{n} (error)" for n, _ in errors]
        )
        raise VerdictFailedError(
            f"preflight did not pass: {names}",
            "fix what each failure names, then run `sparkbuild preflight` again",
        )


COMMANDS: list[click.Command] = [preflight_command]
