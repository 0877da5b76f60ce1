"""The source stage's entry point: resolve, fetch and patch one build."""

from __future__ import annotations

from sparkbuild import console
from sparkbuild.lockfile import LockFile
from sparkbuild.settings import Settings
from sparkbuild.source import lockproof
from sparkbuild.source.apply import (
    Applier,
    changed_files,
    note_moved_head,
    note_overlay_scope,
    settle_patch,
    settle_pr,
)
from sparkbuild.source.items import FAILING, PreparedSource
from sparkbuild.source.mirror import Mirror
from sparkbuild.source.pins import Pins, locked_heads, require_locked_source
from sparkbuild.source.record import source_section
from sparkbuild.source.resolve import fetch_for, resolve_base
from sparkbuild.source.steps import settle_step
from sparkbuild.spec import Build


def prepare_source(
    build: Build,
    settings: Settings,
    *,
    locked: bool = False,
    offline: bool = False,
    lock: LockFile | None = None,
) -> PreparedSource:
    """Resolve, fetch and patch one build. With ``locked``, use only what the lock pins and
    prove it: the pinned commit is what ``ref`` resolves to, the patched tree is the locked
    one, and every other recorded field is what the spec and the mirror give now.
    ``offline`` (with ``locked``) uses the mirror as it is, fetching nothing. ``lock`` is the
    lock the command already read (else it is read here, once)."""
    pins = Pins()
    section = require_locked_source(build, settings, lock) if locked else None
    if section is not None:
        lockproof.check_spec_fields(build, section)  # before any fetch: the spec alone
        pins = Pins.from_lock(section)
    noted = {} if locked else locked_heads(build, settings, lock)
    mirror = Mirror(settings.cache_dir, build.repo, offline=offline and locked)
    in_range = [pr for pr in build.prs if build.in_range(pr.when)]
    with mirror.locked():
        if offline and locked:
            remote = mirror.local_refs()
        else:
            remote = fetch_for(mirror, build, in_range, pins)
        base_commit = resolve_base(mirror, build, remote, pins)
        if locked:
            lockproof.check_ref(mirror, build, base_commit)
    applier = Applier(mirror, build, base_commit)
    try:
        steps = build.mode_steps()
        with console.status(
            f"{build.name}: applying {len(build.prs)} PR(s), {len(build.patches)} patch(es)"
            + (f", {len(steps)} step(s)" if steps else "")
        ):
            items = [settle_pr(applier, pr, remote, pins) for pr in build.prs]
            items += [settle_patch(applier, patch) for patch in build.patches]
            items += [settle_step(applier, step) for step in steps]
    finally:
        applier.close()
    if locked and not any(item.status in FAILING for item in items):
        lockproof.check_tree(build, pins.tree, applier.tree)
    items = [note_moved_head(item, noted, build) for item in items]
    items = [note_overlay_scope(build, item) for item in items]
    prepared = PreparedSource(
        build=build,
        base_commit=base_commit,
        tree=applier.tree,
        head_commit=applier.commit,
        items=tuple(items),
        changed=changed_files(mirror, base_commit, applier.tree),
        mirror=mirror.path,
        conflict_commit=applier.conflict_commit,
    )
    if section is not None:
        lockproof.check_fields(build, section, source_section(prepared))
    return prepared
