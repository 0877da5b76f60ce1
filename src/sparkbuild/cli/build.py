"""`sparkbuild build`: the image stage on the command line."""

from __future__ import annotations

import click

from sparkbuild import lockfile, source
from sparkbuild.adapters import engine_names
from sparkbuild.cli import options, run_per_build
from sparkbuild.errors import BuildInputError, UsageError
from sparkbuild.image import BuildOptions, ImageJob, ImageResult, build_image
from sparkbuild.image.builder import cache_refs
from sparkbuild.settings import Settings
from sparkbuild.spec import Build, load_builds, select


def _selected(settings: Settings, names: tuple[str, ...], engine: str | None) -> list[Build]:
    builds = select(load_builds(settings), names)
    if engine is None:
        return builds
    other = [b.name for b in builds if b.engine != engine and names]
    if other:
        raise UsageError(f"--engine {engine}, but {', '.join(other)} is not a {engine} build")
    chosen = [b for b in builds if b.engine == engine]
    if not chosen:
        raise UsageError(f"no {engine} builds in {settings.builds_dir}")
    return chosen


def _summary(result: ImageResult) -> str:
    what = "up to date" if result.skipped else "built"
    tags = ", ".join(result.tags)
    checked = "; reproducible (a second build without the cache gave the same id)"
    return (
        f"{result.build}: {what} {result.image_id[:19]} {result.platform} "
        f"in {result.seconds:.1f} s; tags: {tags}{checked if result.reproducible else ''}"
    )


@click.command(name="build")
@click.argument("builds", nargs=-1)
@click.option(
    "--engine",
    type=click.Choice(engine_names()),
    help="Only this engine's builds (all of them when no BUILD is named).",
)
@options.locked(
    help="Build exactly what images.lock pins (source and base digest); fail if the inputs differ."
)
@click.option(
    "--platform",
    default=None,
    metavar="OS/ARCH",
    help="Override the spec's platform [spec default: linux/arm64].",
)
@click.option(
    "--builder",
    "builder_name",
    default=None,
    metavar="NAME",
    help="A docker buildx builder, e.g. a remote BuildKit on a native arm64 Spark.",
)
@click.option("--no-cache", is_flag=True, help="Rebuild every step, even if up to date.")
@click.option(
    "--check-reproducible",
    is_flag=True,
    help="Build a second time without the cache, in another directory, and compare: the same "
    "image id, or every differing file named (recorded in images.lock; exit 1 if not).",
)
@click.option(
    "--cache-from",
    multiple=True,
    metavar="REF",
    envvar="SPARKBUILD_CACHE_FROM",
    help="Reuse layers from a registry build cache, e.g. ghcr.io/org/sparkbuild-cache:{build} "
    "[env SPARKBUILD_CACHE_FROM].",
)
@click.option(
    "--cache-to",
    metavar="REF",
    envvar="SPARKBUILD_CACHE_TO",
    help="Export every stage's layers to a registry build cache (needs buildx) "
    "[env SPARKBUILD_CACHE_TO].",
)
@options.json()
@click.pass_obj
def build_command(  # noqa: PLR0913 - click passes each option as a parameter
    settings: Settings,
    builds: tuple[str, ...],
    engine: str | None,
    locked: bool,
    platform: str | None,
    builder_name: str | None,
    no_cache: bool,
    check_reproducible: bool,
    cache_from: tuple[str, ...],
    cache_to: str | None,
    as_json: bool,
) -> None:
    """Build the images of BUILDS (default: all), or report them up to date."""
    selected = _selected(settings, builds, engine)
    for build in selected:  # a bad cache reference is the command line's fault: exit 2, no work
        try:
            cache_refs(cache_from, cache_to, build.name)
        except BuildInputError as exc:
            raise UsageError(exc.message, exc.hint) from None
    build_options = BuildOptions(
        locked=locked,
        platform=platform,
        builder_name=builder_name,
        no_cache=no_cache,
        cache_from=cache_from,
        cache_to=cache_to,
        check_reproducible=check_reproducible,
    )
    lock = lockfile.LockHandle.open(settings.lock_file)  # read once; each build writes its entry

    def build_one(build: Build) -> ImageResult:
        job = ImageJob.start(build, settings, build_options, lock=lock)  # the host before any fetch
        prepared = source.prepare_source(build, settings, locked=locked, lock=lock.lock)
        return build_image(prepared, job)

    run_per_build(
        selected,
        build_one,
        summary=_summary,
        json_path=options.json_destination(as_json),
        noun="builds",
    )


COMMANDS: list[click.Command] = [build_command]
