"""Build specs (``builds/<engine>.yaml``): what goes into each image.

A spec file declares one engine's upstream repository, file-level defaults and the builds.
:func:`load_builds` turns all spec files into :class:`Build` values, the plain data the
source and image stages consume.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from packaging.requirements import InvalidRequirement
from packaging.requirements import Requirement as PEP508Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from sparkbuild import fileio, validate
from sparkbuild.adapters import EngineName, adapter_type
from sparkbuild.errors import SpecError, UsageError
from sparkbuild.settings import Settings
from sparkbuild.yamlfile import load_model

Engine = EngineName  # a registered engine (adapters/)
Mode = Literal["overlay", "source"]
DEFAULT_PLATFORM = "linux/arm64"
DEFAULT_TAGS = ["sparkbuild/{engine}:{version}-sm121-{tree_short}"]


def _check_when(value: str | None) -> str | None:
    if value is None:
        return None
    try:
        SpecifierSet(value)
    except InvalidSpecifier as exc:
        raise ValueError(f"'{value}' is not a version range such as '>=0.5.12,<0.5.17'") from exc
    return value


# Hostile input must never reach git as an option or a transport, nor leave the project.
RepoURL = Annotated[str, AfterValidator(validate.repo_url)]
GitRef = Annotated[str, AfterValidator(validate.git_ref)]
BuildName = Annotated[str, AfterValidator(validate.build_name)]
TreePath = Annotated[str, AfterValidator(validate.tree_path)]
CMakeName = Annotated[str, AfterValidator(validate.identifier)]
# The source steps sparkbuild knows (source/steps.py): an edit made by its shape, not a diff.
StepName = Literal["sm121a-prune"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class PRFields(BaseModel):
    """A PR as the spec names it and the lock records it: its number and the version range
    it applies to. The spec's :class:`PR` adds a note; the lock's ``LockedPR`` adds what the
    source stage resolved (status, head, commits, diff)."""

    number: int = Field(gt=0, strict=True)  # `true` is not PR #1, nor "103" PR #103
    when: str | None = None

    def digest_payload(self) -> list[object]:
        """What :meth:`Build.spec_digest` covers of a PR (every locked digest depends on it)."""
        return [self.number, self.when]


class PR(_Strict, PRFields):
    """One PR to cherry-pick (``prs:``), as validated from the spec."""

    note: str | None = None

    _when = field_validator("when")(_check_when)

    @property
    def id(self) -> str:
        return f"#{self.number}"


class PatchModel(_Strict):
    file: str
    when: str | None = None
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    note: str | None = None

    _when = field_validator("when")(_check_when)

    @field_validator("file")
    @classmethod
    def _inside_project(cls, value: str, info: ValidationInfo) -> str:
        project = (info.context or {}).get("project_dir")
        if project is not None:
            validate.inside(Path(project), value, "patch file")
        return value


def _check_requirement(value: str) -> str:
    try:
        PEP508Requirement(value)
    except InvalidRequirement as exc:
        raise ValueError(
            f"'{value}' is not a PEP 508 requirement such as 'transformers==5.8.1'"
        ) from exc
    return value


class RequirementModel(_Strict):
    """An extra Python package for the image, installed from a wheel pinned in images.lock."""

    req: str
    when: str | None = None
    # The release pins the same package differently; true says that replacing its pin is
    # intended (otherwise `patches`/`lock` report the conflict and stop).
    override: bool = False
    # Only for builds of this mode: a source build installs the engine --no-deps over its
    # base, so it pins what the release's wheels would have brought (FlashInfer).
    mode: Mode | None = None
    note: str | None = None

    _req = field_validator("req")(_check_requirement)
    _when = field_validator("when")(_check_when)


class StepModel(_Strict):
    """A source step: a named edit sparkbuild makes to one upstream file, found by the shape
    of what it changes (docs/image.md). Like a patch, it has a `when` range, one entry per
    form of the file; unlike one, it says what it expects to find, and fails naming it."""

    step: StepName
    file: TreePath  # in the upstream tree
    when: str | None = None
    mode: Mode | None = None  # only for builds of this mode (None: every mode)
    # What sm121a-prune must find and change (None: sgl-kernel's names; see source/steps.py).
    flags_var: CMakeName | None = None
    remove_targets: list[CMakeName] | None = None
    remove_includes: list[CMakeName] | None = None
    note: str | None = None

    _when = field_validator("when")(_check_when)


class ImageFields(_Strict):
    """Image-stage settings: file-level defaults, overridable per build."""

    mode: Mode | None = None
    base_image: str | None = None
    platform: str | None = None
    tags: list[str] | None = None
    build_args: dict[str, str] | None = None
    dockerfile: str | None = None
    install_dir: str | None = None
    # The base image's Python (X.Y): requirement wheels are resolved for it.
    python: str | None = Field(default=None, pattern=r"^3\.\d+$")

    @field_validator("dockerfile")
    @classmethod
    def _dockerfile_inside_project(cls, value: str | None, info: ValidationInfo) -> str | None:
        project = (info.context or {}).get("project_dir")
        if value is not None and project is not None:
            validate.inside(Path(project), value, "dockerfile")
        return value


class BuildModel(ImageFields):
    ref: GitRef
    version: str | None = None
    description: str | None = None
    prs: list[PR] = []
    patches: list[PatchModel] = []
    smoke: list[str] = []
    requirements: list[RequirementModel] = []
    steps: list[StepModel] = []

    @field_validator("version")
    @classmethod
    def _version(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                Version(value)
            except InvalidVersion as exc:
                raise ValueError(f"'{value}' is not a PEP 440 version") from exc
        return value


class SpecModel(ImageFields):
    engine: Engine
    repo: RepoURL
    base_branch: GitRef = "main"
    #: The engine's package inside the tree (``python/sglang``); None: the whole tree (an
    #: engine that is no Python package, built from source only).
    package_dir: Annotated[str, AfterValidator(validate.package_dir)] | None = None
    prs: list[PR] = []
    patches: list[PatchModel] = []
    requirements: list[RequirementModel] = []
    steps: list[StepModel] = []
    builds: dict[BuildName, BuildModel]

    @model_validator(mode="after")
    def _has_builds(self) -> SpecModel:
        if not self.builds:
            raise ValueError("a spec needs at least one entry under 'builds'")
        if self.package_dir is None:
            overlays = [n for n, b in self.builds.items() if (b.mode or self.mode) != "source"]
            if overlays:
                raise ValueError(
                    f"package_dir is needed for overlay builds ({', '.join(overlays)}): an "
                    "overlay image copies the changed files of the engine's package over the "
                    "release; give package_dir, or set mode: source"
                )
        return self


@dataclass(frozen=True)
class Patch:
    file: str  # as written in the spec, relative to the project
    path: Path  # resolved
    when: str | None = None
    sha256: str | None = None

    @property
    def id(self) -> str:
        return self.file


@dataclass(frozen=True)
class Requirement:
    req: str  # a PEP 508 line, as written in the spec
    when: str | None = None
    override: bool = False
    mode: Mode | None = None  # None: every mode

    @property
    def name(self) -> str:
        """The normalized project name (PEP 503)."""
        return canonicalize_name(PEP508Requirement(self.req).name)

    def parsed(self) -> PEP508Requirement:
        return PEP508Requirement(self.req)


@dataclass(frozen=True)
class Step:
    step: str
    file: str  # in the upstream tree
    when: str | None = None
    mode: Mode | None = None  # None: every mode
    flags_var: str | None = None
    remove_targets: tuple[str, ...] | None = None
    remove_includes: tuple[str, ...] | None = None

    @property
    def id(self) -> str:
        return f"{self.step}:{self.file}"

    def to_data(self) -> dict[str, object]:
        """What the spec says, for the spec digest (unset expectations left out)."""
        data: dict[str, object] = {"step": self.step, "file": self.file, "when": self.when}
        for key in ("mode", "flags_var", "remove_targets", "remove_includes"):
            value = getattr(self, key)
            if value is not None:
                data[key] = list(value) if isinstance(value, tuple) else value
        return data


DEFAULT_PYTHON = "3.12"


@dataclass(frozen=True)
class ImageConfig:
    mode: Mode = "overlay"
    base_image: str | None = None
    platform: str = DEFAULT_PLATFORM
    tags: tuple[str, ...] = tuple(DEFAULT_TAGS)
    build_args: tuple[tuple[str, str], ...] = ()
    dockerfile: str | None = None
    install_dir: str | None = None
    python: str = DEFAULT_PYTHON


@dataclass(frozen=True)
class Build:
    """One image to build, with file-level defaults merged in and the repo override applied."""

    name: str
    engine: Engine
    repo: str  # what this run fetches from (the override, if any)
    spec_repo: str  # what the spec says; recorded in the lock
    base_branch: str
    package_dir: str  # "" when the spec names none: the whole tree
    ref: str
    version: Version
    prs: tuple[PR, ...]
    patches: tuple[Patch, ...]
    image: ImageConfig
    smoke_profiles: tuple[str, ...]
    spec_file: Path
    description: str | None = None
    extra: dict[str, object] = field(default_factory=dict)
    requirements: tuple[Requirement, ...] = ()
    steps: tuple[Step, ...] = ()

    def in_range(self, when: str | None) -> bool:
        return when is None or SpecifierSet(when).contains(self.version, prereleases=True)

    def mode_requirements(self) -> tuple[Requirement, ...]:
        """The requirements for this build's mode, whatever their `when`."""
        return tuple(r for r in self.requirements if r.mode in (None, self.image.mode))

    def active_requirements(self) -> tuple[Requirement, ...]:
        """The requirements for this build's mode whose `when` admits its version (build's
        own last)."""
        return tuple(r for r in self.mode_requirements() if self.in_range(r.when))

    def mode_steps(self) -> tuple[Step, ...]:
        """The source steps for this build's mode, whatever their `when` (spec order)."""
        return tuple(s for s in self.steps if s.mode in (None, self.image.mode))

    def lapsed_requirements(self) -> list[str]:
        """Packages pinned for this build's mode explicitly (``mode: source``) at other
        versions, whose ranges all end before this one: after a bump past the last range
        (FlashInfer after 0.5.23), or a package the release no longer requires (the caller
        tells them apart with the release's own requirements)."""
        explicit = [r for r in self.mode_requirements() if r.mode is not None]
        lapsed = []
        for name in dict.fromkeys(r.name for r in explicit):
            ranges = [r for r in explicit if r.name == name]
            if any(self.in_range(r.when) for r in ranges) or any(r.when is None for r in ranges):
                continue
            above = [r for r in ranges if _ends_before(r.when, self.version)]
            if len(above) == len(ranges):
                lapsed.append(name)
        return lapsed

    def spec_digest(self) -> str:
        """sha256 over everything the spec says about this build and the patch bytes.

        The lock stores it; a different digest means the lock is stale.
        """
        payload: dict[str, Any] = {
            "engine": self.engine,
            "repo": self.spec_repo,
            "base_branch": self.base_branch,
            "package_dir": self.package_dir,
            "ref": self.ref,
            "version": str(self.version),
            "prs": [pr.digest_payload() for pr in self.prs],
            "patches": [[p.file, p.when, file_sha256(p.path)] for p in self.patches],
            "image": {
                "mode": self.image.mode,
                "base_image": self.image.base_image,
                "platform": self.image.platform,
                "tags": list(self.image.tags),
                "build_args": [list(pair) for pair in self.image.build_args],
                "dockerfile": self.image.dockerfile,
                "install_dir": self.image.install_dir,
            },
        }
        # Only when used (and a mode only when set), so older lock entries stay current.
        if self.mode_requirements():
            payload["requirements"] = [
                [r.req, r.when, r.override, *([r.mode] if r.mode else [])]
                for r in self.mode_requirements()
            ]
            payload["image"]["python"] = self.image.python
        if self.mode_steps():
            payload["steps"] = [step.to_data() for step in self.mode_steps()]
        text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
        return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def lapsed_note(build: Build, name: str) -> str:
    """What to say of a pin whose `when` ranges all end before ``build``'s version."""
    return (
        f"{build.name}: no {name} pin for {build.version} (every `when` of its "
        f"`requirements:` ends before it), so this {build.image.mode} build keeps the base "
        f'image\'s {name}; add `{{req: "{name}==X", when: ">={build.version}", mode: '
        f"{build.image.mode}}}` with {build.version}'s own pin (its wheel METADATA)"
    )


def _ends_before(when: str | None, version: Version) -> bool:
    """Whether the range ``when`` lies wholly below ``version`` (it has an upper bound that
    ``version`` passes)."""
    uppers = [s for s in SpecifierSet(when or "") if s.operator in ("<", "<=", "==", "~=")]
    return (
        bool(uppers)
        and not SpecifierSet(when or "").contains(version, prereleases=True)
        and all(Version(s.version.rstrip(".*")) <= version for s in uppers)
    )


def file_sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(fileio.read_bytes(path)).hexdigest()
    except OSError:  # missing, a directory, a FIFO, unreadable: the source stage says which
        return None


_VERSION_IN_REF = re.compile(r"(\d+(?:\.\d+)+(?:(?:a|b|rc|\.post|\.dev)\d+)?)")


def version_of_ref(engine: str, ref: str) -> Version | None:
    """The version ``ref`` names: a release tag as the engine writes them (its adapter's
    ``release_tags``), else a dotted version inside it (``release/v0.5.12``)."""
    return adapter_type(engine).release_tags.version_of(ref) or version_from_ref(ref)


def version_from_ref(ref: str) -> Version | None:
    match = _VERSION_IN_REF.search(ref)
    if not match:
        return None
    try:
        return Version(match.group(1))
    except InvalidVersion:
        return None


def _merge_image(defaults: ImageFields, build: BuildModel) -> ImageConfig:
    def pick(name: str) -> Any:
        value = getattr(build, name)
        return value if value is not None else getattr(defaults, name)

    tags = pick("tags")
    build_args = pick("build_args") or {}
    return ImageConfig(
        mode=pick("mode") or "overlay",
        base_image=pick("base_image"),
        platform=pick("platform") or DEFAULT_PLATFORM,
        tags=tuple(tags) if tags else tuple(DEFAULT_TAGS),
        build_args=tuple(sorted(build_args.items())),
        dockerfile=pick("dockerfile"),
        install_dir=pick("install_dir"),
        python=pick("python") or DEFAULT_PYTHON,
    )


def _builds_of(path: Path, spec: SpecModel, settings: Settings) -> list[Build]:
    builds = []
    repo = settings.repo_overrides.get(spec.engine, spec.repo)
    for name, entry in spec.builds.items():
        version = (
            Version(entry.version) if entry.version else version_of_ref(spec.engine, entry.ref)
        )
        if version is None:
            raise SpecError(
                f"{path}: builds.{name}.version: cannot parse a version from ref '{entry.ref}'",
                f"add `version: \"X.Y.Z\"` to build '{name}'",
            )
        patches = tuple(
            Patch(
                file=p.file,
                path=validate.inside(settings.project_dir, p.file, "patch file"),
                when=p.when,
                sha256=p.sha256,
            )
            for p in (*spec.patches, *entry.patches)
        )
        prs = (*spec.prs, *entry.prs)
        requirements = tuple(
            Requirement(req=r.req, when=r.when, override=r.override, mode=r.mode)
            for r in (*spec.requirements, *entry.requirements)
        )
        steps = tuple(
            Step(
                step=s.step,
                file=s.file,
                when=s.when,
                mode=s.mode,
                flags_var=s.flags_var,
                remove_targets=tuple(s.remove_targets) if s.remove_targets is not None else None,
                remove_includes=(
                    tuple(s.remove_includes) if s.remove_includes is not None else None
                ),
            )
            for s in (*spec.steps, *entry.steps)
        )
        builds.append(
            Build(
                name=name,
                engine=spec.engine,
                repo=repo,
                spec_repo=spec.repo,
                base_branch=spec.base_branch,
                package_dir=(spec.package_dir or "").strip("/"),
                ref=entry.ref,
                version=version,
                prs=prs,
                patches=patches,
                image=_merge_image(spec, entry),
                smoke_profiles=tuple(entry.smoke),
                spec_file=path,
                description=entry.description,
                requirements=requirements,
                steps=steps,
            )
        )
    return builds


def load_spec_file(path: Path, settings: Settings) -> list[Build]:
    context = {"project_dir": settings.project_dir}
    return _builds_of(path, load_model(path, SpecModel, context), settings)


def spec_files(settings: Settings) -> list[Path]:
    return sorted(settings.builds_dir.glob("*.yaml")) + sorted(settings.builds_dir.glob("*.yml"))


def load_builds(settings: Settings) -> dict[str, Build]:
    """Every build in every spec file, by name; duplicate names across files are an error."""
    files = spec_files(settings)
    if not files:
        raise UsageError(
            f"no build specs in {settings.builds_dir}",
            "run sparkbuild from the project directory or pass --project DIR",
        )
    builds: dict[str, Build] = {}
    for path in files:
        for build in load_spec_file(path, settings):
            if build.name in builds:
                other = builds[build.name].spec_file
                raise SpecError(f"{path}: build '{build.name}' is also defined in {other}")
            builds[build.name] = build
    return builds


def select(builds: dict[str, Build], names: list[str] | tuple[str, ...]) -> list[Build]:
    """The named builds (all when none are named); unknown names list the known ones."""
    if not names:
        return list(builds.values())
    unknown = [name for name in names if name not in builds]
    if unknown:
        known = ", ".join(sorted(builds)) or "(none)"
        raise UsageError(
            f"unknown build {', '.join(repr(n) for n in unknown)}; known builds: {known}"
        )
    return [builds[name] for name in names]
