"""Running BuildKit through the docker CLI: finding a capable client, streaming, failures.

Builds go through BuildKit only: ``docker buildx build`` where the buildx plugin exists,
otherwise a docker client that still has BuildKit built in (CLI before 23.0, with
``DOCKER_BUILDKIT=1``). Newer clients without buildx refuse BuildKit builds, so every docker
client on PATH (plus Debian's ``/usr/bin/docker``) is probed before giving up.
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from sparkbuild import console, dockerhost
from sparkbuild.errors import (
    BuildFailedError,
    DockerUnavailableError,
    UsageError,
)

if TYPE_CHECKING:
    from docker import DockerClient

BUILDX_HINT = (
    "install the buildx plugin (`apt-get install docker-buildx` on Debian 13 / Ubuntu, "
    "`docker-buildx-plugin` from Docker's apt repository), or use a docker CLI older than "
    "23.0 with BuildKit built in, e.g. Debian 12's docker.io (`sudo scripts/setup-host.sh`)"
)
# The CLI dropped its built-in BuildKit client in 23.0; older ones build with DOCKER_BUILDKIT=1.
_LAST_BUILTIN_MAJOR = 22
_FAILURE_TAIL = 15
_GIB = 1024**3
# An nvcc job for sm_121a kernels peaks at 10-12 GiB; one job per 11 GiB keeps a Spark's
# unified memory (shared with the page cache) out of the OOM killer. Override with the
# MAX_JOBS (or GIB_PER_JOB) build argument.
MEMORY_PER_JOB = 11 * _GIB


@dataclass(frozen=True)
class BuildClient:
    """A docker CLI that can run BuildKit builds, and how."""

    path: str
    kind: Literal["buildx", "builtin"]
    version: str

    def describe(self) -> str:
        how = "buildx" if self.kind == "buildx" else "built-in BuildKit"
        return f"{self.path} {self.version} ({how})"


@dataclass(frozen=True)
class BuildRequest:
    context: Path
    dockerfile: Path
    platform: str
    build_args: Mapping[str, str]
    labels: Mapping[str, str]
    tags: tuple[str, ...]
    no_cache: bool = False
    builder: str | None = None
    extra_env: Mapping[str, str] = field(default_factory=dict)
    # Registry build caches (image references): layers another machine built are reused.
    cache_from: tuple[str, ...] = ()
    cache_to: str | None = None


def docker_candidates() -> list[str]:
    """Every `docker` executable on PATH, then Debian's /usr/bin/docker, without repeats."""
    found: list[str] = []
    seen: set[str] = set()
    dirs = [*os.environ.get("PATH", "").split(os.pathsep), "/usr/bin"]
    for directory in dirs:
        candidate = os.path.join(directory, "docker") if directory else ""
        if not candidate or not os.access(candidate, os.X_OK) or os.path.isdir(candidate):
            continue
        real = os.path.realpath(candidate)
        if real not in seen:
            seen.add(real)
            found.append(candidate)
    return found


def _probe(args: list[str]) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None


def client_version(path: str) -> str | None:
    result = _probe([path, "--version"])
    if result is None or result.returncode != 0:
        return None
    match = re.search(r"version\s+v?(\d+\.\d+[\w.+~-]*)", result.stdout)
    return match.group(1) if match else None


def has_buildx(path: str) -> bool:
    result = _probe([path, "buildx", "version"])
    return result is not None and result.returncode == 0


def find_client(*, need_buildx: bool = False) -> BuildClient:
    """The first client with buildx; else the first with built-in BuildKit; else an error."""
    candidates = docker_candidates()
    versions = {path: client_version(path) for path in candidates}
    for path in candidates:
        if has_buildx(path):
            return BuildClient(path, "buildx", versions[path] or "?")
    if need_buildx:
        found = ", ".join(f"{p} {versions[p] or '?'}" for p in candidates) or "none"
        raise DockerUnavailableError(
            f"--builder needs `docker buildx`, which no docker client here has (found: {found})",
            BUILDX_HINT,
        )
    for path in candidates:
        version = versions[path]
        if version and int(version.split(".")[0]) <= _LAST_BUILTIN_MAJOR:
            return BuildClient(path, "builtin", version)
    found = ", ".join(f"{p} {versions[p] or '(no version)'}" for p in candidates) or "none"
    raise DockerUnavailableError(
        f"no docker client here can run BuildKit builds (found: {found}; clients from 23.0 "
        "on need the buildx plugin)",
        BUILDX_HINT,
    )


def daemon_max_jobs(api: DockerClient) -> int:
    """Parallel compile jobs for the local daemon's memory and cores."""
    info = dockerhost.info(api)
    return max_jobs(info.memory_bytes, info.cpus)


def max_jobs(memory_bytes: int, cpus: int) -> int:
    return max(1, min(cpus, memory_bytes // MEMORY_PER_JOB))


def build_command(client: BuildClient, request: BuildRequest, iidfile: Path) -> list[str]:
    if client.kind == "buildx":
        cmd = [client.path, "buildx", "build"]
        if request.builder:
            cmd += ["--builder", request.builder]
        cmd.append("--load")  # remote builders send the image back to the local store
    else:
        cmd = [client.path, "build"]
    cmd += ["--progress", "plain", "--platform", request.platform]
    cmd += ["--file", str(request.dockerfile), "--iidfile", str(iidfile)]
    for key, value in sorted(request.build_args.items()):
        cmd += ["--build-arg", f"{key}={value}"]
    for key, value in sorted(request.labels.items()):
        cmd += ["--label", f"{key}={value}"]
    for tag in request.tags:
        cmd += ["--tag", tag]
    if request.no_cache:
        cmd.append("--no-cache")
    cmd += cache_arguments(client, request)
    cmd.append(str(request.context))
    return cmd


_CACHE_REF = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9._:/@-]*\Z")


def check_cache_ref(reference: str, option: str) -> str:
    """A cache reference goes into `type=registry,ref=...`: no commas or `=` can slip in.
    A bad one is a usage error (exit 2), found before any work."""
    if not _CACHE_REF.match(reference):
        raise UsageError(
            f"{option} {reference!r} is not an image reference",
            f"for example {option} ghcr.io/my-org/sparkbuild-cache:{{build}}",
        )
    return reference


def cache_refs(
    cache_from: tuple[str, ...], cache_to: str | None, build_name: str
) -> tuple[tuple[str, ...], str | None]:
    """The cache references for one build (``{build}`` becomes its name), checked."""
    sources = tuple(
        check_cache_ref(ref.replace("{build}", build_name), "--cache-from") for ref in cache_from
    )
    target = (
        check_cache_ref(cache_to.replace("{build}", build_name), "--cache-to") if cache_to else None
    )
    return sources, target


def cache_arguments(client: BuildClient, request: BuildRequest) -> list[str]:
    """`--cache-from`/`--cache-to` for a registry cache (mode=max keeps every stage)."""
    args: list[str] = []
    for reference in request.cache_from:
        # A built-in BuildKit client takes plain references (inline caches) only.
        source = f"type=registry,ref={reference}" if client.kind == "buildx" else reference
        args += ["--cache-from", source]
    if request.cache_to:
        if client.kind != "buildx":
            raise DockerUnavailableError(
                "--cache-to needs `docker buildx` (a built-in BuildKit client cannot export a "
                "registry cache)",
                BUILDX_HINT,
            )
        args += ["--cache-to", f"type=registry,ref={request.cache_to},mode=max"]
    return args


def build_env(client: BuildClient, extra: Mapping[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    if client.kind == "builtin":
        env["DOCKER_BUILDKIT"] = "1"
    return env


def run_build(client: BuildClient, request: BuildRequest, *, stream: bool) -> str:
    """Run one build; stream its plain progress to stderr when ``stream``. Returns the image id."""
    with tempfile.TemporaryDirectory(prefix="sparkbuild-iid-") as tmp:
        iidfile = Path(tmp) / "iid"
        cmd = build_command(client, request, iidfile)
        tail: collections.deque[str] = collections.deque(maxlen=2000)
        process = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=build_env(client, request.extra_env),
            text=True,
            errors="replace",
            bufsize=1,
        )
        assert process.stdout is not None
        try:
            for line in process.stdout:
                tail.append(line.rstrip("\n"))
                if stream:  # build output is data: shown safe, never raw
                    console.err_stream.write(line)
                    console.err_stream.flush()
            returncode = process.wait()
        except BaseException:
            process.kill()
            process.wait()
            raise
        if returncode != 0:
            raise BuildFailedError(
                "the build failed:\n" + failure_summary(list(tail)),
                "fix the failing step (run again without --quiet to see the whole log); "
                "images.lock was not changed",
                log=list(tail),
            )
        image_id = iidfile.read_text().strip() if iidfile.exists() else ""
        if not image_id:
            raise BuildFailedError("the build finished but reported no image id", "run it again")
        return image_id


_STEP = re.compile(r"^#(\d+) ")
_STEP_ERROR = re.compile(r"^#(\d+) ERROR:?")


def failure_summary(lines: list[str]) -> str:
    """The failing step's title and last output lines, then BuildKit's own error lines."""
    failing = next((m.group(1) for m in map(_STEP_ERROR.match, reversed(lines)) if m), None)
    if failing is None:
        return _indent(lines[-25:])
    prefix = f"#{failing} "
    step_lines = [line for line in lines if line.startswith(prefix)]
    title = next((line for line in step_lines if line.startswith(prefix + "[")), "")
    output = [
        line for line in step_lines if line != title and not _NOISE.match(line.removeprefix(prefix))
    ][-_FAILURE_TAIL:]
    boxed = [line for line in _error_box(lines) if line not in output]
    if not output and not boxed:
        return _indent(lines[-25:])
    parts = [title.removeprefix(prefix)] if title else []
    parts += output + boxed + _closing_error(lines)
    return _indent(dict.fromkeys(parts))


_NOISE = re.compile(r"^(sha256:[0-9a-f]{64}|DONE |CACHED)")


def _error_box(lines: list[str]) -> list[str]:
    """The log lines BuildKit repeats between `------` markers after a failure."""
    markers = [i for i, line in enumerate(lines) if line.strip() == "------"]
    if len(markers) < 2:
        return []
    start, end = markers[-2], markers[-1]
    return [line for line in lines[start + 1 : end] if not line.startswith(" > ")][-_FAILURE_TAIL:]


def _closing_error(lines: list[str]) -> list[str]:
    """What BuildKit prints after the last `------` box: the error sentence."""
    for index in range(len(lines) - 1, -1, -1):
        if lines[index].strip() == "------":
            return [line for line in lines[index + 1 :] if line.strip()][-5:]
    return lines[-3:]


def _indent(lines: Iterable[str]) -> str:
    return "\n".join("  " + line for line in lines)


def stream_progress() -> bool:
    """Build output is streamed unless --quiet (also without a TTY: CI logs want it)."""
    return not console.is_quiet()


_SYNTAX = re.compile(rb"^#\s*syntax\s*=\s*(\S+)", re.IGNORECASE | re.MULTILINE)
_BUILDKIT_LINE = re.compile(r"^\s*Buildkit:\s*(\S+)", re.MULTILINE)


def buildkit_version(client: BuildClient, builder: str | None) -> str:
    """The BuildKit a build ran on: buildx's builder reports it; Docker's built-in BuildKit
    (before 23.0) does not, so it is named by the engine that embeds it."""
    if client.kind == "buildx":
        args = [client.path, "buildx", "inspect", *([builder] if builder else [])]
        result = _probe(args)
        match = _BUILDKIT_LINE.search(result.stdout) if result and result.returncode == 0 else None
        if match:
            return match.group(1)
    return "built into the Docker Engine"


def frontend(dockerfile: bytes) -> str:
    """The Dockerfile frontend: a ``# syntax=`` image, else the builder's built-in one."""
    found = _SYNTAX.search(dockerfile.split(b"\n\n", 1)[0])
    return found.group(1).decode(errors="replace") if found else "dockerfile.v0 (built in)"


def builder_facts(
    client: BuildClient, engine_version: str, builder: str | None, dockerfile: bytes
) -> dict[str, str]:
    """What built an image, as the lock and the provenance record it."""
    return {
        "client": client.describe(),
        "engine": engine_version,
        "buildkit": buildkit_version(client, builder),
        "frontend": frontend(dockerfile),
    }
