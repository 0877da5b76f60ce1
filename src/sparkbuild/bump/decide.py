"""What ``sparkbuild bump`` does with each PR, patch and source step of the ``--from`` build.

The source stage settles every item twice, on the ``--from`` release and on the new one;
each item then gets one decision:

- ``keep``: it applies to the new release;
- ``upstream``: the new release has it (or the old one already had it): dropped, and a
  spec-level item's ``when`` ends before the new version; the absorbing commit is named;
- ``follow-range``: its ``when`` ends before the new version; said, not changed;
- ``regenerated``: it no longer applies, was carried forward (see :mod:`carry`) and a new
  variant ``patches/<engine>/<name>-<version>.patch`` takes over from the new version (a
  change that moved to another file is named, and its header marked, after that file);
- ``conflict``: it could not be carried; a report says why and how to finish by hand
  (:mod:`report`), and the new build keeps the item, so the source stage refuses it until
  someone does. A source step is not rewritten: one that drifts on the new release is a
  ``conflict`` without a report (its anchor-drift message says what it expected).

Deciding writes nothing: a variant's bytes and a report's text go into
:attr:`BumpContext.files`, which :mod:`write` puts on disk with ``--write``.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Literal

from packaging.specifiers import Specifier, SpecifierSet
from packaging.version import Version

from sparkbuild import git, source
from sparkbuild.bump.carry import carry_forward
from sparkbuild.bump.items import BumpContext, Decision
from sparkbuild.bump.report import write_report
from sparkbuild.bump.write import carried_header, moved_paths, variant_path
from sparkbuild.errors import AnchorDriftError, UsageError
from sparkbuild.source.patching import ScratchIndex
from sparkbuild.source.steps import prune

_MAX_TAGS_SEARCHED = 30


# -- when ranges -------------------------------------------------------------------------


def _specs(when: str | None) -> list[Specifier]:
    return list(SpecifierSet(when or ""))


def _join(specs: list[Specifier]) -> str | None:
    lower = [s for s in specs if s.operator.startswith(">")]
    rest = [s for s in specs if not s.operator.startswith(">")]
    text = ",".join(str(s) for s in [*lower, *rest])
    return text or None


def end_before(when: str | None, to: Version) -> str | None:
    """``when`` cut so that it stops before ``to``."""
    kept = [s for s in _specs(when) if not (s.operator.startswith("<") and Version(s.version) > to)]
    return _join([*kept, Specifier(f"<{to}")])


def start_at(when: str | None, to: Version) -> str | None:
    """The part of ``when`` from ``to`` on (its upper bounds kept)."""
    kept = [s for s in _specs(when) if s.operator.startswith("<") or s.operator == "!="]
    return _join([Specifier(f">={to}"), *kept])


# -- deciding ----------------------------------------------------------------------------


def decide(ctx: BumpContext, position: int, spec_counts: dict[str, int]) -> Decision:
    now = ctx.to_prepared.items[position]
    before = ctx.from_prepared.items[position]
    same_kind = [i for i, item in enumerate(ctx.to_prepared.items) if item.kind == now.kind]
    index = same_kind.index(position)
    scope: Literal["spec", "build"] = "spec" if index < spec_counts[now.kind] else "build"
    decision = Decision(
        kind=now.kind,
        id=now.id,
        scope=scope,
        index=index if scope == "spec" else index - spec_counts[now.kind],
        status_from=before.status,
        status_to=now.status,
        action="keep",
        detail=now.detail,
        when=now.when,
    )
    if now.status == "applied":
        return decision
    if now.status == "out-of-range":
        if before.status in ("applied", "conflict"):
            would = _step_would_apply(ctx, now) if now.kind == "step" else _would_apply(ctx, now)
            detail = f"{now.detail}: not carried to {ctx.to}{would}"
            return replace(decision, action="follow-range", detail=detail)
        return replace(decision, action="out-of-range")
    if now.status not in ("conflict", "upstream"):  # missing, or a status added later
        return replace(decision, action="missing", detail=f"{now.status}: {now.detail}")
    if before.status == "upstream":
        detail = f"already upstream in {ctx.from_prepared.build.ref}: {before.detail}"
        return _upstream(ctx, decision, detail)
    if now.status == "upstream":
        return _upstream(ctx, decision, _absorbed_detail(ctx, now))
    if now.kind == "step":  # an edit by shape: nothing to rewrite, its expectations to check
        detail = (
            f"{now.detail}; a step is not rewritten: check it against {ctx.tag}'s "
            f"{now.file}, then end its `when` before {ctx.to} or change what it expects"
        )
        return replace(decision, action="conflict", detail=detail)
    return _carry(ctx, decision, now)


def _would_apply(ctx: BumpContext, item: source.ItemResult) -> str:
    """Whether a patch left behind by its range would still apply: worth a look if so."""
    path = ctx.settings.project_dir / item.file if item.file else None
    if path is None or not path.is_file():
        return ""
    with ScratchIndex(ctx.mirror.path, ctx.to_prepared.base_commit) as index:
        if index.applies(path.read_bytes()).ok:
            return " (it would still apply: widen `when` if it is still needed)"
    return f" (it no longer applies to {ctx.tag} either)"


def _step_would_apply(ctx: BumpContext, item: source.ItemResult) -> str:
    """Whether a source step left behind by its range would still find its anchors."""
    step = next((s for s in ctx.to_prepared.build.steps if s.id == item.id), None)
    if step is None:
        return ""
    with ScratchIndex(ctx.mirror.path, ctx.to_prepared.base_commit) as index:
        found = index.read(step.file)
    if found is None:
        return f" (no {step.file} in {ctx.tag})"
    try:
        pruned = prune(step, found[1].decode("utf-8", errors="replace"))
    except AnchorDriftError as exc:
        return f" (on {ctx.tag}: {exc.message})"
    if not pruned.changed:
        return f" ({ctx.tag}'s {step.file} needs nothing from it)"
    return " (it would still apply: widen `when` if it is still needed)"


def _upstream(ctx: BumpContext, decision: Decision, detail: str) -> Decision:
    new_when = end_before(decision.when, ctx.to) if decision.scope == "spec" else None
    return replace(decision, action="upstream", detail=detail, new_when=new_when)


def _absorbed_detail(ctx: BumpContext, item: source.ItemResult) -> str:
    """Name the first upstream commit (between the two releases) that has the change."""
    path = ctx.mirror.path
    start, end = ctx.from_prepared.base_commit, ctx.to_prepared.base_commit
    if item.kind == "pr" and item.head and "is in the base" in item.detail:
        return f"{item.detail}; {_merged_by(path, item.head, end)}"
    if item.kind == "pr" or not item.diff:
        return item.detail
    listed = git.run(
        ["rev-list", "--reverse", f"{start}..{end}", "--", *item.files], git_dir=path, check=False
    )
    commits = listed.stdout.decode().split()
    if not commits:
        return item.detail

    def has_it(commit: str) -> bool:
        with ScratchIndex(path, commit) as index:
            return index.reverse_applies(item.diff).ok

    low, high = 0, len(commits) - 1
    while low < high:  # the first commit from which the change is there
        middle = (low + high) // 2
        if has_it(commits[middle]):
            high = middle
        else:
            low = middle + 1
    subject = git.text(["log", "-1", "--format=%h %s", commits[low]], git_dir=path)
    return f"{item.detail}; absorbed by {subject}"


def _merged_by(git_dir: Path, head: str, release: str) -> str:
    """The merge commit that brought a PR head into the release, as "abc123 subject"."""
    merges = git.text(
        ["rev-list", "--ancestry-path", "--merges", "--reverse", f"{head}..{release}"],
        git_dir=git_dir,
    ).split()
    if not merges:
        return "fast-forwarded into the release"
    return "merged by " + git.text(["log", "-1", "--format=%h %s", merges[0]], git_dir=git_dir)


def _last_fit(ctx: BumpContext, item: source.ItemResult) -> tuple[str, str] | None:
    """(commit, ref) of the newest release up to --from where the change applies."""
    if ctx.from_prepared.items and item.diff:
        with ScratchIndex(ctx.mirror.path, ctx.from_prepared.base_commit) as index:
            if index.applies(item.diff).ok:
                return ctx.from_prepared.base_commit, ctx.from_prepared.build.ref
    older = sorted((v for v in ctx.tags if v <= ctx.from_prepared.build.version), reverse=True)
    for version in older[:_MAX_TAGS_SEARCHED]:
        commit = ctx.mirror.rev_parse(ctx.tags[version])
        if commit is None:
            continue
        with ScratchIndex(ctx.mirror.path, commit) as index:
            if index.applies(item.diff).ok:
                return commit, ctx.tags[version]
    return None


def _carry(ctx: BumpContext, decision: Decision, item: source.ItemResult) -> Decision:
    fit = _last_fit(ctx, item)
    if fit is None:
        report = write_report(ctx, item, None, None)
        detail = f"{item.detail}; it applies to no release up to {ctx.from_prepared.build.ref}"
        return replace(decision, action="conflict", detail=detail, report_file=report)
    base_commit, base_ref = fit
    carried = carry_forward(ctx.mirror.path, item.diff, base_commit, ctx.to_prepared.base_commit)
    if carried.ok and carried.upstream:
        detail = f"merging it onto {ctx.tag} changes nothing: upstream has it"
        return _upstream(ctx, decision, detail)
    if not carried.ok or item.kind == "pr":
        report = write_report(ctx, item, carried, base_ref)
        why = "; ".join(carried.attempts) if not carried.ok else "a PR is not rewritten"
        return replace(decision, action="conflict", detail=why, report_file=report)
    moved = moved_paths(item.diff, carried.diff)
    variant = variant_path(ctx, item, moved)
    variant_when = start_at(decision.when, ctx.to)
    header = carried_header(item, variant_when, base_ref, carried.strategy or "", ctx.to, moved)
    content = header + carried.diff
    existing = ctx.settings.project_dir / variant
    if existing.exists() and existing.read_bytes() != content:  # same bytes: a re-run
        raise UsageError(
            f"{variant} already exists; bump writes the {ctx.to} variant of {item.file} there",
            f"remove it, or list it in {ctx.from_prepared.build.spec_file.name} with a `when`",
        )
    ctx.files[variant] = content
    new_when = end_before(decision.when, ctx.to)
    detail = f"regenerated from {item.file} (last applied to {base_ref}) by {carried.strategy}"
    return replace(
        decision,
        action="regenerated",
        detail=detail,
        new_when=new_when,
        variant_file=variant,
        variant_when=variant_when,
        strategy=carried.strategy,
    )
