"""`sparkbuild patches`, `prepare` and `lock`: the source stage on the command line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from sparkbuild import console, requirements, source
from sparkbuild import lock as lockfile
from sparkbuild.cli import emit_json
from sparkbuild.errors import EXIT_FAILURE
from sparkbuild.settings import Settings
from sparkbuild.spec import Build, load_builds, select

_STATUS_STYLE = {
    "applied": "green",
    "upstream": "cyan",
    "out-of-range": "dim",
    "conflict": "bold red",
    "missing": "bold red",
}

locked_option = click.option(
    "--locked", is_flag=True, help="Use only what images.lock pins; fail if anything differs."
)
json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")


def _prepare_all(
    settings: Settings, names: tuple[str, ...], locked: bool
) -> list[source.PreparedSource]:
    builds: list[Build] = select(load_builds(settings), names)
    return [source.prepare_source(build, settings, locked=locked) for build in builds]


def _table(results: list[source.PreparedSource]) -> Table:
    table = Table(show_lines=False, pad_edge=False)
    for column in ("build", "kind", "item", "status", "detail"):
        table.add_column(column, overflow="fold")
    for prepared in results:
        for item in prepared.items:
            table.add_row(
                prepared.build.name,
                item.kind,
                item.id,
                f"[{_STATUS_STYLE[item.status]}]{item.status}[/]",
                item.detail,
            )
        if not prepared.items:
            table.add_row(prepared.build.name, "", "(no PRs or patches)", "", "")
    return table


@click.command()
@click.argument("builds", nargs=-1)
@locked_option
@json_option
@click.pass_obj
def patches(settings: Settings, builds: tuple[str, ...], locked: bool, as_json: bool) -> None:
    """Status of every PR and patch of BUILDS (default: all). Exit 1 on conflict or missing.

    Builds with `requirements:` also list each one that the release pins differently.
    """
    results = _prepare_all(settings, builds, locked)
    checked = {r.build.name: requirements.check(r, settings) for r in results if r.ok}
    if as_json:
        emit_json({"builds": [_with_requirements(r.to_json(), checked) for r in results]})
    else:
        console.out.print(_table(results))
        _print_requirement_conflicts(checked)
    if not all(r.ok for r in results) or not all(c.ok for c in checked.values() if c):
        raise SystemExit(EXIT_FAILURE)


def _with_requirements(
    data: dict[str, Any], checked: dict[str, requirements.RequirementReport | None]
) -> dict[str, Any]:
    report = checked.get(str(data.get("build")))
    return {**data, "requirements": report.to_json()} if report else data


def _print_requirement_conflicts(checked: dict[str, requirements.RequirementReport | None]) -> None:
    for report in (r for r in checked.values() if r is not None):
        for conflict in report.conflicts:
            style = "yellow" if conflict.overridden else "bold red"
            console.out.print(Text(conflict.describe(report.build), style=style))


@click.command()
@click.argument("build")
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default=None,
    help="Where to check out the patched tree [default: CACHE/trees/BUILD].",
)
@locked_option
@json_option
@click.pass_obj
def prepare(settings: Settings, build: str, out: str | None, locked: bool, as_json: bool) -> None:
    """Check out BUILD's patched tree and print its tree hash."""
    (prepared,) = _prepare_all(settings, (build,), locked)
    target = Path(out) if out else source.default_checkout_dir(settings, prepared.build)
    path = source.checkout(prepared, target)
    if as_json:
        emit_json({"builds": [{**prepared.to_json(), "path": str(path)}]})
    elif prepared.ok:
        console.out.print(prepared.tree, markup=False)
        console.info(f"{prepared.build.name}: patched tree at {path}")
    if not prepared.ok:
        _explain_conflicts(prepared, path)
        raise SystemExit(EXIT_FAILURE)


def _explain_conflicts(prepared: source.PreparedSource, path: Path) -> None:
    console.out.print(_table([prepared]))
    for item in prepared.items:
        if item.status == "conflict":
            name = source.conflict_patch_name(item)
            console.err.print(
                f"{item.id} does not apply. The tree before it is at {path}; to see the "
                f"conflict:\n  cd {path} && git apply --3way .git/sparkbuild/{name}",
                markup=False,
            )
        elif item.status == "missing":
            console.err.print(f"{item.id}: {item.detail}", markup=False)


@click.command(name="lock")
@click.argument("builds", nargs=-1)
@click.option(
    "--check", is_flag=True, help="Offline: exit 1 and say what differs if the lock is stale."
)
@click.pass_obj
def lock_command(settings: Settings, builds: tuple[str, ...], check: bool) -> None:
    """Resolve BUILDS (default: all) and pin them in images.lock."""
    selected = select(load_builds(settings), builds)
    if check:
        _check(settings, selected, all_builds=not builds)
        return
    failed = []
    for build in selected:
        prepared = source.prepare_source(build, settings)
        if prepared.ok:
            pinned = requirements.lock_requirements(prepared, settings)  # raises on a conflict
            source.record(prepared, settings)
            if pinned is not None:
                requirements.record(pinned, settings)
            console.info(
                f"locked {build.name}: {prepared.base_commit[:12]} tree {prepared.tree[:12]}"
            )
        else:
            failed.append(prepared)
    if failed:
        console.out.print(_table(failed))
        names = ", ".join(p.build.name for p in failed)
        console.err.print(
            f"not locked (conflict or missing): {names}; their entries are unchanged", markup=False
        )
        raise SystemExit(EXIT_FAILURE)


def _check(settings: Settings, builds: list[Build], all_builds: bool) -> None:
    data = lockfile.load(settings.lock_file)
    problems: list[str] = []
    for build in builds:
        entry = lockfile.build_entry(data, build.name)
        problems += source.staleness(build, entry.get("source") if entry else None)
    if all_builds:
        known = {b.name for b in builds}
        problems += [
            f"{name}: in the lock but in no spec" for name in data["builds"] if name not in known
        ]
    if problems:
        console.err.print("images.lock is stale:\n  " + "\n  ".join(problems), markup=False)
        console.err.print(
            "hint: run `sparkbuild lock` (or `nox -s lock`) and commit images.lock", markup=False
        )
        raise SystemExit(EXIT_FAILURE)
    console.info(f"images.lock matches the specs ({len(builds)} build(s))")


COMMANDS: list[click.Command] = [patches, prepare, lock_command]
