"""A stand-in for the page-cache helper image (busybox by digest, which no registry here
serves): this host's own ``dash`` and ``sync`` with the libraries they load, imported as an
image (``docker import``), so the privileged helper really runs and really drops the cache.
Also an image with nothing to run, as an image under test that can never start."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

from tests.support.docker_env import docker_cli

HELPER = "sparkbuild-tests/drop-helper:1"
EMPTY = "sparkbuild-tests/nothing-to-run:1"


def _libraries(binary: str) -> list[Path]:
    listed = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    paths = [part for line in listed.splitlines() for part in line.split() if part.startswith("/")]
    return [Path(p) for p in paths]


def _import(reference: str, files: dict[str, Path | bytes]) -> str:
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        for name, source in sorted(files.items()):
            data = source if isinstance(source, bytes) else source.resolve().read_bytes()
            info = tarfile.TarInfo(name.lstrip("/"))
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    done = subprocess.run([docker_cli(), "import", "-", reference], input=archive.getvalue(),
                          capture_output=True, check=True)  # fmt: skip
    return done.stdout.decode().strip()


def helper_image() -> str:
    """The helper's image id (``sh`` is dash; ``sync`` coreutils')."""
    files: dict[str, Path | bytes] = {"/bin/sh": Path("/bin/dash"), "/bin/sync": Path("/bin/sync")}
    for binary in ("/bin/dash", "/bin/sync"):
        files.update({str(lib): lib for lib in _libraries(binary)})
    return _import(HELPER, files)


def empty_image() -> str:
    """An image holding one empty file: any command in it fails to start."""
    return _import(EMPTY, {"/empty": b""})
