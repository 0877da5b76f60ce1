"""An image's files read without running it: one pass over the filesystem of a created,
never started, container (Docker's export), keeping what the device-code audit needs.

Kept: the device code of every ELF and fatbin file (``devicecode``), the dynamic links
of every ELF (which libraries load which), who owns each file (a Python distribution's
``RECORD``, a Debian package's ``/var/lib/dpkg/info/*.list``), each distribution's
``METADATA`` (name, version, requirements), the library symlinks, and whether the image
has ``nvcc`` (what a run-time compile needs). Everything else streams past. An image is
hostile input: every member is bounded, names are only ever compared, never opened on
the host, and nothing of the image runs.
"""

from __future__ import annotations

import csv
import email.parser
import io
import posixpath
import re
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING

import docker.errors

from sparkbuild.attest.contents import parse_dpkg_status, parse_metadata
from sparkbuild.errors import AuditError
from sparkbuild.image.devicecode import ELF_MAGIC, FATBIN_BYTES, DeviceCode, read_device_code

if TYPE_CHECKING:
    from docker import DockerClient

#: A member larger than this is read past, not parsed (libtorch_cuda.so is ~1.5 GB).
MAX_BINARY = 8 * 1024**3
#: RECORD, METADATA and dpkg lists: torch's RECORD is about 2 MB.
MAX_TEXT = 64 * 1024**2
MAX_MEMBERS = 5_000_000
_SPOOL_IN_MEMORY = 64 * 1024**2
_CHUNK = 1024 * 1024
_DPKG_LIST = re.compile(r"^/var/lib/dpkg/info/([^/:]+)(?::[^/]+)?\.list\Z")
_DIST_INFO = re.compile(r"^(.*)/([^/]+)\.dist-info/(RECORD|METADATA)\Z")
_LIBRARY_NAME = re.compile(r"\.so(\.\d+)*\Z")


@dataclass(frozen=True)
class Distribution:
    """A Python distribution found in the image."""

    name: str
    version: str
    site: str
    requires: tuple[str, ...]  # Requires-Dist, as written


@dataclass
class ImageFiles:
    """What one pass over an image's filesystem kept."""

    code: dict[str, DeviceCode] = field(default_factory=dict)  # path -> ELFs and fatbins
    symlinks: dict[str, str] = field(default_factory=dict)  # library path -> its target
    owners: dict[str, tuple[str, str]] = field(default_factory=dict)  # path -> (kind, name)
    distributions: dict[str, Distribution] = field(default_factory=dict)  # by name
    debian: dict[str, str] = field(default_factory=dict)  # package -> version
    nvcc: list[str] = field(default_factory=list)  # where the image has nvcc
    members: int = 0
    skipped: list[str] = field(default_factory=list)  # binaries too large to read


class _Stream(io.RawIOBase):
    """The export's chunks as a file, for tarfile's stream mode."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks, self._buffer = chunks, b""

    def readable(self) -> bool:
        return True

    def readinto(self, target: bytearray | memoryview) -> int:  # type: ignore[override]
        while not self._buffer:
            try:
                self._buffer = next(self._chunks)
            except StopIteration:
                return 0
        size = min(len(target), len(self._buffer))
        target[:size] = self._buffer[:size]
        self._buffer = self._buffer[size:]
        return size


def read_image_files(
    api: DockerClient, image: str, progress: Callable[[int], None] = lambda _n: None
) -> ImageFiles:
    """One pass over ``image``'s filesystem (``progress`` hears the members read so far)."""
    try:
        container = api.containers.create(image, entrypoint=["true"], network_disabled=True)
    except docker.errors.DockerException as exc:
        raise AuditError(
            f"cannot read image {image[:40]}: {exc}",
            "check the reference with `docker image inspect IMAGE` (pull it first)",
        ) from None
    try:
        exported: Iterator[object] = iter(container.export(chunk_size=_CHUNK))
        chunks = (c for c in exported if isinstance(c, bytes))  # the stubs say str
        stream = io.BufferedReader(_Stream(chunks), _CHUNK)
        with tarfile.open(fileobj=stream, mode="r|") as archive:
            return _walk(archive, progress)
    except (tarfile.TarError, docker.errors.DockerException, OSError) as exc:
        raise AuditError(
            f"reading the files of image {image[:40]} failed: {type(exc).__name__}: {exc}",
            "check the Docker daemon's disk and log, then run `sparkbuild audit IMAGE` again",
        ) from None
    finally:
        container.remove(force=True)


def _walk(archive: tarfile.TarFile, progress: Callable[[int], None]) -> ImageFiles:
    found = ImageFiles()
    texts: dict[str, bytes] = {}
    for member in archive:
        found.members += 1
        if found.members > MAX_MEMBERS:
            raise AuditError(
                f"the image has more than {MAX_MEMBERS} files; not audited",
                "audit a smaller image, or split the image's layers",
            )
        if found.members % 20000 == 0:
            progress(found.members)
        path = "/" + member.name.removeprefix("./").lstrip("/")
        if member.issym() and _LIBRARY_NAME.search(path):
            found.symlinks[path] = posixpath.normpath(
                posixpath.join(posixpath.dirname(path), member.linkname)
            )
        if not member.isreg():
            continue
        if path.endswith("/bin/nvcc"):
            found.nvcc.append(path)
        if _DIST_INFO.match(path) or _DPKG_LIST.match(path) or path == "/var/lib/dpkg/status":
            if member.size <= MAX_TEXT:
                texts[path] = _read_all(archive, member)
            continue
        _binary(archive, member, path, found)
    _own(found, texts)
    return found


def _read_all(archive: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    handle = archive.extractfile(member)
    return handle.read(MAX_TEXT) if handle is not None else b""


def _binary(
    archive: tarfile.TarFile, member: tarfile.TarInfo, path: str, found: ImageFiles
) -> None:
    if member.size < 16:
        return
    handle = archive.extractfile(member)
    if handle is None:
        return
    head = handle.read(4)
    if head not in (ELF_MAGIC, FATBIN_BYTES):
        return
    if member.size > MAX_BINARY:
        found.skipped.append(path)
        return
    with tempfile.SpooledTemporaryFile(max_size=_SPOOL_IN_MEMORY) as spool:
        spool.write(head)
        _copy(handle, spool)
        code = read_device_code(spool, member.size)  # type: ignore[arg-type]
    if code is not None:
        found.code[path] = code


def _copy(source: IO[bytes], target: IO[bytes]) -> None:
    while chunk := source.read(_CHUNK):
        target.write(chunk)


# --- who owns each file -------------------------------------------------------------------


def _own(found: ImageFiles, texts: dict[str, bytes]) -> None:
    status = texts.pop("/var/lib/dpkg/status", b"")
    found.debian = {p.name: p.version for p in parse_dpkg_status(status.decode("utf-8", "replace"))}
    for path, data in sorted(texts.items()):
        listed = _DPKG_LIST.match(path)
        if listed:
            for line in data.decode("utf-8", "replace").splitlines():
                if line.startswith("/"):
                    found.owners.setdefault(posixpath.normpath(line), ("deb", listed.group(1)))
    for path, data in sorted(texts.items()):
        info = _DIST_INFO.match(path)
        if info is None or info.group(3) != "METADATA":
            continue
        distribution = _distribution(info.group(1), info.group(2), data)
        found.distributions.setdefault(distribution.name, distribution)
        record = texts.get(path.removesuffix("METADATA") + "RECORD", b"")
        for row in csv.reader(io.StringIO(record.decode("utf-8", "replace"))):
            if row and row[0]:
                owned = posixpath.normpath(posixpath.join(distribution.site, row[0]))
                found.owners[owned] = ("python", distribution.name)


def _distribution(site: str, directory: str, metadata: bytes) -> Distribution:
    parsed = parse_metadata(metadata)
    name, version = parsed or (directory.rsplit("-", 1)[0], directory.rsplit("-", 1)[-1])
    message = email.parser.BytesParser().parsebytes(metadata, headersonly=True)
    requires = tuple(str(r) for r in (message.get_all("Requires-Dist") or ())[:2000])
    return Distribution(name, version, site, requires)
