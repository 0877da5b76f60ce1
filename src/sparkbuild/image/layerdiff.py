"""What differs between two canonical images: each differing file named, with how it differs.

Two builds of the same inputs that give two image ids differ somewhere in a layer they added,
or in their config. Each file is compared by what a layer records of it: its bytes (sha256),
whether it is there at all, its link target, mode, owner, extended attributes and time. The
differences come most useful first: content (what a step wrote differently: the time, a random
value, a ``.pyc`` with a timestamp), then files only one build has, then the config, then the
metadata.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from sparkbuild.image.reproducible import Canonical
from sparkbuild.jsontext import JsonObject

# How useful a kind of difference is to whoever reads it: lower first.
RANK = {
    "content": 0,
    "only in the first build": 1,
    "only in the second build": 1,
    "type": 1,
    "link": 2,
    "config": 2,
    "layer": 2,
    "mode": 3,
    "owner": 4,
    "xattrs": 5,
    "time": 6,
}
TIMESTAMP_PYC = (
    "a .pyc whose header holds its source's time: compile with "
    "invalidation_mode=CHECKED_HASH (py_compile and compileall do when SOURCE_DATE_EPOCH is "
    "set, as it is in sparkbuild's builds)"
)


@dataclass(frozen=True)
class Difference:
    what: str  # a key of RANK
    path: str  # the file, or the config key
    first: str
    second: str
    layer: int | None = None  # the layer's index in the image (None for the config)
    step: str = ""  # the Dockerfile step that made the layer
    note: str = ""

    def line(self) -> str:
        where = "config" if self.layer is None else f"layer {self.layer}"
        step = f" ({_short(self.step)})" if self.step else ""
        text = f"{self.path}: {self.what}"
        if self.first or self.second:
            text += f" {self.first or '-'} vs {self.second or '-'}"
        text += f", {where}{step}"
        return f"{text}: {self.note}" if self.note else text

    def to_json(self) -> JsonObject:
        return {
            "what": self.what,
            "path": self.path,
            "first": self.first,
            "second": self.second,
            "layer": self.layer,
            "step": self.step,
            "note": self.note,
        }


def _short(step: str, width: int = 70) -> str:
    step = " ".join(step.split())
    return step if len(step) <= width else step[: width - 1] + "…"


@dataclass(frozen=True)
class Entry:
    kind: str
    mode: str
    owner: str
    mtime: int
    sha256: str
    link: str
    xattrs: str
    pyc_flags: int | None = None


def _entries(path: Path) -> dict[str, Entry]:
    found: dict[str, Entry] = {}
    with tarfile.open(path, mode="r:") as archive:
        for member in archive:
            digest, flags = "", None
            if member.isreg():
                digest, flags = _content(archive, member)
            xattrs = {k: v for k, v in member.pax_headers.items() if "xattr." in k}
            found[member.name.rstrip("/")] = Entry(
                kind=_KINDS.get(member.type, repr(member.type)),
                mode=oct(member.mode & 0o7777),
                owner=f"{member.uid}:{member.gid}",
                mtime=int(member.mtime),
                sha256=digest,
                link=member.linkname,
                xattrs=json.dumps(xattrs, sort_keys=True) if xattrs else "",
                pyc_flags=flags,
            )
    return found


_KINDS = {
    tarfile.REGTYPE: "file",
    tarfile.AREGTYPE: "file",
    tarfile.DIRTYPE: "directory",
    tarfile.SYMTYPE: "symlink",
    tarfile.LNKTYPE: "hard link",
    tarfile.CHRTYPE: "character device",
    tarfile.BLKTYPE: "block device",
    tarfile.FIFOTYPE: "fifo",
}


def _content(archive: tarfile.TarFile, member: tarfile.TarInfo) -> tuple[str, int | None]:
    data = archive.extractfile(member)
    assert data is not None
    digest = hashlib.sha256()
    head = data.read(16)
    digest.update(head)
    for chunk in iter(lambda: data.read(1024 * 1024), b""):
        digest.update(chunk)
    flags = int.from_bytes(head[4:8], "little") if member.name.endswith(".pyc") else None
    return digest.hexdigest()[:16], flags


def _file_differences(
    path: str, first: Entry | None, second: Entry | None
) -> Iterator[tuple[str, str, str, str]]:
    """(what, first, second, note) for each way one file differs between two layers."""
    if first is None or second is None:
        which = "only in the second build" if first is None else "only in the first build"
        yield which, "", "", ""
        return
    if first.kind != second.kind:
        yield "type", first.kind, second.kind, ""
        return
    if first.sha256 != second.sha256:
        timestamp = 0 in (first.pyc_flags, second.pyc_flags)
        yield "content", first.sha256, second.sha256, TIMESTAMP_PYC if timestamp else ""
    for what, a, b in (
        ("link", first.link, second.link),
        ("mode", first.mode, second.mode),
        ("owner", first.owner, second.owner),
        ("xattrs", first.xattrs, second.xattrs),
        ("time", str(first.mtime), str(second.mtime)),
    ):
        if a != b:
            yield what, a, b, ""


def _layer_differences(index: int, step: str, first: Path, second: Path) -> list[Difference]:
    a, b = _entries(first), _entries(second)
    found = []
    for path in sorted(set(a) | set(b)):
        for what, one, two, note in _file_differences(path, a.get(path), b.get(path)):
            found.append(Difference(what, "/" + path.lstrip("/"), one, two, index, step, note))
    return found


def _flat(value: object, prefix: str = "") -> dict[str, str]:
    if isinstance(value, Mapping):
        flat: dict[str, str] = {}
        for key, item in value.items():
            flat |= _flat(item, f"{prefix}.{key}" if prefix else str(key))
        return flat
    if isinstance(value, list):
        flat = {}
        for index, item in enumerate(value):
            flat |= _flat(item, f"{prefix}[{index}]")
        return flat
    return {prefix: json.dumps(value)}


def _config_differences(first: Canonical, second: Canonical) -> list[Difference]:
    a = _flat({k: v for k, v in first.config.items() if k != "rootfs"})
    b = _flat({k: v for k, v in second.config.items() if k != "rootfs"})
    return [
        Difference("config", key, _short(a.get(key, ""), 60), _short(b.get(key, ""), 60))
        for key in sorted(set(a) | set(b))
        if a.get(key) != b.get(key)
    ]


def differences(first: Canonical, second: Canonical) -> list[Difference]:
    """Every difference between two canonical images, most useful first."""
    found = _config_differences(first, second)
    for index in range(max(len(first.layers), len(second.layers))):
        one = first.layers[index] if index < len(first.layers) else None
        two = second.layers[index] if index < len(second.layers) else None
        if one is not None and two is not None and one.diff_id == two.diff_id:
            continue
        present = one or two
        step = present.created_by if present is not None else ""
        if one is None or two is None or one.path is None or two.path is None:
            found.append(
                Difference(
                    "layer",
                    f"layer {index}",
                    one.diff_id[:19] if one else "none",
                    two.diff_id[:19] if two else "none",
                    index,
                    step,
                    "a layer only one build has, or a base layer that differs",
                )
            )
            continue
        found += _layer_differences(index, step, one.path, two.path)
    return sorted(found, key=lambda d: (RANK.get(d.what, 9), d.layer or 0, d.path))
