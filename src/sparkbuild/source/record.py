"""The source stage's section of images.lock (``builds.<build>.source``), made from its own
result: the resolved commit and tree, and one record per PR, patch and source step."""

from __future__ import annotations

from sparkbuild import lockfile
from sparkbuild.redact import strip_userinfo
from sparkbuild.source.items import ItemResult, PreparedSource


def locked_pr(item: ItemResult) -> lockfile.LockedPR:
    if item.kind != "pr" or item.number is None:
        raise TypeError(f"{item.id} is not a PR")
    return lockfile.LockedPR(
        number=item.number,
        when=item.when,
        status=item.status,
        head=item.head,
        commits=list(item.commits),
        diff_sha256=item.diff_sha256,
    )


def locked_patch(item: ItemResult) -> lockfile.LockedPatch:
    if item.kind != "patch" or item.file is None:
        raise TypeError(f"{item.id} is not a patch")
    return lockfile.LockedPatch(
        file=item.file, when=item.when, status=item.status, sha256=item.sha256
    )


def locked_step(item: ItemResult) -> lockfile.LockedStep:
    if item.kind != "step" or item.step is None or item.file is None:
        raise TypeError(f"{item.id} is not a source step")
    return lockfile.LockedStep(
        step=item.step,
        file=item.file,
        when=item.when,
        status=item.status,
        version=item.step_version,
    )


def source_section(prepared: PreparedSource) -> lockfile.SourceSection:
    build = prepared.build
    items = prepared.items
    steps = [locked_step(item) for item in items if item.kind == "step"]
    return lockfile.SourceSection(
        engine=build.engine,
        repo=strip_userinfo(build.spec_repo),  # a token never reaches the lock
        ref=build.ref,
        commit=prepared.base_commit,
        version=str(build.version),
        spec_digest=build.spec_digest(),
        tree=prepared.tree,
        prs=[locked_pr(item) for item in items if item.kind == "pr"],
        patches=[locked_patch(item) for item in items if item.kind == "patch"],
        # Only when the build has steps, so older entries keep their shape.
        **({"steps": steps} if steps else {}),
    )


def record(prepared: PreparedSource, lock: lockfile.LockHandle) -> None:
    """Queue ``builds.<build>.source`` in ``lock`` (written with the build's entry)."""
    lock.set_section(prepared.build.name, source_section(prepared))
