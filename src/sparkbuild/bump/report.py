"""The conflict report of an item ``sparkbuild bump`` could not carry to the new release.

It says what was tried, shows the conflicting regions, and gives the commands that finish
the job by hand: check out the new build, apply the full diff with ``--3way``, save the
result as the new variant and lock the build.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from sparkbuild import source
from sparkbuild.bump.carry import Carried
from sparkbuild.bump.write import VERSION_SUFFIX, variant_path

if TYPE_CHECKING:
    from sparkbuild.bump.items import BumpContext


def write_report(
    ctx: BumpContext,
    item: source.ItemResult,
    carried: Carried | None,
    base_ref: str | None,
) -> str:
    stem = (
        f"pr-{item.number}"
        if item.kind == "pr"
        else VERSION_SUFFIX.sub("", Path(item.file or "x").stem)
    )
    engine = ctx.from_prepared.build.engine
    folder = f"patches/{engine}/conflicts/{ctx.new_build}"
    report = f"{folder}/{stem}.md"
    full = f"{folder}/{stem}.full.diff"
    project = ctx.settings.project_dir
    target = variant_path(ctx, item) if item.kind == "patch" else f"{folder}/{stem}.patch"
    overrides = " ".join(
        f"--repo {shlex.quote(f'{k}={v}')}" for k, v in ctx.settings.repo_overrides.items()
    )
    prefix = f"sparkbuild {overrides} " if overrides else "sparkbuild "
    lines = [
        f"# {item.id} does not apply to {ctx.tag} (build {ctx.new_build})",
        "",
        f"Status on {ctx.tag}: {item.status}: {item.detail}",
        f"Last applied to: {base_ref or 'no release sparkbuild could find'}",
        "",
        "## What was tried",
        *(f"- {attempt}" for attempt in (carried.attempts if carried else ())),
        "",
        "## Conflicting regions",
        "```",
        (carried.conflict_text if carried and carried.conflict_text else item.detail),
        "```",
        "",
        "## Finish by hand",
        "```",
        f"{prefix}prepare {ctx.new_build} --out /tmp/{ctx.new_build}",
        f"cd /tmp/{ctx.new_build} && git apply --3way {shlex.quote(str(project / full))}",
        "# resolve the conflicts, then save the result as the new variant:",
        f"git diff HEAD > {shlex.quote(str(project / target))}",
        f"# copy the header of {item.file or item.id} onto it, split the `when` ranges in "
        f"{ctx.from_prepared.build.spec_file.name}, then:",
        f"{prefix}lock {ctx.new_build}",
        "```",
        "",
    ]
    ctx.files[report] = "\n".join(lines).encode()
    if carried is not None and carried.full_diff:
        ctx.files[full] = carried.full_diff
    return report
