"""`sparkbuild patches`, `prepare` and `lock`: the source stage on the command line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from sparkbuild import console, lockfile, requirements, source
from sparkbuild.cli import check_directory, emit_json, options
from sparkbuild.cli.output import FailurePrinter, failed_json
from sparkbuild.console import Breakable, plural
from sparkbuild.errors import (
    BuildsFailedError,
    ItemsDoNotApplyError,
    RequirementsClashError,
    SparkbuildError,
)
from sparkbuild.settings import Settings
from sparkbuild.source import lockcheck
from sparkbuild.source.pins import read_once
from sparkbuild.spec import Build, load_builds, select

_STATUS_STYLE = {
    "applied": "green",
    "upstream": "cyan",
    "out-of-range": "dim",
    "conflict": "bold red",
    "missing": "bold red",
    "invalid": "bold red",
}


def _prepare_all(
    settings: Settings, names: tuple[str, ...], locked: bool, *, collect: bool = True
) -> tuple[list[source.PreparedSource], list[tuple[str, SparkbuildError]]]:
    """Every build's report; a build that cannot be prepared at all is listed, not fatal
    (unless ``collect`` is off: then the first such error is raised)."""
    builds: list[Build] = select(load_builds(settings), names)
    lock = read_once(settings, locked=locked) if builds else None
    results: list[source.PreparedSource] = []
    failures: list[tuple[str, SparkbuildError]] = []
    for build in builds:
        try:
            results.append(source.prepare_source(build, settings, locked=locked, lock=lock))
        except SparkbuildError as exc:
            if not collect:
                raise
            failures.append((build.name, exc))
    return results, failures


def _table(results: list[source.PreparedSource]) -> Table:
    table = Table(show_lines=False, pad_edge=False)
    for column in ("build", "kind", "item", "status", "detail"):
        table.add_column(column, overflow="fold")
    for prepared in results:
        for item in prepared.items:
            # Text, not markup: names, paths and hunks such as `list[int]` are data.
            table.add_row(
                Text(prepared.build.name),
                Text(item.kind),
                Breakable(item.id),
                Text(item.status, style=_STATUS_STYLE[item.status]),
                Breakable(item.detail),
            )
        if not prepared.items:
            table.add_row(Text(prepared.build.name), "", "(no PRs or patches)", "", "")
    return table


def _failed_items(
    results: list[source.PreparedSource], checked_out: Path | None = None
) -> ItemsDoNotApplyError:
    bad = [
        f"{p.build.name} {item.id} ({item.status})"
        for p in results
        for item in p.items
        if item.status in source.FAILING
    ]
    shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
    hint = (
        f"the lines above show each conflict in {checked_out}; fix the patch or the PR's "
        "`when:`, then run this again"
        if checked_out is not None
        else "see the detail column; `sparkbuild prepare BUILD` checks out the tree before a "
        "conflict"
    )
    return ItemsDoNotApplyError(
        f"{len(bad)} item(s) do not apply: {shown}",
        hint,
    )


@click.command()
@click.argument("builds", nargs=-1)
@options.locked()
@options.json()
@click.pass_obj
def patches(settings: Settings, builds: tuple[str, ...], locked: bool, as_json: bool) -> None:
    """Status of every PR and patch of BUILDS (default: all). Exit 1 if any is in conflict,
    missing or invalid, or a build cannot be resolved; every build is still reported.

    Builds with `requirements:` also list each one that the release pins differently.
    """
    results, failures = _prepare_all(settings, builds, locked)
    checked = {r.build.name: requirements.check(r, settings) for r in results if r.ok}
    if as_json:  # one shape, for one build or many, whether they failed or not
        emit_json(
            {
                "builds": [_with_requirements(r.to_json(), checked) for r in results],
                "failed": failed_json(failures),
            }
        )
    elif results:  # no header-only table beside the errors
        console.show_table(console.out, _table(results))
        _print_requirement_conflicts(checked)
    if len(failures) == 1 and not results:
        raise failures[0][1]  # the one build asked for: its own error, as is
    if failures:
        if not as_json:
            printer = FailurePrinter()
            for name, exc in failures:
                printer.show(name, exc)
        names = ", ".join(name for name, _ in failures)
        raise BuildsFailedError(f"{plural(len(failures), 'build')} could not be prepared: {names}")
    if not all(r.ok for r in results):
        raise _failed_items(results)
    clashing = [name for name, report in checked.items() if report and not report.ok]
    if clashing:
        raise RequirementsClashError(
            f"requirements clash with the release's own pins: {', '.join(clashing)}",
            "see the conflicts above; pin a compatible version, or set `override: true` on "
            "the requirement when the clash is intended",
        )


def _with_requirements(
    data: dict[str, Any], checked: dict[str, requirements.RequirementReport | None]
) -> dict[str, object]:
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
@click.option(
    "--force", is_flag=True, help="Discard local edits and untracked files in the checkout."
)
@options.locked()
@options.json()
@click.pass_obj
def prepare(
    settings: Settings, build: str, out: str | None, force: bool, locked: bool, as_json: bool
) -> None:
    """Check out BUILD's patched tree and print its tree hash."""
    check_directory(out, "--out")  # before the fetch and the patching, not after
    (prepared,), _ = _prepare_all(settings, (build,), locked, collect=False)
    target = Path(out) if out else source.default_checkout_dir(settings, prepared.build)
    path = source.checkout(prepared, target, force=force)
    if as_json:
        emit_json({"builds": [{**prepared.to_json(), "path": str(path)}]})
    elif prepared.ok:
        console.out.print(prepared.tree, markup=False)
        console.info(f"{prepared.build.name}: patched tree at {path}")
    if not prepared.ok:
        _explain_conflicts(prepared, path, table=not as_json)  # stdout stays JSON with --json
        raise _failed_items([prepared], checked_out=path)


def _explain_conflicts(prepared: source.PreparedSource, path: Path, *, table: bool) -> None:
    if table:
        console.show_table(console.out, _table([prepared]))
    for item in prepared.items:
        if item.status == "conflict":
            name = source.conflict_patch_name(item)
            apply = f"git apply --3way .git/sparkbuild/{name}"
            if item.before_commit in (None, prepared.conflict_commit):
                where = f"The tree before it is at {path}"
                show = f"cd {path} && {apply}"
            else:  # a later conflict: the checkout stops at the first
                branch = source.before_branch(item)
                where = (
                    f"The tree before it (the items since the first conflict applied, the "
                    f"earlier conflicts left out) is branch {branch} in {path}"
                )
                show = f"cd {path} && git checkout --quiet {branch} && {apply}"
            console.err.print(
                f"{item.id} does not apply. {where}; to see the conflict:\n  {show}",
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
        lockcheck.check_lock(settings, selected, all_builds=not builds)
        return
    failed = []
    lock = lockfile.LockHandle.open(settings.lock_file)
    for build in selected:
        prepared = source.prepare_source(build, settings, lock=lock.lock)
        if prepared.ok:
            pinned = requirements.lock_requirements(prepared, settings)  # raises on a conflict
            source.record(prepared, lock)
            if pinned is not None:
                requirements.record(pinned, lock)
            lock.write()  # this build's entry, once: a later build's conflict keeps it
            console.info(
                f"locked {build.name}: {prepared.base_commit[:12]} tree {prepared.tree[:12]}"
            )
        else:
            failed.append(prepared)
    if failed:
        console.show_table(console.out, _table(failed))
        names = ", ".join(p.build.name for p in failed)
        raise ItemsDoNotApplyError(
            f"not locked (conflict, missing or invalid items): {names}; their entries are "
            "unchanged",
            f"fix them, then `sparkbuild lock {failed[0].build.name}`; "
            "`sparkbuild patches` shows the detail",
        )


COMMANDS: list[click.Command] = [patches, prepare, lock_command]
