"""``sparkbuild bump``: a build for a new upstream release, with its patch set carried over.

:func:`plan_bump` picks the ``--from`` build and the ``--to`` release, prepares both
sources, takes one decision per PR and patch (:mod:`decide`, which writes a conflict report
through :mod:`report` where an item cannot be carried), and edits the spec text
(:mod:`write`).

Nothing is written here: :func:`plan_bump` returns the new spec text and files, and the
planned build is checked by running the source stage on a scratch copy of the project.
:func:`write.write_plan` writes them.
"""

from __future__ import annotations

import difflib
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from sparkbuild import git, source
from sparkbuild.bump import specedit
from sparkbuild.bump.decide import BumpContext, Decision, decide
from sparkbuild.bump.write import edit_spec, swap_version
from sparkbuild.errors import SparkbuildError, UsageError
from sparkbuild.settings import Settings
from sparkbuild.source.mirror import Mirror
from sparkbuild.spec import Build, ImageConfig, lapsed_note, load_builds


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


# -- planning ----------------------------------------------------------------------------


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
    ctx = BumpContext(
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
    decisions = [decide(ctx, index, spec_counts) for index in range(len(ctx.to_prepared.items))]
    after = edit_spec(data, old, ctx, decisions)
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
        old.image, base_image=swap_version(old.image.base_image, old.version, to)
    )
    return replace(
        old,
        name=name,
        ref=tag,
        version=to,
        image=image,
        description=swap_version(old.description, old.version, to),
    )


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
