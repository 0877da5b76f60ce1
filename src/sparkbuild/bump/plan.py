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

import re
import shutil
import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path

from packaging.version import InvalidVersion, Version

from sparkbuild import git, source, validate
from sparkbuild.adapters import ReleaseTags, adapter_type
from sparkbuild.bump import specedit
from sparkbuild.bump.decide import decide
from sparkbuild.bump.items import BumpContext, BumpPlan
from sparkbuild.bump.write import edit_spec, swap_version
from sparkbuild.errors import SparkbuildError, UsageError
from sparkbuild.settings import Settings
from sparkbuild.source.mirror import Mirror
from sparkbuild.spec import Build, ImageConfig, lapsed_note, load_builds

# -- inputs ------------------------------------------------------------------------------


def parse_version(text: str, tags: ReleaseTags | None = None) -> Version:
    """``--to``: a release tag as the engine writes them (``v0.5.13``, ``b6123``) or a
    version."""
    found = tags.version_of(text.strip()) if tags is not None else None
    if found is not None:
        return found
    try:
        return Version(text.strip().removeprefix("v"))
    except InvalidVersion as exc:
        example = tags.tag_of(Version("0.5.13")) if tags is not None else "v0.5.13"
        raise UsageError(
            f"--to {text!r} is not a version", f"give a release such as --to {example}"
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


def release_tags(mirror: Mirror, engine_tags: ReleaseTags) -> dict[Version, str]:
    """Upstream tags that name a version as the engine tags its releases, by version
    (``v0.5.13`` -> 0.5.13; ``b6123`` -> 6123 for a build-numbered engine)."""
    with mirror.locked():
        remote = mirror.ls_remote(["refs/tags/*"])
    tags: dict[Version, str] = {}
    for ref in remote.refs:
        if ref.endswith("^{}"):
            continue
        name = ref.removeprefix("refs/tags/")
        version = engine_tags.version_of(name)
        if version is None:
            continue
        if version not in tags or name == engine_tags.tag_of(version):
            tags[version] = name
    return tags


def _new_name(build: Build, to: Version) -> tuple[str, str | None]:
    """The new build's name, and a note when the release's version had to be normalised to
    make one (a local version ``1.3.0+x`` or an epoch ``1!1.4`` holds characters a build
    name may not)."""
    old = str(build.version)
    wanted = build.name.replace(old, str(to)) if old in build.name else f"{build.name}-{to}"
    name = _NOT_IN_NAME.sub("-", wanted)
    validate.build_name(name)  # the same rule the spec holds it to; a ValueError is a bug
    if name == wanted:
        return name, None
    return name, (
        f"build name {wanted!r} is not a valid build name (letters, digits, '.', '_', '-'); "
        f"named {name!r} instead"
    )


def _spec_ref(tag: str, to: Version) -> str:
    """``tag`` if a spec may hold it as ``ref``, else a usage error saying what to do."""
    try:
        return validate.git_ref(tag)
    except ValueError as exc:
        raise UsageError(
            f"release {to}: its tag {tag!r} cannot be a spec's ref ({exc}); nothing was written",
            f"add the build by hand with `ref:` set to the tag's commit (`git ls-remote REPO "
            f'{tag}`) and `version: "{to}"`',
        ) from None


_NOT_IN_NAME = re.compile(r"[^A-Za-z0-9._-]+")


# -- planning ----------------------------------------------------------------------------


def plan_bump(settings: Settings, engine: str, to_text: str, from_name: str | None) -> BumpPlan:
    builds = load_builds(settings)
    old = pick_from(builds, engine, from_name)
    engine_tags = adapter_type(engine).release_tags
    to = parse_version(to_text, engine_tags)
    if to <= old.version:
        word = "older than" if to < old.version else "the same as"
        raise UsageError(
            f"--to {to} is {word} --from {old.name} ({old.version})",
            f"`sparkbuild releases {engine}` lists newer releases",
        )
    require_clean(settings, old.spec_file)
    mirror = Mirror(settings.cache_dir, old.repo)
    tags = release_tags(mirror, engine_tags)
    if to not in tags:
        newer = sorted(v for v in tags if v > old.version)
        listing = ", ".join(str(v) for v in newer[-8:]) or "none"
        raise UsageError(
            f"no release {to} at {old.repo} (no tag {engine_tags.tag_of(to)}); releases after "
            f"{old.version}: "
            f"{listing}",
            f"`sparkbuild releases {engine}` lists them",
        )
    ref = _spec_ref(tags[to], to)
    name, name_note = _new_name(old, to)
    if name in builds:
        raise UsageError(
            f"build {name!r} already exists in {builds[name].spec_file.name}",
            f"bump from it instead: --from {name}",
        )
    new = _new_build(old, name, ref, to)
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
        notes=[name_note] if name_note else [],
    )
    return _verified(settings, plan)


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


def _verified(settings: Settings, plan: BumpPlan) -> BumpPlan:
    """``plan`` with what the source stage says of it, run on a scratch copy of the project
    with the planned spec and files."""
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
            note = f"the planned spec does not load: {exc.message}"
            return replace(plan, unloadable=exc.message, notes=[*plan.notes, note])
        regressions = _broken_newer_builds(settings, plan, planned, check)
        verified = source.prepare_source(planned[plan.new_build], check)
    notes = [
        *plan.notes,
        *(
            f"{name} (newer than {plan.to_version}) would no longer settle with these `when` "
            "edits; bump from it instead, or edit the ranges by hand"
            for name in regressions
        ),
        *_verification_notes(plan, verified),
    ]
    return replace(plan, verified=verified, regressions=regressions, notes=notes)


def _broken_newer_builds(
    settings: Settings, plan: BumpPlan, planned: dict[str, Build], check: Settings
) -> list[str]:
    """File-level `when` edits reach builds newer than --to too: none may break."""
    broken = []
    for build in planned.values():
        if build.engine != plan.engine or build.version <= plan.to_version:
            continue
        if build.name == plan.new_build or source.prepare_source(build, check).ok:
            continue
        current = load_builds(settings).get(build.name)
        if current is not None and source.prepare_source(current, settings).ok:
            broken.append(build.name)
    return broken


def _verification_notes(plan: BumpPlan, verified: source.PreparedSource) -> list[str]:
    notes = [
        f"{plan.new_build}: {item.id} is {item.status}: {item.detail}"
        for item in verified.items
        if item.status in source.FAILING
    ]
    pinned_before = {r.name for r in plan.from_build.active_requirements()}
    for name in verified.build.lapsed_requirements():
        if name in pinned_before:  # pinned for --from, for nothing from --to on
            notes.append(lapsed_note(verified.build, name))
    return notes
