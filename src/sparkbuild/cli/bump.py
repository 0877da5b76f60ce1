"""`sparkbuild bump` and `sparkbuild releases`: follow upstream releases with the patch set."""

from __future__ import annotations

import click
from rich.table import Table
from rich.text import Text

from sparkbuild import console, lockfile, source
from sparkbuild.adapters import adapter_type
from sparkbuild.bump.items import BumpPlan
from sparkbuild.bump.plan import pick_from, plan_bump, release_tags
from sparkbuild.bump.write import fresh_builds, write_plan
from sparkbuild.cli import emit_json, options
from sparkbuild.console import Breakable
from sparkbuild.errors import BumpNotReadyError
from sparkbuild.settings import Settings
from sparkbuild.source.mirror import Mirror
from sparkbuild.spec import load_builds

_STYLE = {
    "keep": "green",
    "regenerated": "yellow",
    "upstream": "cyan",
    "follow-range": "magenta",
    "out-of-range": "dim",
    "conflict": "bold red",
    "missing": "bold red",
}


def _table(plan: BumpPlan) -> Table:
    table = Table(pad_edge=False)
    for column in ("item", f"on {plan.from_build.ref}", f"on {plan.tag}", "decision", "detail"):
        table.add_column(column, overflow="fold")
    for d in plan.decisions:
        detail = d.detail
        if d.variant_file:
            detail += f" -> {d.variant_file} (when {d.variant_when})"
        if d.report_file:
            detail += f" -> report {d.report_file}"
        style = _STYLE[d.action]
        action = Text(d.action, style=style)
        table.add_row(Breakable(d.id), d.status_from, d.status_to, action, Breakable(detail))
    return table


def _show(plan: BumpPlan, write: bool) -> None:
    if plan.decisions:
        console.show_table(console.out, _table(plan))
    else:  # no header-only table
        console.out.print(
            f"nothing to carry: {plan.from_build.name} has no PRs or patches", markup=False
        )
    if not write:
        console.out.print(plan.spec_diff(), markup=False, end="")
        for path, data in plan.files.items():
            console.out.print(f"\nnew file: {path}", style="bold", markup=False)
            console.out.print(data.decode(errors="replace"), markup=False, end="")
    for note in plan.notes:
        console.warn(note)
    verdict = "ready" if plan.ready else "NOT READY (conflicts: see the reports)"
    console.out.print(
        f"{plan.new_build}: {plan.tag}, from {plan.from_build.name}: {verdict}", markup=False
    )


def _lock(settings: Settings, plan: BumpPlan, fresh: set[str]) -> list[str]:
    """Pin the new build, and re-pin builds the `when` edits made stale (same sources)."""
    builds = load_builds(settings)
    names = [plan.new_build] if plan.ready else []
    names += sorted(n for n in fresh if n in builds and n != plan.new_build)
    locked = []
    lock = lockfile.LockHandle.open(settings.lock_file)
    for name in names:
        prepared = source.prepare_source(builds[name], settings, lock=lock.lock)
        if prepared.ok:
            source.record(prepared, lock)
            lock.write()  # this build's entry, once; a later build's error keeps it
            locked.append(name)
    return locked


@click.command()
@click.argument("engine")
@click.option("--to", "to", required=True, metavar="vX.Y.Z", help="The upstream release.")
@click.option(
    "--from", "from_build", default=None, metavar="BUILD", help="[default: newest ENGINE build]"
)
@click.option("--write", is_flag=True, help="Edit the spec, write the patches, lock the build.")
@options.json()
@click.pass_obj
def bump(
    settings: Settings, engine: str, to: str, from_build: str | None, write: bool, as_json: bool
) -> None:
    """Add a build of ENGINE's release --to, carrying the PRs and patches of --from.

    Without --write it prints the spec diff and the new files and changes nothing.
    Exit 1 when the new build is not ready (a conflict report was written).
    """
    fresh = fresh_builds(settings) if write else set()
    plan = plan_bump(settings, engine, to, from_build)
    locked: list[str] = []
    if write:
        write_plan(settings, plan)
        locked = _lock(settings, plan, fresh)
    if as_json:
        emit_json({**plan.to_json(), "written": write, "locked": locked})
    else:
        _show(plan, write)
        if write:
            console.info(f"wrote {plan.spec_file} and {len(plan.files)} file(s)")
            if locked:
                console.info(f"locked: {', '.join(locked)}")
    if not plan.ready:
        raise BumpNotReadyError(
            f"{plan.new_build} is not ready: some items could not be carried to {to}",
            "read the conflict report(s) under patches/<engine>/conflicts/ and finish by hand",
        )


@click.command()
@click.argument("engine")
@click.option("--all", "show_all", is_flag=True, help="Also releases older than the newest build.")
@options.json()
@click.pass_obj
def releases(settings: Settings, engine: str, show_all: bool, as_json: bool) -> None:
    """Upstream release tags of ENGINE newer than its newest build, from the mirror."""
    newest = pick_from(load_builds(settings), engine, None)
    tags = release_tags(Mirror(settings.cache_dir, newest.repo), adapter_type(engine).release_tags)
    listed = sorted(
        (v for v in tags if show_all or v > newest.version), key=lambda v: v, reverse=True
    )
    if as_json:
        emit_json(
            {
                "engine": engine,
                "newest_build": newest.name,
                "newest_build_version": str(newest.version),
                "releases": [
                    {"version": str(v), "tag": tags[v], "prerelease": v.is_prerelease}
                    for v in listed
                ],
            }
        )
        return
    if not listed:
        console.info(f"no {engine} release newer than {newest.name} ({newest.version})")
        return
    for version in listed:
        console.out.print(f"{tags[version]}\t{version}", markup=False)
    console.info(f"newest build: {newest.name}; `sparkbuild bump {engine} --to {tags[listed[0]]}`")


COMMANDS: list[click.Command] = [bump, releases]
