"""`sparkbuild preflight`: the engine's own boot path on the CPU, per build and profile."""

from __future__ import annotations

from pathlib import Path

import click

from sparkbuild import lockfile
from sparkbuild.cli import options, run_per_build
from sparkbuild.cli.output import Verdicts
from sparkbuild.errors import ItemsDoNotApplyError, UsageError
from sparkbuild.preflight import PreflightReport, Where, record, run_preflight
from sparkbuild.preflight.where import version_differs
from sparkbuild.settings import Settings
from sparkbuild.source import prepare_source
from sparkbuild.spec import Build, load_builds, select

VERDICTS: Verdicts[PreflightReport] = Verdicts(
    verdict=lambda report: report.verdict,
    reasons=PreflightReport.reasons,
    headline="preflight did not pass",
    hint="fix what each failure names, then run `sparkbuild preflight` again",
    skipped=(
        "preflight could not judge every check here, and nothing failed",
        "a skip is not a failure: the check could not run on this machine (each line above "
        "names why, e.g. a package with no wheel for it); `sparkbuild preflight BUILD "
        "--in-image` runs it in the built image. Exit status 3 means skipped, 1 failed",
    ),
)


def _profiles(build: Build, chosen: tuple[str, ...]) -> list[str]:
    if not chosen:
        return list(build.smoke_profiles)
    return list(chosen)


def _summary(report: PreflightReport) -> str:
    found = report.versions.get(report.engine)
    judged = f"{report.engine} {report.version}, {report.where}"
    if version_differs(found, report.version):  # only with --allow-version-mismatch
        judged += f" with {report.engine} {found}: ANOTHER RELEASE than the build's"
    lines = [f"{report.build} ({judged}): {report.verdict}"]
    lines += [f"  {c.name:<9} {c.status:<4} {c.detail}" for c in report.package_checks]
    for profile in report.profiles:
        lines.append(f"  {profile.profile}: {report.verdict_for(profile)}")
        lines += [f"    {c.name:<7} {c.status:<4} {c.detail}" for c in profile.checks]
    return "\n".join(lines)


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


def _selected(settings: Settings, names: tuple[str, ...], recorded: tuple[str, ...]) -> list[Build]:
    """BUILDS; with none named, the --record builds, else all."""
    selected = select(load_builds(settings), names or recorded)
    checked = {build.name for build in selected}
    stray = [name for name in recorded if name not in checked]
    if stray:
        raise UsageError(
            f"--record {', '.join(stray)}: not among the builds this run checks "
            f"({', '.join(names)})",
            "name it among BUILDS too, or name no BUILDS to check just the --record builds",
        )
    return selected


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
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Run under this interpreter (e.g. a vLLM CPU venv's bin/python) instead of a cached venv.",
)
@click.option(
    "--server",
    "server",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="For an engine that is a built program (llama.cpp's llama-server): ask this CPU "
    "build of its server instead of the image's.",
)
@click.option(
    "--allow-version-mismatch",
    is_flag=True,
    help="Judge the build with --python even when its engine is another release than the "
    "build's (the header names both).",
)
@options.locked(help="Prepare exactly what images.lock pins.")
@options.json()
@options.json_file(help="Write the report as JSON to FILE.")
@options.record(
    multiple=True,
    help="Record BUILD's verdicts in images.lock under builds.<BUILD>.preflight "
    "(repeatable; with no BUILDS named, checks just these).",
)
@click.pass_obj
def preflight_command(  # noqa: PLR0913 - click passes each option as a parameter
    settings: Settings,
    builds: tuple[str, ...],
    profiles: tuple[str, ...],
    image: str | None,
    in_image: bool,
    python: Path | None,
    server: Path | None,
    allow_version_mismatch: bool,
    locked: bool,
    as_json: bool,
    json_file: str | None,
    record_build: tuple[str, ...],
) -> None:
    """Check BUILDS (default: all) on the CPU: compile, imports, flags, env, config, signals."""
    if sum(bool(x) for x in (image, in_image, python, server)) > 1:
        raise UsageError("--image, --in-image, --python and --server are places to run; pass one")
    json_path = options.json_destination(as_json, json_file)
    selected = _selected(settings, builds, record_build)
    if image and len(selected) != 1:
        raise UsageError("--image checks one build's image; name that build")

    def check(build: Build) -> PreflightReport:
        pinned = lockfile.pinned_image_id(settings.lock_file, build.name) if in_image else None
        where = Where(
            image=image or pinned,
            python=python.absolute() if python else None,
            server=server.absolute() if server else None,
            allow_version_mismatch=allow_version_mismatch,
        )
        return preflight_one(settings, build, _profiles(build, profiles), where, locked=locked)

    def record_verdict(report: PreflightReport) -> None:
        if report.build in record_build:
            record(settings, report)

    run_per_build(
        selected,
        check,
        summary=_summary,
        json_path=json_path,
        noun="builds",
        verdicts=VERDICTS,
        record=record_verdict if record_build else None,
    )


COMMANDS: list[click.Command] = [preflight_command]
