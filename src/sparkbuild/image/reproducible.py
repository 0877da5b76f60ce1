"""Reproducible images: every built image is rewritten into one canonical form, so the same
inputs give the same image id on any machine, any day, with or without BuildKit's cache.

What a build leaves that depends on the moment or the host, and what is done about it:

- the config's ``created`` and its history's times (BuildKit before 0.11 takes the clock's):
  set to ``SOURCE_DATE_EPOCH``;
- file times in the layers this build added (a ``RUN`` writes the clock's; BuildKit's own
  ``rewrite-timestamp``, from 0.13, is not in Docker 20.10's built-in BuildKit, 0.8): clamped
  to ``SOURCE_DATE_EPOCH``, as ``rewrite-timestamp`` clamps them;
- the tar form of those layers (entry order, owner names, access and change times in PAX
  headers, which differ between BuildKit versions): entries sorted by path, numeric owners
  only, no times but the clamped modification time, extended attributes kept and sorted;
- the history text of build arguments that tune a build without changing it (``MAX_JOBS``,
  from the host's memory and cores): the value is replaced by ``*``.

The base's layers and history are the base's, pinned by digest, and are left byte for byte.
File contents are never changed: what a build step writes differently each time (the time, a
random name, a ``.pyc`` with a timestamp) stays different, and ``--check-reproducible`` names
it. The image is read back with ``docker save`` and the rewritten one loaded with ``docker
load`` (only its new layers: the daemon has the base's), then takes the build's tags.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import re
import shutil
import tarfile
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

import docker.errors

from sparkbuild.errors import LocalImageError
from sparkbuild.image import tags as image_tags
from sparkbuild.image.labels import rfc3339

if TYPE_CHECKING:
    from docker import DockerClient
    from docker.models.images import Image

#: The canonical form's version: part of every inputs digest, so a change rebuilds.
FORMAT = 1
_SMALL = 4 * 1024 * 1024  # a save's members up to this size (configs, manifests) stay in memory
_CHUNK = 1024 * 1024
# PAX records kept: extended attributes (file capabilities, SELinux labels) are content.
_KEPT_PAX = ("SCHILY.xattr.", "LIBARCHIVE.xattr.")
_TUNING_ARG = re.compile(r"(?<=\s)(MAX_JOBS)=\S*")
# Config keys the classic builder writes about the container and daemon that ran the step.
_HOST_KEYS = ("container", "container_config", "docker_version")


@dataclass(frozen=True)
class Layer:
    """One layer of a canonical image: its diff id, the step that made it, and (for a layer
    this build added) its canonical tar, kept for comparisons while the work dir lives."""

    diff_id: str
    created_by: str
    path: Path | None = None  # None for the base's layers


@dataclass(frozen=True)
class Canonical:
    image_id: str
    config: dict[str, object]
    layers: tuple[Layer, ...]
    base_layers: int
    rewritten: bool  # False when the build's own image was already canonical


@dataclass(frozen=True)
class BaseFacts:
    """What of the base must stay as it is: its layers (diff ids) and its history's length."""

    diff_ids: tuple[str, ...]
    history: int


def base_facts(config: Mapping[str, object]) -> BaseFacts:
    rootfs = config.get("rootfs")
    diff_ids = rootfs.get("diff_ids") if isinstance(rootfs, dict) else None
    history = config.get("history")
    return BaseFacts(
        tuple(str(d) for d in diff_ids or []), len(history) if isinstance(history, list) else 0
    )


# --- reading a saved image --------------------------------------------------------------------


class _Chunks(io.RawIOBase):
    """A file over the docker SDK's chunk generator, for tarfile's stream mode."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._pending = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        while not self._pending:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._pending = chunk
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size


@dataclass
class _Saved:
    small: dict[str, bytes]
    spooled: dict[str, Path]  # member name -> file (layers this build added)
    skipped: set[str]  # members that are base layers (not kept)


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _read_save(stream: IO[bytes] | io.RawIOBase, work: Path, base: BaseFacts) -> _Saved:
    """Every member of a ``docker save`` stream: small ones in memory, layers on disk, except
    the base's (hashed and dropped, or, named by their digest, not read at all)."""
    saved = _Saved({}, {}, set())
    known = {d.removeprefix("sha256:") for d in base.diff_ids}
    with tarfile.open(fileobj=stream, mode="r|") as archive:
        for index, member in enumerate(archive):
            if not member.isfile():
                continue
            if member.name.removeprefix("blobs/sha256/") in known:
                saved.skipped.add(member.name)  # Docker 25+ names blobs by digest
                continue
            source = archive.extractfile(member)
            assert source is not None
            if member.size <= _SMALL:
                saved.small[member.name] = source.read()
                continue
            target = work / f"member-{index}"
            if _spool(source, target) in known:
                target.unlink()
                saved.skipped.add(member.name)
            else:
                saved.spooled[member.name] = target
    return saved


def _spool(source: IO[bytes], target: Path) -> str:
    """Copy ``source`` to ``target``; the sha256 (hex) of what was copied."""
    digest = hashlib.sha256()
    with target.open("wb") as out:
        while chunk := source.read(_CHUNK):
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest()


def _save_manifest(saved: _Saved, image_id: str) -> tuple[dict[str, object], list[str]]:
    """The image's config and its layers' member names, from ``manifest.json``."""
    try:
        (entry,) = json.loads(saved.small["manifest.json"])
        config = json.loads(saved.small[entry["Config"]])
        layers = [str(name) for name in entry["Layers"]]
    except (KeyError, ValueError, TypeError) as exc:
        raise LocalImageError(
            f"docker save of {image_id} has no readable manifest.json or config ({exc})",
            "check the Docker daemon (`docker save IMAGE | tar -t`)",
        ) from None
    return config, layers


# --- canonical layers ---------------------------------------------------------------------


def _canonical_info(member: tarfile.TarInfo, epoch: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(member.name.removeprefix("./").rstrip("/") or ".")
    info.type = member.type
    info.mode = member.mode & 0o7777
    info.uid, info.gid = member.uid, member.gid
    info.uname = info.gname = ""
    info.size = member.size if member.isreg() else 0
    info.linkname = member.linkname
    info.mtime = min(int(member.mtime), epoch)
    if member.ischr() or member.isblk():
        info.devmajor, info.devminor = member.devmajor, member.devminor
    info.pax_headers = {
        key: value for key, value in sorted(member.pax_headers.items()) if key.startswith(_KEPT_PAX)
    }
    return info


def _ordered(members: list[tarfile.TarInfo]) -> list[tarfile.TarInfo]:
    """By path; a hard link after the file it links to, whatever their names."""
    members = sorted(members, key=lambda m: m.name.removeprefix("./").rstrip("/"))
    plain = [m for m in members if not m.islnk()]
    return plain + [m for m in members if m.islnk()]


class _Hashing(io.RawIOBase):
    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.digest = hashlib.sha256()

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.digest.update(data)
        return self.out.write(data)


def canonical_layer(source: Path, dest: Path, epoch: int) -> str:
    """Write ``source``'s canonical form to ``dest``; its diff id."""
    with (
        tarfile.open(source, mode="r:") as archive,
        dest.open("wb") as out,
    ):
        hashing = _Hashing(out)
        with tarfile.open(
            fileobj=hashing, mode="w|", format=tarfile.PAX_FORMAT, encoding="utf-8"
        ) as written:
            for member in _ordered(archive.getmembers()):
                info = _canonical_info(member, epoch)
                data = archive.extractfile(member) if member.isreg() else None
                written.addfile(info, data)
    return "sha256:" + hashing.digest.hexdigest()


# --- the canonical config -----------------------------------------------------------------


def canonical_config(
    config: Mapping[str, object], diff_ids: Sequence[str], base: BaseFacts, epoch: int
) -> dict[str, object]:
    created = rfc3339(epoch)
    result = {k: v for k, v in config.items() if k not in _HOST_KEYS}
    result["created"] = created
    history = config.get("history")
    steps: list[object] = []
    for index, step in enumerate(history if isinstance(history, list) else []):
        ours = index >= base.history and isinstance(step, dict)
        steps.append(_canonical_step(step, created) if ours else step)
    result["history"] = steps
    rootfs = config.get("rootfs")
    result["rootfs"] = {**(rootfs if isinstance(rootfs, dict) else {}), "diff_ids": list(diff_ids)}
    return result


def _canonical_step(step: Mapping[str, object], created: str) -> dict[str, object]:
    result = {**step, "created": created}
    text = step.get("created_by")
    if isinstance(text, str):
        result["created_by"] = _TUNING_ARG.sub(r"\1=*", text)
    return result


def config_bytes(config: Mapping[str, object]) -> bytes:
    return json.dumps(config, sort_keys=True, separators=(",", ":")).encode()


def _steps(config: Mapping[str, object]) -> list[str]:
    """The ``created_by`` of each step that made a layer, in layer order."""
    history = config.get("history")
    return [
        str(step.get("created_by") or "")
        for step in (history if isinstance(history, list) else [])
        if isinstance(step, dict) and not step.get("empty_layer")
    ]


# --- the whole image ------------------------------------------------------------------------


def canonicalise(
    api: DockerClient, image: Image, base: BaseFacts, epoch: int, work: Path
) -> Canonical:
    """The canonical form of ``image`` (read with ``docker save``), its new layers under
    ``work``; nothing is loaded yet."""
    image_id = str(image.id)
    spool = work / "save"
    spool.mkdir(parents=True, exist_ok=True)
    try:
        saved = _read_save(_Chunks(image.save(chunk_size=_CHUNK, named=False)), spool, base)
    except (docker.errors.APIError, tarfile.TarError, OSError) as exc:
        raise LocalImageError(
            f"could not read back the built image {image_id} (docker save: {exc})",
            "check the Docker daemon and free space under the cache directory",
        ) from None
    config, members = _save_manifest(saved, image_id)
    diff_ids = list(base_facts(config).diff_ids)
    if diff_ids[: len(base.diff_ids)] != list(base.diff_ids):
        raise LocalImageError(
            f"the built image {image_id} does not start with its base's layers",
            "the base image changed under the build; build again",
        )
    steps = _steps(config)
    layers = [Layer(d, _at(steps, i)) for i, d in enumerate(base.diff_ids)]
    out = work / "layers"
    out.mkdir(exist_ok=True)
    for index in range(len(base.diff_ids), len(members)):
        source = _member_file(saved, members[index], spool)
        dest = out / f"{index}.tar"
        layers.append(Layer(canonical_layer(source, dest, epoch), _at(steps, index), dest))
    shutil.rmtree(spool, ignore_errors=True)
    final = canonical_config(config, [layer.diff_id for layer in layers], base, epoch)
    canonical_id = _sha256(config_bytes(final))
    return Canonical(
        canonical_id, final, tuple(layers), len(base.diff_ids), canonical_id != image_id
    )


def _at(steps: Sequence[str], index: int) -> str:
    return steps[index] if index < len(steps) else ""


def _member_file(saved: _Saved, name: str, spool: Path) -> Path:
    if name in saved.spooled:
        return saved.spooled[name]
    if name in saved.small:
        path = spool / f"small-{len(saved.spooled)}-{hashlib.sha256(name.encode()).hexdigest()}"
        path.write_bytes(saved.small[name])
        saved.spooled[name] = path
        return path
    raise LocalImageError(f"docker save left out the layer {name}", "build again")


def load(api: DockerClient, canonical: Canonical, work: Path) -> None:
    """Load ``canonical`` into the daemon: a ``docker save``-shaped archive with its config
    and new layers (the base's are already in the daemon's layer store)."""
    archive = work / "canonical.tar"
    hex_id = canonical.image_id.removeprefix("sha256:")
    layer_names = [
        f"{layer.diff_id.removeprefix('sha256:')}/layer.tar" for layer in canonical.layers
    ]
    manifest = [{"Config": f"{hex_id}.json", "RepoTags": None, "Layers": layer_names}]
    with tarfile.open(archive, mode="w") as out:
        _add_bytes(out, f"{hex_id}.json", config_bytes(canonical.config))
        for layer, name in zip(canonical.layers, layer_names, strict=True):
            if layer.path is not None:
                out.add(layer.path, arcname=name)
        _add_bytes(out, "manifest.json", json.dumps(manifest).encode())
    try:
        with archive.open("rb") as data:
            api.images.load(data)
    except (docker.errors.APIError, docker.errors.ImageLoadError) as exc:
        raise LocalImageError(
            f"docker load refused the reproducible form {canonical.image_id} ({exc})",
            "check the Docker daemon's log; the build itself succeeded",
        ) from None
    finally:
        archive.unlink(missing_ok=True)


def _add_bytes(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    archive.addfile(info, io.BytesIO(data))


@contextlib.contextmanager
def workdir(root: Path) -> Iterator[Path]:
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix="reproducible-") as tmp:
        yield Path(tmp)


def make_reproducible(
    api: DockerClient,
    built_id: str,
    base: BaseFacts,
    epoch: int,
    tags: tuple[str, ...],
    work: Path,
) -> Canonical:
    """Replace the built image by its canonical form (same tags, same labels), in the daemon;
    the build's own image is removed when it differs."""
    built = api.images.get(built_id)
    canonical = canonicalise(api, built, base, epoch, work)
    if canonical.rewritten:
        load(api, canonical, work)
    image = api.images.get(canonical.image_id)
    image_tags.ensure_tags(image, tags)
    if canonical.rewritten:
        # The build's own form, now untagged; a container still using it keeps it alive.
        with contextlib.suppress(docker.errors.APIError):
            api.images.remove(built_id, noprune=False)
    return canonical
