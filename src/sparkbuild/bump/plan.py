"""``sparkbuild bump``: a build for a new upstream release, with its patch set carried over.

The source stage settles every PR and patch of the ``--from`` build twice, on its own
release and on the new one; each item then gets one decision:

- ``keep``: it applies to the new release;
- ``upstream``: the new release has it (or the old one already had it): dropped, and a
  spec-level item's ``when`` ends before the new version; the absorbing commit is named;
- ``follow-range``: its ``when`` ends before the new version; said, not changed;
- ``regenerated``: it no longer applies, was carried forward (see :mod:`carry`) and a new
  variant ``patches/<engine>/<name>-<version>.patch`` takes over from the new version (a
  change that moved to another file is named, and its header marked, after that file);
- ``conflict``: it could not be carried; a report says why and how to finish by hand, and
  the new build keeps the item, so the source stage refuses it until someone does.

Nothing is written here: :func:`plan_bump` returns the new spec text and files, and the
planned build is checked by running the source stage on a scratch copy of the project.
"""

from __future__ import annotations

import difflib
import re
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from packaging.specifiers import Specifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from sparkbuild import git, source
from sparkbuild.bump import specedit
from sparkbuild.bump.carry import Carried, carry_forward
from sparkbuild.errors import AnchorDriftError, SparkbuildError, UsageError
from sparkbuild.settings import Settings
from sparkbuild.source.mirror import Mirror
from sparkbuild.source.patching import ScratchIndex
from sparkbuild.source.steps import prune
from sparkbuild.spec import Build, ImageConfig, lapsed_note, load_builds

Action = Literal[
    "keep", "upstream", "follow-range", "out-of-range", "regenerated", "conflict", "missing"
]
CARRIED: frozenset[str] = frozenset({"keep", "regenerated", "conflict", "missing"})
_MAX_TAGS_SEARCHED = 30


@dataclass(frozen=True)
class Decision:
    """What bump does with one PR, patch or source step of the ``--from`` build."""

    kind: Literal["pr", "patch", "step"]
    id: str
    scope: Literal["spec", "build"]  # a file-level item or one of the build's own
    index: int  # position in that scope's `prs` or `patches` list
    status_from: str
    status_to: str
    action: Action
    detail: str
    when: str | None = None
    new_when: str | None = None  # the existing entry's `when` after the bump, if changed
    variant_file: str | None = None
    variant_when: str | None = None
    strategy: str | None = None
    report_file: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()}


@dataclass
class BumpPlan:
    engine: str
    from_build: Build
    to_version: Version
    tag: str
    new_build: str
    decisions: list[Decision]
    spec_file: Path
    spec_before: str
    spec_after: str
    files: dict[str, bytes] = field(default_factory=dict)  # project-relative path -> bytes
    notes: list[str] = field(default_factory=list)
    regressions: list[str] = field(default_factory=list)  # newer builds this bump breaks
    verified: source.PreparedSource | None = None

    @property
    def ready(self) -> bool:
        planned_ok = not any(d.action in ("conflict", "missing") for d in self.decisions)
        return (
            planned_ok and not self.regressions and self.verified is not None and self.verified.ok
        )

    def spec_diff(self) -> str:
        name = str(self.spec_file.name)
        lines = difflib.unified_diff(
            self.spec_before.splitlines(keepends=True),
            self.spec_after.splitlines(keepends=True),
            f"a/builds/{name}",
            f"b/builds/{name}",
        )
        return "".join(lines)

    def counts(self) -> dict[str, int]:
        counted: dict[str, int] = {}
        for decision in self.decisions:
            counted[decision.action] = counted.get(decision.action, 0) + 1
        return counted

    def to_json(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "from": self.from_build.name,
            "from_version": str(self.from_build.version),
            "to": str(self.to_version),
            "ref": self.tag,
            "build": self.new_build,
            "ready": self.ready,
            "regressions": list(self.regressions),
            "counts": self.counts(),
            "items": [d.to_json() for d in self.decisions],
            "notes": list(self.notes),
            "spec_file": str(self.spec_file),
            "spec_diff": self.spec_diff(),
            "files": {path: data.decode(errors="replace") for path, data in self.files.items()},
            "verified": self.verified.to_json() if self.verified else None,
        }


# -- inputs ------------------------------------------------------------------------------


def parse_version(text: str) -> Version:
    try:
        return Version(text.strip().removeprefix("v"))
    except InvalidVersion as exc:
        raise UsageError(
            f"--to {text!r} is not a version", "give a release such as --to v0.5.13"
        ) from exc


def pick_from(builds: dict[str, Build], engine: str, name: str | None) -> Build:
    if name is not None:
        if name not in builds:
            known = ", ".join(sorted(b for b in builds if builds[b].engine == engine))
            raise UsageError(
                f"--from: unknown build {name!r}; {engine} builds: {known or '(none)'}"
            )
        if builds[name].engine != engine:
            raise UsageError(f"--from {name} is a {builds[name].engine} build, not {engine}")
        return builds[name]
    mine = [b for b in builds.values() if b.engine == engine]
    if not mine:
        raise UsageError(
            f"no {engine} build in any spec", f"add one to builds/{engine}.yaml, then bump it"
        )
    return max(mine, key=lambda b: b.version)


def require_clean(settings: Settings, path: Path) -> None:
    """A bump rewrites the spec; uncommitted edits would be mixed into it, so refuse."""
    inside = subprocess.run(
        ["git", "-C", str(settings.project_dir), "rev-parse", "--is-inside-work-tree"],
        capture_output=True,
        text=True,
        check=False,
    )
    if inside.returncode != 0 or inside.stdout.strip() != "true":
        return  # not a git checkout: nothing to compare with
    status = git.text(["status", "--porcelain", "--", str(path)], cwd=settings.project_dir)
    if status:
        raise UsageError(
            f"{path}: has uncommitted changes ({status.split()[0]})",
            f"commit or stash them first (`git diff -- {path.name}` shows them), then bump again",
        )


def release_tags(mirror: Mirror) -> dict[Version, str]:
    """Upstream tags that name a version, by version (``v0.5.13`` -> 0.5.13)."""
    with mirror.locked():
        remote = mirror.ls_remote(["refs/tags/*"])
    tags: dict[Version, str] = {}
    for ref in remote.refs:
        if ref.endswith("^{}"):
            continue
        name = ref.removeprefix("refs/tags/")
        try:
            version = Version(name.removeprefix("v"))
        except InvalidVersion:
            continue
        if version not in tags or name.startswith("v"):
            tags[version] = name
    return tags


def _new_name(build: Build, to: Version) -> str:
    old = str(build.version)
    if old in build.name:
        return build.name.replace(old, str(to))
    return f"{build.name}-{to}"


def _swap_version(value: str | None, old: Version, new: Version) -> str | None:
    return value.replace(str(old), str(new)) if value else value


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


@dataclass
class _Context:
    settings: Settings
    mirror: Mirror
    from_prepared: source.PreparedSource
    to_prepared: source.PreparedSource
    tags: dict[Version, str]
    tag: str
    to: Version
    new_build: str
    files: dict[str, bytes] = field(default_factory=dict)


def plan_bump(settings: Settings, engine: str, to_text: str, from_name: str | None) -> BumpPlan:
    builds = load_builds(settings)
    old = pick_from(builds, engine, from_name)
    to = parse_version(to_text)
    if to <= old.version:
        word = "older than" if to < old.version else "the same as"
        raise UsageError(
            f"--to {to} is {word} --from {old.name} ({old.version})",
            f"`sparkbuild releases {engine}` lists newer releases",
        )
    require_clean(settings, old.spec_file)
    mirror = Mirror(settings.cache_dir, old.repo)
    tags = release_tags(mirror)
    if to not in tags:
        newer = sorted(v for v in tags if v > old.version)
        listing = ", ".join(str(v) for v in newer[-8:]) or "none"
        raise UsageError(
            f"no release {to} at {old.repo} (no tag v{to}); releases after {old.version}: "
            f"{listing}",
            f"`sparkbuild releases {engine}` lists them",
        )
    name = _new_name(old, to)
    if name in builds:
        raise UsageError(
            f"build {name!r} already exists in {builds[name].spec_file.name}",
            f"bump from it instead: --from {name}",
        )
    new = _new_build(old, name, tags[to], to)
    ctx = _Context(
        settings=settings,
        mirror=mirror,
        from_prepared=source.prepare_source(old, settings),
        to_prepared=source.prepare_source(new, settings),
        tags=tags,
        tag=tags[to],
        to=to,
        new_build=name,
    )
    text = old.spec_file.read_text(encoding="utf-8")
    data = specedit.load(text, old.spec_file)
    spec_counts = {
        "pr": len(data.get("prs") or []),
        "patch": len(data.get("patches") or []),
        "step": len(data.get("steps") or []),
    }
    decisions = [_decide(ctx, index, spec_counts) for index in range(len(ctx.to_prepared.items))]
    after = _edit_spec(data, old, ctx, decisions)
    plan = BumpPlan(
        engine=engine,
        from_build=old,
        to_version=to,
        tag=ctx.tag,
        new_build=name,
        decisions=decisions,
        spec_file=old.spec_file,
        spec_before=text,
        spec_after=after,
        files=ctx.files,
    )
    plan.verified = _verify(settings, plan)
    _note_verification(plan)
    return plan


def _new_build(old: Build, name: str, tag: str, to: Version) -> Build:
    image: ImageConfig = replace(
        old.image, base_image=_swap_version(old.image.base_image, old.version, to)
    )
    return replace(
        old,
        name=name,
        ref=tag,
        version=to,
        image=image,
        description=_swap_version(old.description, old.version, to),
    )


def _decide(ctx: _Context, position: int, spec_counts: dict[str, int]) -> Decision:
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


def _would_apply(ctx: _Context, item: source.ItemResult) -> str:
    """Whether a patch left behind by its range would still apply: worth a look if so."""
    path = ctx.settings.project_dir / item.file if item.file else None
    if path is None or not path.is_file():
        return ""
    with ScratchIndex(ctx.mirror.path, ctx.to_prepared.base_commit) as index:
        if index.applies(path.read_bytes()).ok:
            return " (it would still apply: widen `when` if it is still needed)"
    return f" (it no longer applies to {ctx.tag} either)"


def _step_would_apply(ctx: _Context, item: source.ItemResult) -> str:
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


def _upstream(ctx: _Context, decision: Decision, detail: str) -> Decision:
    new_when = end_before(decision.when, ctx.to) if decision.scope == "spec" else None
    return replace(decision, action="upstream", detail=detail, new_when=new_when)


def _absorbed_detail(ctx: _Context, item: source.ItemResult) -> str:
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


def _last_fit(ctx: _Context, item: source.ItemResult) -> tuple[str, str] | None:
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


def _carry(ctx: _Context, decision: Decision, item: source.ItemResult) -> Decision:
    fit = _last_fit(ctx, item)
    if fit is None:
        report = _write_report(ctx, item, None, None)
        detail = f"{item.detail}; it applies to no release up to {ctx.from_prepared.build.ref}"
        return replace(decision, action="conflict", detail=detail, report_file=report)
    base_commit, base_ref = fit
    carried = carry_forward(ctx.mirror.path, item.diff, base_commit, ctx.to_prepared.base_commit)
    if carried.ok and carried.upstream:
        detail = f"merging it onto {ctx.tag} changes nothing: upstream has it"
        return _upstream(ctx, decision, detail)
    if not carried.ok or item.kind == "pr":
        report = _write_report(ctx, item, carried, base_ref)
        why = "; ".join(carried.attempts) if not carried.ok else "a PR is not rewritten"
        return replace(decision, action="conflict", detail=why, report_file=report)
    moved = _moved_paths(item.diff, carried.diff)
    variant = _variant_path(ctx, item, moved)
    variant_when = start_at(decision.when, ctx.to)
    header = _carried_header(item, variant_when, base_ref, carried.strategy or "", ctx.to, moved)
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


_VERSION_SUFFIX = re.compile(r"-v?\d+(?:\.\d+)+(?:\.post\d+)?$")


# The file a diff patches, from git's header or (in a plain unified diff) the "+++" line.
_DIFF_PATH = re.compile(rb"^(?:diff --git a/\S+ b/|\+\+\+ b/)(\S+)", re.M)


@dataclass(frozen=True)
class _Moved:
    """The upstream files a carried change left (``old``) and now patches (``new``)."""

    old: tuple[str, ...]
    new: tuple[str, ...]


def _moved_paths(old_diff: bytes, new_diff: bytes) -> _Moved | None:
    """Where the change went, when carrying it took it to other files (moved code, a rename);
    None when it patches the same files as before."""
    before = [m.decode(errors="replace") for m in _DIFF_PATH.findall(old_diff)]
    after = [m.decode(errors="replace") for m in _DIFF_PATH.findall(new_diff)]
    left = tuple(p for p in dict.fromkeys(before) if p not in after)
    arrived = tuple(p for p in dict.fromkeys(after) if p not in before)
    return _Moved(left, arrived) if left and arrived else None


def _variant_path(ctx: _Context, item: source.ItemResult, moved: _Moved | None = None) -> str:
    old = Path(item.file or "patch.patch")
    stem = _stem(item)
    if moved is not None and len(moved.old) == len(moved.new) == 1:
        stem = _renamed_stem(stem, moved.old[0], moved.new[0])
    engine = ctx.from_prepared.build.engine
    folder = old.parent.as_posix() if old.parent.as_posix() != "." else f"patches/{engine}"
    return f"{folder}/{stem}-{ctx.to}.patch"


def _file_slug(path: str) -> str:
    """How patch names spell a file: ``tokenizer_manager.py`` -> ``tokenizer-manager``."""
    return Path(path).stem.replace("_", "-").lower()


def _renamed_stem(stem: str, old_path: str, new_path: str) -> str:
    """``stem`` with the old file's name swapped for the new one's
    (``reserved-tokens-none-tokenizer-manager`` -> ``reserved-tokens-none-utils``); a name
    that does not spell its file keeps its name (the header still says where it went)."""
    old = re.escape(_file_slug(old_path))
    found = list(re.finditer(rf"(?<![a-z0-9]){old}(?![a-z0-9])", stem))
    if not found:
        return stem
    last = found[-1]
    return stem[: last.start()] + _file_slug(new_path) + stem[last.end() :]


def _stem(item: source.ItemResult) -> str:
    if item.kind == "pr":
        return f"pr-{item.number}"
    return _VERSION_SUFFIX.sub("", Path(item.file or "patch").stem)


def _carried_header(
    item: source.ItemResult,
    when: str | None,
    base_ref: str,
    strategy: str,
    to: Version,
    moved: _Moved | None = None,
) -> bytes:
    """The old patch's header with a line saying how it was carried, and the new ``when``.

    When the change now patches other files, a second line says so: the copied description
    was written for the old ones, and bump does not rewrite prose.
    """
    text = item.diff.decode("utf-8", errors="replace")
    cut = text.find("diff --git ")
    header = text[:cut] if cut > 0 else ""
    line = (
        f"Regenerated by `sparkbuild bump` for {to} from {item.file} (last applied to "
        f"{base_ref}) by {strategy}; review it before trusting it."
    )
    if moved is not None:
        line += (
            f"\nNow patches {', '.join(moved.new)}: carried by sparkbuild bump from {item.file} "
            f"({', '.join(moved.old)}); re-read the description above."
        )
    when_line = f'when: "{when}"' if when else ""
    if re.search(r"^when:.*$", header, re.M):
        header = re.sub(r"^when:.*$", lambda _: f"{line}\n{when_line}", header, count=1, flags=re.M)
    else:
        header = header.rstrip("\n") + ("\n" if header else "") + f"{line}\n{when_line}\n\n"
    return header.encode()


def _write_report(
    ctx: _Context,
    item: source.ItemResult,
    carried: Carried | None,
    base_ref: str | None,
) -> str:
    stem = (
        f"pr-{item.number}"
        if item.kind == "pr"
        else _VERSION_SUFFIX.sub("", Path(item.file or "x").stem)
    )
    engine = ctx.from_prepared.build.engine
    folder = f"patches/{engine}/conflicts/{ctx.new_build}"
    report = f"{folder}/{stem}.md"
    full = f"{folder}/{stem}.full.diff"
    project = ctx.settings.project_dir
    target = _variant_path(ctx, item) if item.kind == "patch" else f"{folder}/{stem}.patch"
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


# -- the spec ----------------------------------------------------------------------------


def _edit_spec(data: Any, old: Build, ctx: _Context, decisions: list[Decision]) -> str:
    builds = data["builds"]
    entry = specedit.copy_build(builds[old.name])
    entry["ref"] = ctx.tag
    if "version" in entry:
        entry["version"] = str(ctx.to)
    for key in ("description", "base_image"):
        if isinstance(entry.get(key), str):
            entry[key] = _swap_version(entry[key], old.version, ctx.to)
    list_key = {"pr": "prs", "patch": "patches", "step": "steps"}
    # Build-level items: rebuilt from the decisions, in order.
    for kind, key in list_key.items():
        mine = [d for d in decisions if d.kind == kind and d.scope == "build"]
        if not mine:
            continue
        source_list = list(entry.get(key) or [])
        kept = specedit.item_list(entry, key)
        kept.clear()
        for decision in mine:
            original = source_list[decision.index]
            if decision.action == "upstream":
                continue
            if decision.action == "regenerated":
                kept.append(
                    specedit.flow_map(file=decision.variant_file, when=decision.variant_when)
                )
            else:
                kept.append(original)
    # File-level items: `when` ranges cut or split; variants inserted after the old entry.
    for kind, key in list_key.items():
        mine = [d for d in decisions if d.kind == kind and d.scope == "spec"]
        for decision in sorted(mine, key=lambda d: d.index, reverse=True):
            items = specedit.item_list(data, key)
            if decision.action in ("upstream", "regenerated"):
                specedit.set_when(items[decision.index], decision.new_when)
            if decision.action == "regenerated":
                variant = specedit.flow_map(file=decision.variant_file, when=decision.variant_when)
                items.insert(decision.index + 1, variant)
    builds[ctx.new_build] = entry
    comment = "\n"  # a blank line between builds, as the author spaced them
    not_ready = [d for d in decisions if d.action in ("conflict", "missing")]
    if not_ready:
        names = ", ".join(d.id for d in not_ready)
        comment += f"NOT READY: {names} do(es) not apply to {ctx.tag}; see the conflict report(s)"
    builds.yaml_set_comment_before_after_key(ctx.new_build, before=comment, indent=2)
    return specedit.dump(data)


# -- checking the plan -------------------------------------------------------------------


def _verify(settings: Settings, plan: BumpPlan) -> source.PreparedSource | None:
    """The source stage on a scratch copy of the project with the planned spec and files."""
    with tempfile.TemporaryDirectory(prefix="sparkbuild-bump-") as tmp:
        scratch = Path(tmp)
        for folder in ("builds", "patches"):
            if (settings.project_dir / folder).is_dir():
                shutil.copytree(settings.project_dir / folder, scratch / folder)
        relative = plan.spec_file.resolve().relative_to(settings.project_dir.resolve())
        (scratch / relative).write_text(plan.spec_after, encoding="utf-8")
        for path, data in plan.files.items():
            (scratch / path).parent.mkdir(parents=True, exist_ok=True)
            (scratch / path).write_bytes(data)
        check = replace(settings, project_dir=scratch)
        try:
            planned = load_builds(check)
        except SparkbuildError as exc:
            plan.notes.append(f"the planned spec does not load: {exc.message}")
            return None
        _check_newer_builds(settings, plan, planned, check)
        return source.prepare_source(planned[plan.new_build], check)


def _check_newer_builds(
    settings: Settings, plan: BumpPlan, planned: dict[str, Build], check: Settings
) -> None:
    """File-level `when` edits reach builds newer than --to too: none may break."""
    for build in planned.values():
        if build.engine != plan.engine or build.version <= plan.to_version:
            continue
        if build.name == plan.new_build or source.prepare_source(build, check).ok:
            continue
        current = load_builds(settings).get(build.name)
        if current is not None and source.prepare_source(current, settings).ok:
            plan.regressions.append(build.name)
            plan.notes.append(
                f"{build.name} (newer than {plan.to_version}) would no longer settle with "
                "these `when` edits; bump from it instead, or edit the ranges by hand"
            )


def _note_verification(plan: BumpPlan) -> None:
    if plan.verified is None:
        return
    for item in plan.verified.items:
        if item.status in source.FAILING:
            plan.notes.append(f"{plan.new_build}: {item.id} is {item.status}: {item.detail}")
    pinned_before = {r.name for r in plan.from_build.active_requirements()}
    for name in plan.verified.build.lapsed_requirements():
        if name in pinned_before:  # pinned for --from, for nothing from --to on
            plan.notes.append(lapsed_note(plan.verified.build, name))


# -- writing -----------------------------------------------------------------------------


def write_plan(settings: Settings, plan: BumpPlan) -> None:
    """New files first, the spec last, each by temp file and rename."""
    targets = [(_inside(settings, path), data) for path, data in plan.files.items()]
    targets.append((plan.spec_file, plan.spec_after.encode("utf-8")))
    for path, data in targets:
        try:
            specedit.write_atomic(path, data)
        except OSError as exc:
            raise SparkbuildError(
                f"cannot write {path}: {exc.strerror or exc}",
                f"{plan.spec_file.name} is unchanged unless it was the last file; "
                "fix the cause and run the same bump again",
            ) from exc


def _inside(settings: Settings, relative: str) -> Path:
    """A path the plan writes, refused unless it stays inside the project."""
    project = settings.project_dir.resolve()
    path = (project / relative).resolve()
    if not path.is_relative_to(project):
        raise SparkbuildError(
            f"refusing to write {relative}: it is outside the project {project}",
            "patch files named in the spec must live under the project (patches/ENGINE/)",
        )
    return path


def fresh_builds(settings: Settings) -> set[str]:
    """Builds whose lock entry matches the spec now (offline), to re-pin after the edit."""
    from sparkbuild import lockfile

    lock = lockfile.load(settings.lock_file)
    fresh = set()
    for build in load_builds(settings).values():
        entry = lock.entry(build.name)
        if entry and not source.staleness(build, entry.source):
            fresh.add(build.name)
    return fresh
