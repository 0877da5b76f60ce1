"""What an image holds, read from the image itself: its OS packages (dpkg's status file)
and every Python distribution in every site-packages directory.

One short container of the image lists the distributions' metadata directories (``find``,
no network); the files are then copied out of a created, never started, container of the
image (Docker's archive API): ``/var/lib/dpkg/status``, ``os-release``, and each
distribution's ``METADATA`` (or ``PKG-INFO``) and ``RECORD``. Everything read is bounded
and parsed as data: a hostile image can make the SBOM wrong, never make sparkbuild run
anything else.

Then the listing is checked against the image itself: a second short container asks the
image's ``python3`` (and each virtual environment's interpreter) what ``importlib.metadata``
sees, and a distribution it sees that the listing lacks stops the SBOM, so nothing is signed.
An SBOM that verifies but lists nothing is worse than none (issue 46: docker-py's
``containers.run(..., remove=True)`` lost the listing's output in up to 3 of 3 publishes).
"""

from __future__ import annotations

import csv
import email.parser
import hashlib
import io
import json
import posixpath
import tarfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING

import docker.errors
from packaging.utils import canonicalize_name

from sparkbuild import dockerhost
from sparkbuild.errors import PublishError

if TYPE_CHECKING:
    from docker import DockerClient
    from docker.models.containers import Container

#: dpkg's status file of a large image is a few MB; a RECORD of torch about 2 MB.
FILE_LIMIT = 64 * 1024 * 1024
LISTING_LIMIT = 16 * 1024 * 1024
MAX_DISTRIBUTIONS = 5000
#: Run with the image's python3: what importlib.metadata sees (data/attest/).
SEEN_SCRIPT = "data/attest/seen_distributions.py"
_FIND = [
    "/",
    "-xdev",
    "(",
    "-path",
    "/proc",
    "-o",
    "-path",
    "/sys",
    "-o",
    "-path",
    "/dev",
    ")",
    "-prune",
    "-o",
    "(",
    "-name",
    "*.dist-info",
    "-o",
    "-name",
    "*.egg-info",
    ")",
    "-print0",
    "-prune",
]


@dataclass(frozen=True)
class OsPackage:
    name: str
    version: str
    architecture: str
    source: str | None = None


@dataclass(frozen=True)
class PythonDistribution:
    name: str
    version: str
    site: str  # the site-packages (or dist-packages) directory that holds it
    record_sha256: str | None  # of its RECORD, when RECORD lists the files' hashes
    hashed_files: int


@dataclass(frozen=True)
class ImageContents:
    os_id: str  # os-release ID, e.g. debian, ubuntu
    os_version: str  # VERSION_ID
    packages: tuple[OsPackage, ...]
    distributions: tuple[PythonDistribution, ...]


def _sbom_error(image: str, what: str) -> PublishError:
    return PublishError(
        f"cannot read the SBOM's contents from image {image[:19]}: {what}; nothing was signed",
        "the image must run `find` (any Debian or Ubuntu based engine image does); "
        "`sparkbuild publish` without a signing key publishes it unsigned",
    )


# --- dpkg and os-release ------------------------------------------------------------------


def _paragraphs(text: str) -> Iterator[dict[str, str]]:
    """The stanzas of a Debian control file (dpkg's status): field -> first-line value."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                yield fields
            fields = {}
        elif not line[0].isspace() and ":" in line:
            name, _, value = line.partition(":")
            fields[name.strip().lower()] = value.strip()
    if fields:
        yield fields


def parse_dpkg_status(text: str) -> list[OsPackage]:
    """Installed packages only (``Status: install ok installed``)."""
    found = []
    for fields in _paragraphs(text):
        if fields.get("status", "").split()[-1:] != ["installed"]:
            continue
        name, version = fields.get("package"), fields.get("version")
        if name and version:
            source = fields.get("source", "").split(" ")[0] or None
            found.append(OsPackage(name, version, fields.get("architecture", ""), source))
    return found


def parse_os_release(text: str) -> tuple[str, str]:
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip().strip("\"'")
    return values.get("ID", "linux"), values.get("VERSION_ID", "")


# --- Python distributions -----------------------------------------------------------------


def parse_metadata(data: bytes) -> tuple[str, str] | None:
    message = email.parser.BytesParser().parsebytes(data, headersonly=True)
    name, version = message.get("Name"), message.get("Version")
    return (str(name).strip(), str(version).strip()) if name and version else None


def record_hashes(data: bytes) -> int:
    """How many files a RECORD lists with a hash."""
    rows = csv.reader(io.StringIO(data.decode("utf-8", errors="replace")))
    return sum(1 for row in rows if len(row) >= 2 and "=" in row[1])


def distribution(site: str, files: dict[str, bytes]) -> PythonDistribution | None:
    single = [data for name, data in files.items() if name.endswith(".egg-info")]
    metadata = files.get("METADATA") or files.get("PKG-INFO") or (single[0] if single else None)
    parsed = parse_metadata(metadata) if metadata else None
    if parsed is None:
        return None
    record = files.get("RECORD")
    hashed = record_hashes(record) if record else 0
    digest = hashlib.sha256(record).hexdigest() if record and hashed else None
    return PythonDistribution(parsed[0], parsed[1], site, digest, hashed)


# --- reading from the image ---------------------------------------------------------------


def _bounded(chunks: Iterable[bytes], limit: int, image: str, path: str) -> bytes:
    buffer = bytearray()
    for chunk in chunks:
        buffer += chunk
        if len(buffer) > limit:
            raise _sbom_error(image, f"{path} is larger than {limit // (1024 * 1024)} MiB")
    return bytes(buffer)


def _archive(container: Container, path: str, image: str) -> dict[str, bytes]:
    """Regular files under ``path`` in the container, by base name (one level: a
    distribution's metadata directory, or one file)."""
    try:
        chunks, _ = container.get_archive(path)
    except docker.errors.NotFound:
        return {}
    raw = _bounded(chunks, FILE_LIMIT, image, path)
    files = {}
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
        for member in tar:
            handle = tar.extractfile(member) if member.isreg() else None
            if handle is not None and member.name.count("/") <= 1:
                files[posixpath.basename(member.name)] = handle.read()
    return files


def _listing(api: DockerClient, image: str) -> list[str]:
    try:
        done = dockerhost.run_once(
            api, image, _FIND, entrypoint=["find"], network_disabled=True, limit=LISTING_LIMIT
        )
    except docker.errors.DockerException as exc:
        raise _sbom_error(image, f"`find` in the image failed ({type(exc).__name__})") from None
    if done.status != 0:
        why = done.stderr.decode("utf-8", errors="replace").strip()[-300:]
        raise _sbom_error(image, f"`find` in the image exited {done.status}: {why!r}")
    if done.cut:
        raise _sbom_error(image, "the list of distributions is too long")
    paths = [p.decode("utf-8", errors="replace") for p in done.stdout.split(b"\0") if p]
    if len(paths) > MAX_DISTRIBUTIONS:
        raise _sbom_error(image, f"more than {MAX_DISTRIBUTIONS} Python distributions")
    return sorted(paths)


# --- what the image's own interpreters see --------------------------------------------------


@dataclass(frozen=True)
class SeenDistribution:
    """A distribution one of the image's interpreters finds with ``importlib.metadata``."""

    interpreter: str
    name: str
    version: str


def _interpreters_absent(exc: docker.errors.DockerException) -> bool:
    """Docker could not start ``python3``: the image has no interpreter on its PATH."""
    text = str(exc).lower()
    return "executable file not found" in text or "no such file or directory" in text


def seen_distributions(
    api: DockerClient, image: str, sites: Sequence[str]
) -> tuple[SeenDistribution, ...]:
    """What ``importlib.metadata`` finds, asked of the image's ``python3`` and of each
    virtual environment's interpreter among ``sites`` (none: the image has no Python)."""
    script = resources.files("sparkbuild").joinpath(SEEN_SCRIPT).read_text(encoding="utf-8")
    try:
        done = dockerhost.run_once(
            api,
            image,
            ["-I", "-c", script, json.dumps(list(sites))],
            entrypoint=["python3"],
            network_disabled=True,
            limit=LISTING_LIMIT,
            wait_s=300,
        )
    except docker.errors.DockerException as exc:
        if _interpreters_absent(exc):
            return ()
        raise _sbom_error(image, f"its python3 could not run ({type(exc).__name__})") from None
    if done.status == 127 or (done.status != 0 and b"not found" in done.stderr[-300:]):
        return ()
    try:
        report = json.loads(done.stdout)
        return tuple(
            SeenDistribution(str(one["interpreter"]), str(name), str(version))
            for one in report
            for name, version in one["distributions"]
        )
    except (ValueError, TypeError, KeyError):
        why = done.stderr.decode("utf-8", errors="replace").strip()[-300:]
        raise _sbom_error(
            image, f"its python3 did not list its distributions (exit {done.status}: {why!r})"
        ) from None


def unlisted(
    distributions: Iterable[PythonDistribution], seen: Iterable[SeenDistribution]
) -> list[SeenDistribution]:
    """What an interpreter sees that the listing does not hold (by name and version)."""
    listed = {(canonicalize_name(d.name), d.version) for d in distributions}
    missing = {s for s in seen if (canonicalize_name(s.name), s.version) not in listed}
    return sorted(missing, key=lambda s: (canonicalize_name(s.name), s.version, s.interpreter))


def _check_complete(
    image: str, found: Sequence[PythonDistribution], sites: Sequence[str], api: DockerClient
) -> None:
    missing = unlisted(found, seen_distributions(api, image, sites))
    if missing:
        shown = ", ".join(f"{m.name} {m.version} ({m.interpreter})" for m in missing[:8])
        more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
        raise _sbom_error(
            image,
            f"the image's own Python sees {len(missing)} distribution(s) the listing missed: "
            f"{shown}{more}",
        )


def _text(files: dict[str, bytes], name: str) -> str:
    return files.get(name, b"").decode("utf-8", errors="replace")


def read_contents(api: DockerClient, image: str) -> ImageContents:
    """The OS packages and Python distributions of ``image`` (an id or reference)."""
    directories = _listing(api, image)
    container = api.containers.create(image, entrypoint=["true"], network_disabled=True)
    try:
        status = _text(_archive(container, "/var/lib/dpkg/status", image), "status")
        os_release = _text(_archive(container, "/usr/lib/os-release", image), "os-release")
        os_release = os_release or _text(
            _archive(container, "/etc/os-release", image), "os-release"
        )
        found = []
        for path in directories:
            files = _archive(container, path, image)
            dist = distribution(posixpath.dirname(path), files)
            if dist is not None:
                found.append(dist)
    finally:
        container.remove(force=True)
    _check_complete(image, found, sorted({posixpath.dirname(p) for p in directories}), api)
    os_id, os_version = parse_os_release(os_release)
    return ImageContents(os_id, os_version, tuple(parse_dpkg_status(status)), tuple(found))
