"""A container image that runs the CPU vLLM engine, made without any registry.

No image can be pulled here, and installing vLLM into an image would mean copying gigabytes.
Instead the image is a skeleton root filesystem (``docker import`` of a few directories,
merged-/usr symlinks, ``/etc/passwd`` and the loader cache), and the container gets the host's
``/usr``, the pyenv Python the venv was made from and the vLLM venv bind-mounted read-only
at the same paths. What runs inside is the real engine in a real container (own PID, mount
and network namespaces), reached through a port published on 127.0.0.1.
"""

from __future__ import annotations

import configparser
import io
import subprocess
import tarfile
from pathlib import Path

__all__ = ["SKELETON_IMAGE", "engine_mounts", "skeleton_image"]

SKELETON_IMAGE = "sparkbuild-tests/skeleton:1"


def _add_dir(tar: tarfile.TarFile, name: str, mode: int = 0o755) -> None:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = mode
    tar.addfile(info)


def _add_link(tar: tarfile.TarFile, name: str, target: str) -> None:
    info = tarfile.TarInfo(name)
    info.type = tarfile.SYMTYPE
    info.linkname = target
    tar.addfile(info)


def _add_file(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    tar.addfile(info, io.BytesIO(data))


def _skeleton_tar() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name in ("usr", "etc", "root", "tmp", "proc", "sys", "dev", "models", "var", "run"):
            _add_dir(tar, name, 0o1777 if name == "tmp" else 0o755)
        for name in ("bin", "sbin", "lib", "lib64"):
            _add_link(tar, name, f"usr/{name}")
        _add_file(tar, "etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n")
        _add_file(tar, "etc/group", b"root:x:0:\n")
        _add_file(tar, "etc/hosts", b"127.0.0.1 localhost\n")
        cache = Path("/etc/ld.so.cache")
        if cache.exists():
            _add_file(tar, "etc/ld.so.cache", cache.read_bytes())
    return buffer.getvalue()


def skeleton_image() -> str:
    """Import the skeleton image into the local Docker engine (once) and return its name."""
    probe = subprocess.run(
        ["docker", "image", "inspect", SKELETON_IMAGE], capture_output=True, check=False
    )
    if probe.returncode == 0:
        return SKELETON_IMAGE
    subprocess.run(
        ["docker", "import", "-", SKELETON_IMAGE],
        input=_skeleton_tar(),
        capture_output=True,
        check=True,
    )
    return SKELETON_IMAGE


def engine_mounts(venv: Path) -> list[str]:
    """``HOST:CONTAINER:ro`` mounts that make ``venv``'s python work inside the skeleton."""
    config = configparser.ConfigParser()
    config.read_string("[venv]\n" + (venv / "pyvenv.cfg").read_text(encoding="utf-8"))
    base_prefix = Path(config["venv"]["home"]).resolve().parent
    mounts = ["/usr:/usr:ro", f"{venv}:{venv}:ro"]
    if not base_prefix.is_relative_to("/usr"):  # a system Python is already in /usr
        mounts.insert(1, f"{base_prefix}:{base_prefix}:ro")
    return mounts
