"""images.lock: read, checked and written only by sparkbuild; canonical YAML, atomically,
one writer at a time.

The file holds one :class:`BuildEntry` per build; each stage owns one section of it
(``source``, ``image``, ``requirements``, ``preflight``, ``smoke``, ``bench``, ``publish``).
The sections' models are :mod:`sparkbuild.lockschema` (re-exported here, so a stage names
them ``lockfile.SmokeRecord``). Neither module imports a stage: each stage makes its own
records from its own result (``source.record``, ``image.build``, ``preflight.record``,
``smoke.record``, ``bench.record``, ``publish.record``). A command opens a
:class:`LockHandle` once, reads the typed entries from it, queues its changes per build, and
writes them in one go under the file lock: the file is swapped in with a rename, so an
interrupted write leaves the previous lock intact, and a command that fails before it
writes changes nothing.

One schema serves both readers: :func:`load` holds the file to the models (strictly typed,
so a hand-edited ``verified: 1`` is not a ``true``, and a key no sparkbuild wrote is
refused); :func:`check` (``lock --check``) also requires the fields marked ``Written``,
which every lock sparkbuild writes has. A lock read and written again is byte-identical.
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import ValidationError

from sparkbuild import fileio, yamlfile
from sparkbuild.errors import BadYAMLError, ImageMismatchError, LockError, NoPinnedImageError
from sparkbuild.lockschema import (
    SCHEMA,
    WHEEL_FILENAME,
    BenchCell,
    BenchRecord,
    BuildEntry,
    BuildName,
    CompileBoot,
    CompileRecord,
    Digest,
    EvidenceRecord,
    ImageId,
    ImageSection,
    LockedPatch,
    LockedPR,
    LockedStep,
    LockedWheel,
    LockFile,
    NodeRecord,
    Number,
    PreflightRun,
    ProfileVerdict,
    Publication,
    PublishRecord,
    Repository,
    Section,
    Sha,
    Sha256,
    SignedRecord,
    SmokeRecord,
    SourceSection,
    Tag,
    Topology,
    WheelFile,
    Written,
    empty,
    missing_fields,
)
from sparkbuild.redact import redact

HEADER = "# images.lock: written by sparkbuild (`sparkbuild lock`), do not edit by hand.\n"
#: The largest lock sparkbuild reads or writes. Reading one costs about 40 times its size in
#: memory (the YAML node tree, then the models), and the report renders every record. At
#: this size `report`, `patches`, `lock --check` and `verify` take 10-18 s of CPU and at most
#: 0.7 GB on a 2-core host, well within 3 minutes and 2 GB (benchmarks/bench_large_lock.py);
#: a 60 MB lock took 2.2 GB to parse alone. A lock of 50 builds is about 1 MiB.
LOCK_LIMIT = 16 * fileio.MIB

# --- reading -------------------------------------------------------------------------------


def _repair_hint(path: Path) -> str:
    return (
        f"restore it with `git checkout -- {path.name}`, or move it aside "
        f"(`mv {path} {path}.bad`) and run `sparkbuild lock` to pin the sources again"
    )


def too_large(path: Path, size: int, doing: str) -> LockError:
    """A lock over :data:`LOCK_LIMIT`, refused before it is read (or written), naming both."""
    return LockError(
        f"{path}: {doing} {fileio.describe_size(size)}, more than the "
        f"{fileio.describe_size(LOCK_LIMIT)} sparkbuild reads or writes for a lock (a lock of "
        "50 builds is about 1 MiB)",
        "a lock grows by every image's smoke and bench records: see what made it grow "
        f"(`git log -p -- {path.name}`), then {_repair_hint(path)}",
    )


def _read(path: Path) -> tuple[Any, Any]:
    """The parsed YAML and its node tree; (None, None) when the file does not exist yet."""
    try:
        raw = fileio.read_bytes(path, limit=LOCK_LIMIT)  # a FIFO or device is refused, not read
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        if exc.errno == errno.EFBIG:
            raise too_large(path, _size(path), "is") from exc
        raise LockError(f"{path}: cannot read: {fileio.reason(exc)}", _repair_hint(path)) from exc
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
    return load_with_tree(path)[0]


def load_with_tree(path: Path) -> tuple[LockFile, yaml.Node | None]:
    """The typed lock and the YAML node tree it was read from (None: no file, or empty), for
    a reader of each record's lines (the report's dates) that would otherwise parse it again."""
    data, node = _read(path)
    return _validate(path, data, node), node


def read_entry(path: Path, build: str) -> BuildEntry:
    """``build``'s entry (an empty one when the lock has none), for a command that only reads."""
    return load(path).entry(build) or BuildEntry()


def schema_problems(path: Path) -> list[str]:
    """What is wrong with the lock at ``path`` (empty when it is a complete, valid lock)."""
    return check(path)[1]


def check(path: Path) -> tuple[LockFile | None, list[str]]:
    """The lock at ``path`` (None when it does not load) and what is wrong with it.

    The loader's checks come first (UTF-8, no aliases, the schema every command reads, with
    file and line); then what a lock sparkbuild wrote always has: ``schema:``, no other
    top-level keys, and the :data:`Written` fields of each section."""
    try:
        data, node = _read(path)
        lock = _validate(path, data, node)
    except LockError as exc:
        return None, [exc.message]
    if not isinstance(data, dict):
        return lock, [f"{path.name}: not a mapping with `schema:` and `builds:`"]
    if "schema" not in data:
        return lock, [f"{path.name}: no `schema:` field (sparkbuild writes `schema: {SCHEMA}`)"]
    problems = [
        f"`{key}`: Extra inputs are not permitted"
        for key in data
        if key not in ("schema", "builds")
    ]
    if "builds" not in data:
        problems.append("`builds`: Field required")
    problems += missing_fields(lock.builds, ("builds",))
    return lock, [f"{path.name}: {problem}" for problem in problems]


# --- writing -------------------------------------------------------------------------------


def dumps(lock: LockFile) -> str:
    """Canonical text: sorted keys, block style, no timestamps added here."""
    header = HEADER.removeprefix("# ").rstrip("\n")
    text = yamlfile.dump_yaml(lock.to_json(), comment=[header], sort_keys=True, width=80)
    return redact(text)  # every record: an address's userinfo or token never lands


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return LOCK_LIMIT + 1  # it grew past the limit while read, then went away


def write_atomic(path: Path, text: str) -> None:
    """Write beside the target, fsync, then rename over it: readers never see half a file.
    A full or read-only disk, or a lock over :data:`LOCK_LIMIT` (no command could read it
    back), is a LockError, and leaves the file as it was."""
    size = len(text.encode("utf-8"))
    if size > LOCK_LIMIT:
        raise too_large(path, size, "is unchanged: writing it would make it")
    try:
        _write_atomic(path, text)
    except OSError as exc:
        raise _unwritable(path, f"cannot write {path}", exc) from exc


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fileio.write_atomic(path, text)  # keeps the lock's mode; a symlink there is replaced


def _unwritable(path: Path, what: str, exc: OSError) -> LockError:
    return LockError(
        f"{what}: {fileio.reason(exc)}; {path.name} is unchanged",
        f"free space on the disk that holds {path.parent}, or make it writable, then run the "
        "command again",
    )


@contextmanager
def _writer(path: Path) -> Iterator[None]:
    """Writers of ``path`` one at a time, across processes: an exclusive flock on the
    directory that holds it. Not a ``path.lock`` file beside it, which every project would
    have to ignore in git; not the lock file itself, which is replaced by rename. A lock that
    cannot be taken (a missing or unreadable directory, a file in its place) is a LockError,
    not a traceback."""
    what = f"cannot take the writer lock on {path.parent}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise _unwritable(path, what, exc) from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:
            raise _unwritable(path, what, exc) from exc
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the flock


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

    def set_section(self, build: str, section: Section) -> None:
        """Queue replacing one stage's section of ``build``'s entry."""
        self.change(build, lambda entry: _place(entry, section))

    def write(self) -> LockFile:
        """Apply the queued changes under the file lock and write the file once."""
        queued, self._changes = self._changes, {}  # tried once: a failure drops them
        if not queued:
            return self.lock
        with _writer(self.path):
            current = self.lock if _stamp(self.path) == self._stamp else load(self.path)
            changed = current.model_copy(deep=True)
            for build, changes in queued.items():
                entry = changed.builds.get(build) or BuildEntry()
                for change in changes:
                    change(entry)
                changed.builds[build] = BuildEntry.model_validate(entry.to_json())
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


def set_section(path: Path, build: str, section: Section) -> LockFile:
    """Replace one stage's section of one build's entry."""
    handle = LockHandle.open(path)
    handle.set_section(build, section)
    return handle.write()


def _place(entry: BuildEntry, section: Section) -> None:
    if isinstance(section, SourceSection):
        entry.source = section
    elif isinstance(section, ImageSection):
        entry.image = section
    else:
        entry.requirements = section


# --- the pinned image, for the stages that record verdicts about it or publish it ----------

Purpose = Literal["record", "publish"]
_NO_IMAGE = {  # purpose -> (message, hint)
    "record": (
        "build {build!r} has no image in {lock}; nothing to record the result for",
        "build it first: sparkbuild build {build}",
    ),
    "publish": (
        "{build}: {lock} pins no image for it; nothing to publish",
        "`sparkbuild build {build}`, then smoke it with "
        "`sparkbuild smoke --image IMAGE --profile P --record {build}`",
    ),
}


def pinned_image(
    entry: BuildEntry | None, build: str, lock_path: Path, purpose: Purpose = "record"
) -> ImageSection:
    """``builds.<build>.image`` of ``entry``, or an error saying how to get one. Publishing
    also needs its tree (the destination's tags are rendered from it)."""
    image = entry.image if entry else None
    if image is None or not image.image_id or (purpose == "publish" and not image.tree):
        message, hint = _NO_IMAGE[purpose]
        raise NoPinnedImageError(
            message.format(build=build, lock=lock_path.name), hint.format(build=build)
        )
    return image


def pinned_image_id(path: Path, build: str) -> str:
    """``builds.<build>.image.image_id`` or an error saying how to get one."""
    return str(pinned_image(load(path).entry(build), build, path).image_id)


def _check_tested(
    image_id: str, build: str, path: Path, tested_id: str | None, activity: str
) -> str:
    if tested_id and tested_id != image_id:
        raise ImageMismatchError(
            f"the image under test ({tested_id}) is not build {build!r}'s image in "
            f"{path.name} ({image_id})",
            f"run the {activity} on the pinned image (see `builds.{build}.image` in {path.name})",
        )
    return image_id


def check_pinned_image(path: Path, build: str, tested_id: str | None, activity: str) -> str:
    """The pinned image id, after making sure it is the image under test (when known)."""
    return _check_tested(pinned_image_id(path, build), build, path, tested_id, activity)


def digest_image_id(path: Path, build: str, digest: str) -> str:
    """The pinned image id of ``build`` when the lock records ``digest`` (a manifest digest,
    as Kubernetes runs an image) as that image's: its ``repo_digest`` or a publication of
    it; else an error naming both."""
    entry = load(path).entry(build)
    image = pinned_image(entry, build, path)
    known = {image.repo_digest.rpartition("@")[2]} if image.repo_digest else set()
    for record in (entry.publish or {}).values() if entry else ():
        pairs = [(record.digest, record.image_id)]
        pairs += [(p.digest, p.image_id) for p in record.history]
        known |= {str(d) for d, i in pairs if d and i == image.image_id}
    if digest not in known:
        recorded = ", ".join(sorted(known)) or "no digest"
        raise ImageMismatchError(
            f"the image under test ({digest}) is not build {build!r}'s image in {path.name} "
            f"({image.image_id}; {recorded})",
            f"run it on the digest {path.name} records for {build} (`sparkbuild publish "
            f"{build}` pushes the image and records it)",
        )
    return str(image.image_id)


def nodes_as(nodes: list[NodeRecord], digest: str, image_id: str) -> list[NodeRecord]:
    """A Kubernetes run's nodes, each pod that ran ``digest`` (checked at both ends of the
    run) under the image id the lock pins for it (:func:`digest_image_id`)."""
    return [
        n.model_copy(update={"image_id": image_id}) if n.image_id == digest else n for n in nodes
    ]


_Record = TypeVar("_Record", SmokeRecord, BenchRecord)


def _keyed(
    records: dict[str, dict[str, _Record]] | None, image_id: str, key: str, record: _Record
) -> dict[str, dict[str, _Record]]:
    records = records or {}
    records.setdefault(image_id, {})[key] = record
    return records


def record_for_image(
    path: Path,
    build: str,
    key: str,
    record: SmokeRecord | BenchRecord,
    *,
    tested_id: str | None,
    activity: str,
) -> str:
    """Store ``record`` at ``builds.<build>.<smoke|bench>.<image_id>.<key>`` for the pinned
    image; other images' entries stay. Used by the smoke and bench stages."""
    handle = LockHandle.open(path)
    pinned = str(pinned_image(handle.entry(build), build, path).image_id)
    image_id = _check_tested(pinned, build, path, tested_id, activity)

    def change(entry: BuildEntry) -> None:
        current = entry.image.image_id if entry.image else None
        if current != image_id:  # re-checked under the writer lock: a build may have landed
            raise ImageMismatchError(
                f"build {build!r}'s image changed in {path.name} during the {activity}",
                f"re-run the {activity} against the new image of {build}",
            )
        if isinstance(record, SmokeRecord):
            entry.smoke = _keyed(entry.smoke, image_id, key, record)
        else:
            entry.bench = _keyed(entry.bench, image_id, key, record)

    handle.change(build, change)
    handle.write()
    return image_id


__all__ = [
    "HEADER",
    "SCHEMA",
    "WHEEL_FILENAME",
    "BenchCell",
    "BenchRecord",
    "BuildEntry",
    "BuildName",
    "Change",
    "CompileBoot",
    "CompileRecord",
    "Digest",
    "EvidenceRecord",
    "ImageId",
    "ImageSection",
    "LockFile",
    "LockHandle",
    "LockedPR",
    "LockedPatch",
    "LockedStep",
    "LockedWheel",
    "NodeRecord",
    "Number",
    "PreflightRun",
    "ProfileVerdict",
    "Publication",
    "PublishRecord",
    "Purpose",
    "Repository",
    "Section",
    "Sha",
    "Sha256",
    "SignedRecord",
    "SmokeRecord",
    "SourceSection",
    "Tag",
    "Topology",
    "WheelFile",
    "Written",
    "check",
    "check_pinned_image",
    "digest_image_id",
    "dumps",
    "empty",
    "load",
    "load_with_tree",
    "missing_fields",
    "nodes_as",
    "pinned_image",
    "pinned_image_id",
    "read_entry",
    "record_for_image",
    "schema_problems",
    "set_section",
    "update_entry",
    "write_atomic",
]
