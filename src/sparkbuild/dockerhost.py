"""The local Docker engine: one client factory, the platform grammar, and whether this host
can execute a platform's binaries (natively or through qemu emulation)."""

from __future__ import annotations

import os
import platform as host_platform
import re
from collections.abc import Iterable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import docker
import docker.errors
import requests.exceptions

from sparkbuild.console import clipped
from sparkbuild.errors import DockerAPIError, DockerUnavailableError, PlatformError, SparkbuildError

SETUP_HINT = "start one with `sudo scripts/setup-host.sh` (or `sudo systemctl start docker`)"


def client(timeout: int = 300, endpoint: str | None = None) -> docker.DockerClient:
    """A docker SDK client for the daemon, or an error saying how to start one.

    ``endpoint`` names another daemon (a cluster node): ``unix://``, ``tcp://`` or
    ``ssh://`` (through the ssh command, so the user's ssh config and agent apply; the SDK
    still imports paramiko for it, which the ``docker[ssh]`` dependency brings), or a docker
    context name; None or ``local`` is this host's (``DOCKER_HOST`` or the socket).
    """
    where = endpoint or os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    try:
        if endpoint in (None, "local"):
            api = docker.from_env(timeout=timeout)
        elif "://" in endpoint:
            ssh = endpoint.startswith("ssh://")
            api = docker.DockerClient(base_url=endpoint, timeout=timeout, use_ssh_client=ssh)
        else:
            api = _context_client(endpoint, timeout)
        api.ping()
    except docker.errors.DockerException as exc:
        raise DockerUnavailableError(
            f"no Docker daemon answers at {where} ({exc})", _endpoint_hint(endpoint, where, exc)
        ) from exc
    return api


# What every Docker Engine API answers: a 404 here is another service at the address.
_SYSTEM_PATHS = ("/_ping", "/info", "/version")
_VERSIONED = re.compile(r"^/v[0-9.]+(?=/)")


def api_error(exc: docker.errors.DockerException) -> SparkbuildError:
    """The one mapping from a docker SDK failure to the error the user sees (as docker-py's
    own errors.py maps HTTP answers to its classes): the endpoint, what was asked, what it
    answered, and what to check; never "a file operation" (an APIError is an OSError)."""
    if not isinstance(exc, docker.errors.APIError) or exc.response is None:
        return DockerUnavailableError(f"the Docker engine failed: {clipped(exc)}", SETUP_HINT)
    url = urlsplit(str(exc.response.url or ""))
    where = _endpoint_of(url.scheme, url.netloc)
    path = _VERSIONED.sub("", url.path) or "/"
    method = exc.response.request.method if exc.response.request is not None else "GET"
    said = clipped(exc.explanation or exc.response.reason or "", 200)
    if exc.status_code == 404 and path in _SYSTEM_PATHS:
        return DockerAPIError(
            f"{where} answered 404 to {path}: it is not a Docker Engine API (another service "
            "answers at that address)",
            "point the endpoint (DOCKER_HOST, a cluster node's endpoint:) at a Docker daemon; "
            f"`docker --host {where} info` shows what answers there",
        )
    return DockerAPIError(
        f"the Docker engine at {where} answered {exc.status_code} to {method} {path}"
        + (f": {said}" if said else ""),
        f"check the daemon (`docker --host {where} info`, its log), then run again",
    )


def _endpoint_of(scheme: str, netloc: str) -> str:
    """The endpoint as `docker --host` takes it, from the URL docker-py asked."""
    if scheme in ("http", "https") and netloc:
        return f"tcp://{netloc}"
    return os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")  # a socket: no host


@dataclass(frozen=True)
class DaemonInfo:
    """What sparkbuild reads of a daemon's ``/info``: its machine, runtimes and size."""

    architecture: str
    runtimes: frozenset[str]
    memory_bytes: int
    cpus: int


def info(api: docker.DockerClient) -> DaemonInfo:
    """The daemon's ``/info``, or the mapped error (:func:`api_error`); a field that is not
    what Docker sends counts as missing."""
    try:
        found = api.info()
    except docker.errors.DockerException as exc:
        raise api_error(exc) from exc
    runtimes = _field(found, "Runtimes", {})
    return DaemonInfo(
        architecture=str(_field(found, "Architecture", "")).lower(),
        runtimes=frozenset(map(str, runtimes)) if isinstance(runtimes, dict) else frozenset(),
        memory_bytes=_count(_field(found, "MemTotal", 0), 0),
        cpus=_count(_field(found, "NCPU", 1), 1),
    )


def _field(found: object, key: str, default: object) -> object:
    return found.get(key, default) if isinstance(found, dict) else default


def _count(value: object, default: int) -> int:
    return value if isinstance(value, int) and value >= 0 else default


def _endpoint_hint(endpoint: str | None, where: str, exc: Exception) -> str:
    if endpoint in (None, "local"):
        return SETUP_HINT
    if "paramiko" in str(exc):  # an install without the SDK's ssh extra
        return "ssh:// endpoints need the docker SDK's ssh extra: `pip install 'docker[ssh]'`"
    if where.startswith("ssh://"):
        parts = urlsplit(where)
        login = f"{parts.username}@{parts.hostname}" if parts.username else str(parts.hostname)
        port = f" -p {parts.port}" if parts.port else ""
        return (
            f"check that `ssh{port} {login} docker info` works from this machine without a "
            "prompt (a key or an agent; ~/.ssh/config applies) and that the user there is in "
            "the docker group"
        )
    return f"check that `docker --host {where} info` works from this machine"


def _context_client(name: str, timeout: int) -> docker.DockerClient:
    from docker.context import ContextAPI

    context = ContextAPI.get_context(name)
    if context is None:
        raise docker.errors.DockerException(f"no docker context named {name!r}")
    host = context.Host or "unix:///var/run/docker.sock"
    return docker.DockerClient(
        base_url=host,
        tls=context.TLSConfig or False,
        timeout=timeout,
        use_ssh_client=host.startswith("ssh://"),
    )


_ARCH_ALIASES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
_QEMU_NAMES = {
    "arm64": "aarch64",
    "amd64": "x86_64",
    "arm": "arm",
    "ppc64le": "ppc64le",
    "s390x": "s390x",
    "riscv64": "riscv64",
}


def platform_arch(platform: str) -> str:
    parts = platform.split("/")
    if len(parts) < 2 or parts[0] != "linux":
        raise PlatformError(
            f"platform '{platform}' is not of the form linux/ARCH", "for example linux/arm64"
        )
    return parts[1]


def check_can_run(platform: str, binfmt_dir: Path = Path("/proc/sys/fs/binfmt_misc")) -> None:
    """Fail early when the local builder cannot execute ``platform``'s binaries."""
    arch = platform_arch(platform)
    native = _ARCH_ALIASES.get(host_platform.machine(), host_platform.machine())
    if arch == native:
        return
    entry = binfmt_dir / f"qemu-{_QEMU_NAMES.get(arch, arch)}"
    try:
        enabled = entry.read_text().startswith("enabled")
    except OSError:
        enabled = False
    if not enabled:
        raise DockerUnavailableError(
            f"this {native} host cannot run {platform} binaries: no qemu emulation registered "
            f"({entry} missing or disabled)",
            "enable it with `sudo scripts/setup-host.sh`, or build on a native builder with "
            "`--builder NAME` (see docs/image.md)",
        )


@dataclass(frozen=True)
class Finished:
    """A short container's end: its exit status and what it wrote (each cut at the limit)."""

    status: int  # -1: it did not end within the wait (it was killed)
    stdout: bytes
    stderr: bytes
    cut: bool = False  # an output was longer than the limit


def run_once(
    api: docker.DockerClient,
    image: str,
    command: list[str],
    *,
    wait_s: float = 600,
    limit: int = 64 * 1024 * 1024,
    **settings: Any,  # containers.create's own keywords
) -> Finished:
    """Run ``command`` in a new container of ``image`` to its end, read its output, remove it.

    Not ``containers.run(..., remove=True)``: with the json-file log driver, docker-py removes
    such a container before it reads the log stream, and then returns nothing (an image's
    listing came back empty 7 times in 10). ``settings`` go to ``containers.create``; Docker's
    own errors (an image it cannot find or start) reach the caller as docker-py raised them.
    """
    container = api.containers.create(image, command, **settings)
    try:
        container.start()
        try:
            status = int(container.wait(timeout=wait_s).get("StatusCode", -1))
        except requests.exceptions.RequestException:
            status = -1
            with suppress(docker.errors.DockerException):
                container.kill()
        stdout, cut_out = _bounded(container.logs(stdout=True, stderr=False, stream=True), limit)
        stderr, cut_err = _bounded(container.logs(stdout=False, stderr=True, stream=True), limit)
    finally:
        with suppress(docker.errors.DockerException, requests.exceptions.RequestException):
            container.remove(force=True)
    return Finished(status, stdout, stderr, cut_out or cut_err)


def _bounded(chunks: Iterable[bytes], limit: int) -> tuple[bytes, bool]:
    buffer = bytearray()
    for chunk in chunks:
        buffer += chunk
        if len(buffer) > limit:
            return bytes(buffer[:limit]), True
    return bytes(buffer), False
