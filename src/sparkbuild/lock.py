"""images.lock: canonical YAML, written only by sparkbuild, atomically, one writer at a time.

The file holds one entry per build. Each stage owns one key of that entry (``source``,
``image``, ``smoke``, ``bench``, ``publish``) and replaces it through :func:`update`, which
serialises writers with a file lock and swaps the file in with a rename, so an interrupted
write leaves the previous lock intact.
"""

from __future__ import annotations

import copy
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from filelock import FileLock
from pydantic import ValidationError

from sparkbuild import lockschema, yamlfile
from sparkbuild.errors import BadYAMLError, LockError, SparkbuildError

SCHEMA = 1
HEADER = "# images.lock: written by sparkbuild (`sparkbuild lock`), do not edit by hand.\n"

LockData = dict[str, Any]


def empty() -> LockData:
    return {"schema": SCHEMA, "builds": {}}


def _repair_hint(path: Path) -> str:
    return (
        f"restore it with `git checkout -- {path.name}`, or move it aside "
        f"(`mv {path} {path}.bad`) and run `sparkbuild lock` to pin the sources again"
    )


def load(path: Path) -> LockData:
    """The lock as plain data; an empty lock when the file does not exist yet.

    The file is checked against :mod:`sparkbuild.lockschema`; anything else (not UTF-8, not
    YAML, aliases, a wrong shape) is a LockError naming the file, the line and the repair.
    """
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return empty()
    except OSError as exc:
        raise LockError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    try:
        data, node = yamlfile.parse_yaml(raw)
    except BadYAMLError as exc:
        where = f"{path}:{exc.line}" if exc.line else str(path)
        raise LockError(f"{where}: {exc.problem}", _repair_hint(path)) from exc
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
        lockschema.check(data)
    except ValidationError as exc:
        lines: dict[yamlfile.Location, int] = {}
        if node is not None:
            yamlfile.node_lines(node, (), lines)
        problems = [
            yamlfile.describe_error(e, lockschema.LockFile, path, lines) for e in exc.errors()
        ]
        shown = "\n  ".join(problems[:10])
        raise LockError(f"{path} is damaged:\n  {shown}", _repair_hint(path)) from exc
    data.setdefault("builds", {})
    data["schema"] = SCHEMA
    return data


class _CanonicalDumper(yaml.SafeDumper):
    """Never writes anchors or aliases: the lock is read back with aliases refused."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dumps(data: LockData) -> str:
    """Canonical text: sorted keys, block style, no timestamps added here."""
    body = yaml.dump(
        data,
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


def update(path: Path, mutate: Callable[[LockData], None]) -> LockData:
    """Load, let ``mutate`` change a copy, and write it back, holding the writer lock.

    If ``mutate`` raises, nothing is written.
    """
    with file_lock(path):
        current = load(path)
        changed = copy.deepcopy(current)
        mutate(changed)
        if changed != current or not path.exists():
            write_atomic(path, dumps(changed))
        return changed


def build_entry(data: LockData, build: str) -> dict[str, Any] | None:
    entry = data.get("builds", {}).get(build)
    return entry if isinstance(entry, dict) else None


def set_section(path: Path, build: str, section: str, value: Any) -> LockData:
    """Replace one stage's section of one build's entry."""

    def mutate(data: LockData) -> None:
        data["builds"].setdefault(build, {})[section] = value

    return update(path, mutate)


def pinned_image_id(path: Path, build: str) -> str:
    """``builds.<build>.image.image_id`` or an error saying how to get one."""
    entry = build_entry(load(path), build) or {}
    image = entry.get("image")
    image_id = image.get("image_id") if isinstance(image, dict) else None
    if not image_id:
        raise SparkbuildError(
            f"build {build!r} has no image in {path.name}; nothing to record the result for",
            f"build it first: sparkbuild build {build}",
        )
    return str(image_id)


def check_pinned_image(path: Path, build: str, tested_id: str | None, activity: str) -> str:
    """The pinned image id, after making sure it is the image under test (when known)."""
    image_id = pinned_image_id(path, build)
    if tested_id and tested_id != image_id:
        raise SparkbuildError(
            f"the image under test ({tested_id}) is not build {build!r}'s image in "
            f"{path.name} ({image_id})",
            f"run the {activity} on the pinned image (see `builds.{build}.image` in {path.name})",
        )
    return image_id


def record_for_image(
    path: Path,
    build: str,
    section: str,
    key: str,
    value: Any,
    *,
    tested_id: str | None,
    activity: str,
) -> str:
    """Store ``value`` at ``builds.<build>.<section>.<image_id>.<key>`` for the pinned image;
    other images' entries stay. Used by the smoke and bench stages."""
    image_id = check_pinned_image(path, build, tested_id, activity)

    def mutate(data: LockData) -> None:
        entry = data["builds"].get(build)
        current = entry.get("image", {}).get("image_id") if isinstance(entry, dict) else None
        if current != image_id:  # re-checked under the writer lock: a build may have landed
            raise SparkbuildError(
                f"build {build!r}'s image changed in {path.name} during the {activity}",
                f"re-run the {activity} against the new image of {build}",
            )
        stage = entry.setdefault(section, {})
        if not isinstance(stage, dict):
            stage = entry[section] = {}
        stage.setdefault(image_id, {})[key] = value

    update(path, mutate)
    return image_id
