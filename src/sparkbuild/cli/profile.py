"""``sparkbuild profile import``: a smoke profile (and claims) from a Spark Arena recipe."""

from __future__ import annotations

import datetime
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import yaml

from sparkbuild import console, fileio
from sparkbuild.cli import emit_json, options
from sparkbuild.errors import LockError, UsageError
from sparkbuild.settings import Settings

if TYPE_CHECKING:
    from sparkbuild.lockfile import BuildEntry


@click.group("profile")
def profile() -> None:
    """Smoke profiles: import one from a Spark Arena / sparkrun recipe, or export one as a
    recipe that runs a build's image."""


def _overrides(values: tuple[str, ...]) -> dict[str, Any]:
    """``-o KEY=VALUE`` as sparkrun reads them: the value as a YAML scalar (8192 a number)."""
    found: dict[str, object] = {}
    for value in values:
        key, sep, text = value.partition("=")
        if not sep or not key.isidentifier():
            raise UsageError(f"-o {value!r} is not KEY=VALUE", "e.g. -o max_model_len=8192")
        try:
            parsed = yaml.safe_load(text) if text else ""
        except yaml.YAMLError:
            parsed = text
        found[key] = parsed if isinstance(parsed, str | int | float | bool) else text
    return found


def _write(path: Path, text: str) -> None:
    """Whole or not at all (``fileio.write_atomic``)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fileio.write_atomic(path, text)
    except OSError as exc:
        raise UsageError(f"{path}: cannot write: {fileio.reason(exc)}") from exc


def _free(path: Path, force: bool, what: str) -> None:
    if os.path.lexists(path) and not force:  # a dangling symlink is something there too
        raise UsageError(f"{what} {path} exists", "pass --force to replace it, or --name NAME")


@profile.command("import")
@click.argument("recipe", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--name", metavar="NAME", help="Profile name [default: the recipe's file name].")
@click.option(
    "-o",
    "--option",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a recipe default before rendering its command (as sparkrun's -o).",
)
@options.model(help="Serve this model instead of the recipe's (a path, an id, or '${VAR}').")
@options.engine_version(
    help="The engine release the profile will run (checks what differs by release, such as "
    "--load-format)."
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the profile here [default: smoke/NAME.yaml].",
)
@click.option("--force", is_flag=True, help="Replace an existing profile (and claims file).")
@click.option(
    "--figure",
    "figures",
    multiple=True,
    metavar="METRIC=VALUE",
    help="A figure published for the recipe (e.g. decode_tps=62.2, or LOW-HIGH): writes "
    "claims/NAME.yaml.",
)
@click.option("--cell", metavar="pp=N,tg=N,depth=N,c=N", help="The cell the figures are for.")
@click.option(
    "--claim-source",
    default="Spark Arena leaderboard",
    show_default=True,
    help="Who published the figures.",
)
@click.option("--claim-url", metavar="URL", help="Where the figures were published.")
@click.option("--claim-date", metavar="YYYY[-MM[-DD]]", help="When [default: today].")
@click.option(
    "--claim-harness",
    default="llama-benchy via sparkrun (Spark Arena)",
    show_default=True,
    help="What measured the figures.",
)
@options.json()
@click.pass_obj
def import_recipe_command(  # noqa: PLR0913 - click passes each option as a parameter
    settings: Settings,
    recipe: Path,
    name: str | None,
    overrides: tuple[str, ...],
    model: str | None,
    engine_version: str | None,
    out: Path | None,
    force: bool,
    figures: tuple[str, ...],
    cell: str | None,
    claim_source: str,
    claim_url: str | None,
    claim_date: str | None,
    claim_harness: str,
    as_json: bool,
) -> None:
    """Make a smoke profile from a Spark Arena / sparkrun recipe (as sparkrun 0.4.2 reads it).

    The flags are rendered from the recipe's command with its defaults (and -o overrides);
    env is kept; tensor/pipeline parallel sizes become the profile's parallel layout; the
    recipe and its container are recorded in the profile. What a profile cannot hold (mods,
    hooks, a --load-format the engine release lacks) is listed, not dropped silently. With
    --figure, a claims file holds the recipe's published figure for bench to compare with.
    """
    from packaging.version import InvalidVersion, Version

    from sparkbuild.bench import arena
    from sparkbuild.engines.recipes import import_recipe

    if not recipe.is_file():
        raise UsageError(f"recipe {recipe} does not exist", "pass the recipe's YAML file")
    try:
        version = Version(engine_version) if engine_version else None
    except InvalidVersion:
        raise UsageError(f"--engine-version {engine_version!r} is not a version") from None
    if (cell or claim_url or claim_date) and not figures:
        raise UsageError("--cell and --claim-* describe a --figure", "add --figure METRIC=VALUE")
    imported = import_recipe(
        recipe, name=name, overrides=_overrides(overrides), model=model, engine_version=version
    )
    root = settings.project_dir
    profile_path = out or fileio.project_output(root, f"smoke/{imported.name}.yaml", "--out")
    claims_path = fileio.project_output(root, f"claims/{imported.name}.yaml")
    claims_text = None
    if figures:
        claims_text = arena.recipe_claims(
            imported,
            dict(arena.parse_figure(f) for f in figures),
            cell=arena.parse_cell(cell or ""),
            source=claim_source,
            url=claim_url,
            date=claim_date or datetime.date.today().isoformat(),
            harness=claim_harness,
        )
        _free(claims_path, force, "claims file")
    _free(profile_path, force, "profile")
    _write(profile_path, imported.yaml_text())
    if claims_text is not None:
        _write(claims_path, claims_text)
    if as_json:
        emit_json(
            {
                **imported.to_json(),
                "profile": str(profile_path),
                "claims": str(claims_path) if claims_text else None,
            }
        )
        return
    _show(imported.notes, profile_path, claims_path if claims_text else None)


def _show(notes: Any, profile_path: Path, claims_path: Path | None) -> None:
    for note in notes:
        line = f"{note.status:8} {note.item}: {note.detail}"
        console.out.print(line, markup=False, style="yellow" if note.status == "dropped" else None)
    console.out.print(f"wrote {profile_path}", markup=False)
    if claims_path is not None:
        console.out.print(f"wrote {claims_path}", markup=False)
    console.info(f"next: sparkbuild preflight BUILD --profile {profile_path.stem}")


def _published_image(
    settings: Settings, build: str, repository: str | None
) -> tuple[str, BuildEntry]:
    """The reference by digest of ``build``'s image in a registry (what ``publish`` pushed,
    else the digest ``build`` recorded), and the build's lock entry."""
    from sparkbuild.lockfile import LockHandle

    entry = LockHandle.open(settings.lock_file).entry(build)
    if entry is None:
        raise UsageError(
            f"build {build!r} is not in {settings.lock_file}", f"sparkbuild build {build}"
        )
    published = {
        repo: f"{repo}@{record.digest}"
        for repo, record in (entry.publish or {}).items()
        if record.digest and (repository is None or repo == repository)
    }
    if len(published) > 1:
        raise UsageError(
            f"build {build} is published to {len(published)} repositories: "
            + ", ".join(sorted(published)),
            "pick one with --repository REPO",
        )
    if published:
        return next(iter(published.values())), entry
    image = entry.image
    if repository is None and image is not None and image.repo_digest and "@" in image.repo_digest:
        return image.repo_digest, entry
    where = f" to {repository}" if repository else ""
    raise UsageError(
        f"build {build} has no image in a registry{where}: nothing a recipe can pull by digest",
        f"sparkbuild publish {build} --repository REPO, or pass --image REPO@sha256:...",
    )


def _image_builds(settings: Settings, image: str) -> tuple[str | None, BuildEntry | None]:
    """The build whose image ``image`` (a reference by digest) is, as the lock records it:
    pushed there by ``publish``, or the digest ``build`` recorded."""
    from sparkbuild.lockfile import load

    for build, entry in sorted(load(settings.lock_file).builds.items()):
        pushed = {f"{repo}@{record.digest}" for repo, record in (entry.publish or {}).items()}
        if image in pushed or (entry.image is not None and entry.image.repo_digest == image):
            return build, entry
    return None, None


def _origin(
    build: str | None, entry: BuildEntry | None, profile_name: str, image: str
) -> dict[str, object]:
    """Where the recipe's image came from, and the smoke verdict this profile got on it:
    a pass that nothing shows ran on the image (a --url or --command run) says so."""
    image_id = entry.image.image_id if entry is not None and entry.image is not None else None
    if build is None or image_id is None:
        where = f"build {build} records no image id" if build else "no build in images.lock has it"
        console.warn(
            f"the image {image} has no smoke verdict of profile {profile_name} ({where}): the "
            "recipe runs an image not checked with it"
        )
        return {"build": build} if build else {}
    record = ((entry.smoke or {}) if entry else {}).get(image_id, {}).get(profile_name)
    verdict = record.verdict if record is not None else None
    verified = record is not None and record.image_verified(image_id)
    kind = record.target_kind if record is not None else "unknown"
    if verdict != "pass":
        console.warn(
            f"profile {profile_name} has no passing smoke verdict on build {build}'s image "
            f"({verdict or 'none recorded'}): the recipe runs an image not checked with it"
        )
    elif not verified:
        console.warn(
            f"profile {profile_name}'s smoke pass on build {build}'s image is unverified (a "
            f"{kind} run: nothing shows it ran that image): the recipe runs an image not "
            "proven checked with it"
        )
    smoke = {"verdict": verdict, "verified": verified} if verdict else None
    return {"build": build, "image_id": image_id, "smoke": smoke}


@profile.command("export")
@click.argument("profile_name", metavar="PROFILE")
@click.option("--build", metavar="BUILD", help="Run this build's published image (by digest).")
@click.option("--image", metavar="REPO@sha256:DIGEST", help="Run this image instead of a build's.")
@click.option("--repository", metavar="REPO", help="The build's repository, if several.")
@options.model(help="Serve this model instead of the profile's (a hub id or absolute path).")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the recipe here [default: print it].",
)
@click.option("--force", is_flag=True, help="Replace an existing --out file.")
@options.json()
@click.pass_obj
def export_recipe_command(  # noqa: PLR0913 - click passes each option as a parameter
    settings: Settings,
    profile_name: str,
    build: str | None,
    image: str | None,
    repository: str | None,
    model: str | None,
    out: Path | None,
    force: bool,
    as_json: bool,
) -> None:
    """Write a sparkrun recipe that runs PROFILE's engine from a build's image, by digest.

    The flags sparkrun's map knows go to `defaults` with {placeholders} (so `-o KEY=VALUE`
    changes them); the rest stay in the command; env and the parallel layout come along.
    `sparkrun recipe validate --strict` passes it with no findings.
    """
    from sparkbuild.engines.profiles import load_profile
    from sparkbuild.engines.recipe_writer import export_recipe, recipe_yaml

    if (build is None) == (image is None):
        raise UsageError("pass --build BUILD or --image REPO@sha256:DIGEST (one of them)")
    if repository and image:
        raise UsageError("--repository picks a build's repository", "drop it with --image")
    name, loaded = load_profile(settings, profile_name, model=model, need_model=False)
    entry: BuildEntry | None
    if build is not None:
        image, entry = _published_image(settings, build, repository)
    else:
        build, entry = _image_builds(settings, str(image))
    origin = _origin(build, entry, name, str(image))
    document = export_recipe(name, loaded, str(image), model=model, origin=origin)
    text = recipe_yaml(document)
    if out is not None:
        _free(out, force, "recipe")
        _write(out, text)
    if as_json:
        emit_json(
            {
                "profile": name,
                "container": image,
                "build": build,
                "recipe": str(out) if out else None,
                "text": text,
            }
        )
    elif out is None:
        click.echo(text, nl=False)
    else:
        console.out.print(f"wrote {out}", markup=False)
        console.info(f"check it: sparkrun recipe validate --strict {out}")


@profile.command("fit")
@click.argument("profile_name", metavar="PROFILE")
@options.model(help="Estimate this model instead of the profile's.")
@options.engine_version(help="The engine release (where the draft is counted changes with it).")
@click.option("--context", metavar="TOKENS", help="Context per sequence [default: the profile's].")
@click.option("--concurrency", type=click.IntRange(1, 1024), default=1, show_default=True)
@click.option(
    "--draft-memory-patch",
    is_flag=True,
    help="The image carries sparkbuild's draft-memory patch for the profile's engine (its "
    "adapter's memory.draft_patch: the draft counted before the KV pool).",
)
@click.option(
    "--memory-gib",
    type=options.FiniteFloat(1, 4096),
    default=119.0,
    show_default=True,
    help="Memory of one node (a DGX Spark: 119).",
)
@options.json()
@click.pass_obj
def fit_command(  # noqa: PLR0913 - click passes each option as a parameter
    settings: Settings,
    profile_name: str,
    model: str | None,
    engine_version: str | None,
    context: str | None,
    concurrency: int,
    draft_memory_patch: bool,
    memory_gib: float,
    as_json: bool,
) -> None:
    """Estimate whether PROFILE's engine fits a DGX Spark's memory, before any boot.

    Weights, the KV cache at the context and concurrency, the draft model and where the
    engine release puts it, and recurrent (Mamba) state; exit 1 when it does not fit.
    """
    from packaging.version import InvalidVersion, Version

    from sparkbuild import lockfile
    from sparkbuild.engines.fit_measured import describe as describe_measured
    from sparkbuild.engines.fit_measured import measurements
    from sparkbuild.engines.memory_fit import describe, parse_size, profile_fit
    from sparkbuild.engines.profiles import load_profile

    try:
        version = Version(engine_version) if engine_version else None
    except InvalidVersion:
        raise UsageError(f"--engine-version {engine_version!r} is not a version") from None
    name, loaded = load_profile(settings, profile_name, model=model, need_model=False)
    fit = profile_fit(
        loaded,
        version=version,
        context=parse_size(context) if context else None,
        concurrency=concurrency,
        draft_patched=draft_memory_patch,
        memory_gib=memory_gib,
    )
    if isinstance(fit, str):
        raise UsageError(fit, "pass --model with a local model directory (its config.json)")
    try:
        lock = lockfile.load(settings.lock_file)
    except LockError as exc:  # the estimate stands without the measurements
        console.warn(f"no measured runs: {exc.message}")
        lock = lockfile.empty()
    measured = measurements(lock, name, engine_version)
    if as_json:
        emit_json(
            {"profile": name, **fit.to_json(), "measured": [m.to_json(fit) for m in measured]}
        )
    else:
        for line in [*describe(fit), *describe_measured(fit, measured)]:
            console.out.print(line, markup=False)
    if not fit.fits:
        raise SystemExit(1)


COMMANDS: list[click.Command] = [profile]
