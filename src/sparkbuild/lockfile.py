"""images.lock: typed, canonical YAML, written only by sparkbuild, atomically, one writer at a time.

The file holds one :class:`BuildEntry` per build; each stage owns one section of it
(``source``, ``image``, ``requirements``, ``preflight``, ``smoke``, ``bench``, ``publish``).
A command opens a :class:`LockHandle` once, reads the typed entries from it, queues its
changes per build, and writes them in one go under the file lock: the file is swapped in
with a rename, so an interrupted write leaves the previous lock intact, and a command that
fails before it writes changes nothing.

One schema serves both readers: :func:`load` holds the file to the models below (strictly
typed, so a hand-edited ``verified: 1`` is not a ``true``); :func:`schema_problems` (``lock
--check``) adds what a lock sparkbuild wrote always has (the fields marked ``_COMPLETE``).
Each stage may keep keys of its own (``extra="allow"``), and a lock read and written again
is byte-identical.
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar

import yaml
from filelock import FileLock
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from sparkbuild import validate, yamlfile
from sparkbuild.errors import BadYAMLError, LockError, SparkbuildError

SCHEMA = 1
HEADER = "# images.lock: written by sparkbuild (`sparkbuild lock`), do not edit by hand.\n"

Sha = Annotated[str, Field(pattern=r"^[0-9a-f]{40}([0-9a-f]{24})?$")]  # SHA-1 or SHA-256
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
Digest = Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{64}$")]
# Image ids go to docker, never to git or a shell; a plain token is enough.
ImageId = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9:._@/-]*$")]
BuildName = Annotated[str, AfterValidator(validate.build_name)]
_IMAGE_DIGEST = r"^sha256:[0-9a-f]{64}$"


class _Section(BaseModel):
    """A part of the lock: strictly typed where sparkbuild reads it, open to extra keys."""

    model_config = ConfigDict(extra="allow", strict=True)
    # Fields a lock sparkbuild wrote always has (checked by `lock --check`), and the
    # patterns they must match there.
    _COMPLETE: ClassVar[tuple[str, ...]] = ()
    _COMPLETE_PATTERNS: ClassVar[dict[str, str]] = {}

    def to_data(self) -> dict[str, Any]:
        """The plain mapping: exactly the keys that were read or set, nothing defaulted."""
        return self.model_dump(mode="python", by_alias=True, exclude_unset=True)

    def unset(self, name: str) -> None:
        """Drop field ``name`` from what is written, as if it had never been set."""
        setattr(self, name, type(self).model_fields[name].get_default())
        self.__pydantic_fields_set__.discard(name)


# --- source: what `lock` resolved ---------------------------------------------------------


class LockedPR(_Section):
    _COMPLETE = ("status",)
    number: int = Field(gt=0)
    when: str | None = None
    status: str | None = None
    head: Sha | None = None
    commits: list[Sha] = []
    diff_sha256: Sha256 | None = None


class LockedPatch(_Section):
    _COMPLETE = ("status",)
    file: str
    when: str | None = None
    status: str | None = None
    sha256: Sha256 | None = None


class LockedStep(_Section):
    """A source step (``steps:``): which edit, on which file, and what it did."""

    _COMPLETE = ("status",)
    step: str
    file: str
    when: str | None = None
    status: str | None = None
    version: int | None = None  # of the step's code (source.gencodes.VERSION)


class SourceSection(_Section):
    _COMPLETE = ("engine", "repo", "ref", "commit", "version", "spec_digest", "tree")
    engine: str | None = None
    repo: str | None = None
    ref: str | None = None
    commit: Sha | None = None
    version: str | None = None
    spec_digest: Digest | None = None
    tree: Sha | None = None
    prs: list[LockedPR] = []
    patches: list[LockedPatch] = []
    steps: list[LockedStep] = []

    def pr_heads(self) -> dict[int, str]:
        return {pr.number: pr.head for pr in self.prs if pr.head}


# --- image: what `build` built -------------------------------------------------------------


class ImageSection(_Section):
    _COMPLETE = ("image_id",)
    _COMPLETE_PATTERNS = {"image_id": _IMAGE_DIGEST}
    mode: str | None = None
    base_image: str | None = None
    base_digest: str | None = None
    platform: str | None = None
    tree: Sha | None = None
    inputs_digest: str | None = None
    image_id: ImageId | None = None
    repo_digest: str | None = None
    tags: list[str] = []
    cuda_code: dict[str, Any] | None = None  # source mode: what the built cubins target


class LockedWheel(_Section):
    """One wheel an image installs (``requirements:``)."""

    requirement: str
    name: str
    version: str
    filename: str
    sha256: str


# --- verdicts: preflight, smoke, bench, keyed by what they were run on ---------------------


class ProfileVerdict(_Section):
    verdict: str | None = None


class PreflightRun(_Section):
    """``preflight.<tree>+<deps>``: one run's verdicts (per profile)."""

    where: str | None = None
    image_id: str | None = None
    profiles: dict[str, ProfileVerdict] = {}


class SmokeRecord(_Section):
    """``smoke.<image_id>.<profile>``: one smoke verdict and how it was obtained."""

    verdict: str | None = None
    verified: bool | None = None
    image_id: str | None = None
    target: str | None = None


class BenchRecord(_Section):
    """``bench.<image_id>.<profile>``: the summary of one benchmark run."""

    label: str | None = None
    created: str | None = None


# --- publish: where the image went -------------------------------------------------------


class Publication(_Section):
    """One digest in a repository's ``history``."""

    digest: str | None = None
    image_id: str | None = None
    tag: str | None = None
    verified: bool | None = None
    smoke: dict[str, str] = {}
    rolled_back: bool | None = None


class PublishRecord(_Section):
    """``publish.<repository>``: what the repository's tags point at now, and before."""

    tag: str | None = None
    digest: str | None = None
    image_id: str | None = None
    verified: bool | None = None
    aliases: list[str] = []
    history: list[Publication] = []

    def published(self) -> list[Publication]:
        return [h for h in self.history if h.digest]


class BuildEntry(_Section):
    source: SourceSection | None = None
    image: ImageSection | None = None
    requirements: list[LockedWheel] | None = None
    preflight: dict[str, PreflightRun] | None = None
    smoke: dict[str, dict[str, SmokeRecord]] | None = None
    bench: dict[str, dict[str, BenchRecord]] | None = None
    publish: dict[str, PublishRecord] | None = None


class LockFile(_Section):
    schema_: int = Field(default=SCHEMA, alias="schema")
    builds: dict[BuildName, BuildEntry] = {}

    def entry(self, build: str) -> BuildEntry | None:
        return self.builds.get(build)

    def to_data(self) -> dict[str, Any]:
        return {**super().to_data(), "schema": SCHEMA, "builds": {
            name: entry.to_data() for name, entry in self.builds.items()
        }}  # fmt: skip


def empty() -> LockFile:
    return LockFile()


# --- reading -------------------------------------------------------------------------------


def _repair_hint(path: Path) -> str:
    return (
        f"restore it with `git checkout -- {path.name}`, or move it aside "
        f"(`mv {path} {path}.bad`) and run `sparkbuild lock` to pin the sources again"
    )


def _read(path: Path) -> tuple[Any, Any]:
    """The parsed YAML and its node tree; (None, None) when the file does not exist yet."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        raise LockError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    try:
        return yamlfile.parse_yaml(raw)
    except BadYAMLError as exc:
        where = f"{path}:{exc.line}" if exc.line else str(path)
        raise LockError(f"{where}: {exc.problem}", _repair_hint(path)) from exc


def _validate(path: Path, data: Any, node: Any) -> LockFile:
    if data is None:
        return empty()
    if not isinstance(data, dict) or not isinstance(data.get("builds", {}), dict):
        raise LockError(f"{path}: not a sparkbuild lock (no 'builds' mapping)", _repair_hint(path))
    if data.get("schema", SCHEMA) != SCHEMA:
        raise LockError(
            f"{path}: `schema: {data.get('schema')!r}` is not {SCHEMA}, the one this sparkbuild "
            "reads",
            "use the sparkbuild that wrote it, or re-lock with `sparkbuild lock`",
        )
    try:
        return LockFile.model_validate(data)
    except ValidationError as exc:
        lines: dict[yamlfile.Location, int] = {}
        if node is not None:
            yamlfile.node_lines(node, (), lines)
        problems = [yamlfile.describe_error(e, LockFile, path, lines) for e in exc.errors()]
        shown = "\n  ".join(problems[:10])
        raise LockError(f"{path} is damaged:\n  {shown}", _repair_hint(path)) from exc


def load(path: Path) -> LockFile:
    """The typed lock; an empty one when the file does not exist yet.

    Anything else than a lock of this schema (not UTF-8, not YAML, aliases, a wrong shape) is
    a LockError naming the file, the line and the repair.
    """
    return _validate(path, *_read(path))


def read_entry(path: Path, build: str) -> BuildEntry:
    """``build``'s entry (an empty one when the lock has none), for a command that only reads."""
    return load(path).entry(build) or BuildEntry()


def _missing(model: BaseModel, loc: tuple[str | int, ...]) -> Iterator[str]:
    """What a lock sparkbuild wrote would have, and ``model`` (at ``loc``) lacks."""
    if isinstance(model, _Section):
        for name in model._COMPLETE:
            where = ".".join(str(p) for p in (*loc, name))
            value = getattr(model, name)
            pattern = model._COMPLETE_PATTERNS.get(name)
            if name not in model.model_fields_set:
                yield f"`{where}`: Field required"
            elif value is None:
                yield f"`{where}`: Input should be a valid string"
            elif pattern and not re.match(pattern, str(value)):
                yield f"`{where}`: String should match pattern '{pattern}'"
    for name in type(model).model_fields:  # in declaration order, so the report is stable
        if name in model.model_fields_set:
            yield from _missing_in(getattr(model, name), (*loc, _alias(model, name)))


def _missing_in(value: Any, loc: tuple[str | int, ...]) -> Iterator[str]:
    if isinstance(value, BaseModel):
        yield from _missing(value, loc)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _missing_in(item, (*loc, index))
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _missing_in(item, (*loc, key))


def _alias(model: BaseModel, name: str) -> str:
    info = type(model).model_fields.get(name)
    return (info.alias if info else None) or name


def schema_problems(path: Path) -> list[str]:
    """What is wrong with the lock at ``path`` (empty when it is a complete, valid lock)."""
    return check(path)[1]


def check(path: Path) -> tuple[LockFile | None, list[str]]:
    """The lock at ``path`` (None when it does not load) and what is wrong with it.

    The loader's checks come first (UTF-8, no aliases, the schema every command reads, with
    file and line); then what a lock sparkbuild wrote always has: ``schema:``, no other
    top-level keys, and the ``_COMPLETE`` fields of each section."""
    try:
        data, node = _read(path)
        lock = _validate(path, data, node)
    except LockError as exc:
        return None, [exc.message]
    if not isinstance(data, dict):
        return lock, [f"{path.name}: not a mapping with `schema:` and `builds:`"]
    if "schema" not in data:
        return lock, [f"{path.name}: no `schema:` field (sparkbuild writes `schema: {SCHEMA}`)"]
    problems = [f"`{key}`: Extra inputs are not permitted" for key in data if key not in
                ("schema", "builds")]  # fmt: skip
    if "builds" not in data:
        problems.append("`builds`: Field required")
    problems += _missing_in(lock.builds, ("builds",))
    return lock, [f"{path.name}: {problem}" for problem in problems]


# --- writing -------------------------------------------------------------------------------


class _CanonicalDumper(yaml.SafeDumper):
    """Never writes anchors or aliases: the lock is read back with aliases refused."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dumps(lock: LockFile) -> str:
    """Canonical text: sorted keys, block style, no timestamps added here."""
    body = yaml.dump(
        lock.to_data(),
        Dumper=_CanonicalDumper,
        sort_keys=True,
        default_flow_style=False,
        allow_unicode=True,
    )
    return HEADER + body


def write_atomic(path: Path, text: str) -> None:
    """Write beside the target, fsync, then rename over it: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:  # mkstemp makes 0600 files; the lock is a shared, committed file
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        mode = 0o644
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def file_lock(path: Path) -> FileLock:
    return FileLock(str(path) + ".lock")


Change = Callable[[BuildEntry], None]
_Stamp = tuple[int, int, int] | None


def _stamp(path: Path) -> _Stamp:
    try:
        info = path.stat()
    except FileNotFoundError:
        return None
    return (info.st_ino, info.st_size, info.st_mtime_ns)


@dataclass
class LockHandle:
    """One command's images.lock: read once, each build's entry written once.

    Stages read typed entries with :meth:`entry` and queue their changes with :meth:`change`;
    :meth:`write` applies them, holding the file lock, to the lock as it is then (re-read only
    when another command replaced the file meanwhile, so concurrent writers to other sections
    are kept), and writes the file once. A change that raises (say, the image it records for
    moved on) writes nothing; a command that fails before :meth:`write` changes nothing.
    """

    path: Path
    lock: LockFile
    _stamp: _Stamp = None
    _changes: dict[str, list[Change]] = field(default_factory=dict)

    @classmethod
    def open(cls, path: Path) -> LockHandle:
        stamp = _stamp(path)
        return cls(path, load(path), stamp)

    def entry(self, build: str) -> BuildEntry | None:
        return self.lock.entry(build)

    def change(self, build: str, change: Change) -> None:
        self._changes.setdefault(build, []).append(change)

    def set_section(self, build: str, section: str, value: Any) -> None:
        """Queue replacing one stage's section of ``build``'s entry."""

        def replace(entry: BuildEntry) -> None:
            # Validated here, so plain data and models alike are typed in the entry.
            setattr(entry, section, getattr(BuildEntry.model_validate({section: value}), section))

        self.change(build, replace)

    def write(self) -> LockFile:
        """Apply the queued changes under the file lock and write the file once."""
        queued, self._changes = self._changes, {}  # tried once: a failure drops them
        if not queued:
            return self.lock
        with file_lock(self.path):
            current = self.lock if _stamp(self.path) == self._stamp else load(self.path)
            changed = current.model_copy(deep=True)
            for build, changes in queued.items():
                entry = changed.builds.get(build) or BuildEntry()
                for change in changes:
                    change(entry)
                changed.builds[build] = BuildEntry.model_validate(entry.to_data())
            text = dumps(changed)
            if text != dumps(current) or not self.path.exists():
                write_atomic(self.path, text)
            self.lock, self._stamp = changed, _stamp(self.path)
        return changed


def update_entry(path: Path, build: str, change: Change) -> LockFile:
    """Open, change one build's entry and write: for a command that writes only that."""
    handle = LockHandle.open(path)
    handle.change(build, change)
    return handle.write()


def set_section(path: Path, build: str, section: str, value: Any) -> LockFile:
    """Replace one stage's section of one build's entry (a model, or its plain data)."""
    handle = LockHandle.open(path)
    handle.set_section(build, section, value)
    return handle.write()


# --- the pinned image, for the stages that record verdicts about it ------------------------


def pinned_image(entry: BuildEntry | None, build: str, lock_path: Path) -> str:
    """``builds.<build>.image.image_id`` of ``entry``, or an error saying how to get one."""
    image_id = entry.image.image_id if entry and entry.image else None
    if not image_id:
        raise SparkbuildError(
            f"build {build!r} has no image in {lock_path.name}; nothing to record the result for",
            f"build it first: sparkbuild build {build}",
        )
    return image_id


def pinned_image_id(path: Path, build: str) -> str:
    """``builds.<build>.image.image_id`` or an error saying how to get one."""
    return pinned_image(load(path).entry(build), build, path)


def _check_tested(
    image_id: str, build: str, path: Path, tested_id: str | None, activity: str
) -> str:
    if tested_id and tested_id != image_id:
        raise SparkbuildError(
            f"the image under test ({tested_id}) is not build {build!r}'s image in "
            f"{path.name} ({image_id})",
            f"run the {activity} on the pinned image (see `builds.{build}.image` in {path.name})",
        )
    return image_id


def check_pinned_image(path: Path, build: str, tested_id: str | None, activity: str) -> str:
    """The pinned image id, after making sure it is the image under test (when known)."""
    return _check_tested(pinned_image_id(path, build), build, path, tested_id, activity)


def record_for_image(
    path: Path,
    build: str,
    section: str,
    key: str,
    value: Mapping[str, Any],
    *,
    tested_id: str | None,
    activity: str,
) -> str:
    """Store ``value`` at ``builds.<build>.<section>.<image_id>.<key>`` for the pinned image;
    other images' entries stay. Used by the smoke and bench stages."""
    handle = LockHandle.open(path)
    pinned = pinned_image(handle.entry(build), build, path)
    image_id = _check_tested(pinned, build, path, tested_id, activity)

    def change(entry: BuildEntry) -> None:
        current = entry.image.image_id if entry.image else None
        if current != image_id:  # re-checked under the writer lock: a build may have landed
            raise SparkbuildError(
                f"build {build!r}'s image changed in {path.name} during the {activity}",
                f"re-run the {activity} against the new image of {build}",
            )
        typed = getattr(BuildEntry.model_validate({section: {image_id: {key: value}}}), section)
        records = getattr(entry, section) or {}
        records.setdefault(image_id, {})[key] = typed[image_id][key]
        setattr(entry, section, records)

    handle.change(build, change)
    handle.write()
    return image_id
