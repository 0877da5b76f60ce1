"""``sparkbuild profile import``: a smoke profile (and claims) from a Spark Arena recipe."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import click
import yaml

from sparkbuild import console, fileio
from sparkbuild.cli import emit_json, options
from sparkbuild.errors import UsageError
from sparkbuild.settings import Settings


@click.group("profile")
def profile() -> None:
    """Smoke profiles: import one from a Spark Arena / sparkrun recipe."""


def _overrides(values: tuple[str, ...]) -> dict[str, Any]:
    """``-o KEY=VALUE`` as sparkrun reads them: the value as a YAML scalar (8192 a number)."""
    found: dict[str, Any] = {}
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
    if path.exists() and not force:
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
def import_recipe_command(
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
    """Make a smoke profile from a Spark Arena / sparkrun recipe (recipe_version 2).

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
    profile_path = out or settings.smoke_dir / f"{imported.name}.yaml"
    claims_path = settings.project_dir / "claims" / f"{imported.name}.yaml"
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
            {**imported.to_json(), "profile": str(profile_path),
             "claims": str(claims_path) if claims_text else None}
        )  # fmt: skip
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


COMMANDS: list[click.Command] = [profile]
