"""Real Docker pieces for tests: a loopback registry, arm64 Debian bases, the engine itself.

Nothing here is mocked. A test that needs Docker, emulation or the registry binary fails with
the command that provides it (`sudo scripts/setup-host.sh`) instead of skipping.

- `start_registry()` runs `docker-registry serve` (distribution 2.8) on 127.0.0.1 with its own
  config and filesystem storage, optionally behind htpasswd auth (for the publish stage).
- `debian_arm64_rootfs()` makes an arm64 Debian bookworm root filesystem with debootstrap
  (about 100 s under emulation) and caches it as a tarball in the shared test cache.
- `push_arm64_base()` imports such a tarball (plus extra files, e.g. an installed package)
  as a linux/arm64 image and pushes it to a registry, because BuildKit resolves `FROM`
  through a registry when a platform is given.
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
import secrets
import shutil
import socket
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import docker
import requests
from filelock import FileLock

from sparkbuild.image import builder
from tests.support.cache import shared_test_cache

SETUP_HINT = "run `sudo scripts/setup-host.sh` (installs and starts Docker, qemu, registry)"
BOOKWORM_PYTHON_SITE = "/usr/local/lib/python3.11/dist-packages"
_ROOTFS_LAYOUT = "1"


class MissingPrerequisiteError(AssertionError):
    """A host prerequisite is missing: the test fails (not skips) and says how to get it."""


def require_command(name: str) -> str:
    found = shutil.which(name) or next(
        (p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if os.access(p, os.X_OK)), None
    )
    if found is None:
        raise MissingPrerequisiteError(f"`{name}` is not installed; {SETUP_HINT}")
    return found


def docker_client() -> docker.DockerClient:
    """A docker SDK client for a daemon that answers, or a failure saying how to start one."""
    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except Exception as exc:
        raise MissingPrerequisiteError(f"no Docker daemon answers ({exc}); {SETUP_HINT}") from exc
    return client


def docker_cli() -> str:
    """A docker client that talks to this daemon (any version; builds go through sparkbuild)."""
    for candidate in ("/usr/bin/docker", shutil.which("docker")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise MissingPrerequisiteError(f"no docker client installed; {SETUP_HINT}")


def require_arm64_emulation() -> None:
    """linux/arm64 containers must run here: natively, or through qemu-aarch64 in binfmt_misc."""
    if platform.machine() in ("aarch64", "arm64"):
        return
    entry = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64")
    if not entry.exists() or not entry.read_text().startswith("enabled"):
        raise MissingPrerequisiteError(f"linux/arm64 emulation is not enabled; {SETUP_HINT}")


def run(cmd: list[str], *, input_bytes: bytes | None = None, timeout: float = 900) -> str:
    result = subprocess.run(
        cmd, input=input_bytes, capture_output=True, timeout=timeout, check=False
    )
    if result.returncode != 0:
        out = (result.stdout + result.stderr).decode(errors="replace")
        raise AssertionError(f"{' '.join(cmd)} failed ({result.returncode}):\n{out[-4000:]}")
    return result.stdout.decode(errors="replace")


# --- registry -----------------------------------------------------------------------------


@dataclass
class LocalRegistry:
    """A running `docker-registry serve` on loopback. `address` is `127.0.0.1:PORT`."""

    address: str
    root: Path
    process: subprocess.Popen[bytes]
    log_path: Path
    username: str | None = None
    password: str | None = None

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    @property
    def auth(self) -> tuple[str, str] | None:
        if self.username is None or self.password is None:
            return None
        return (self.username, self.password)

    def ref(self, repository: str, tag: str = "latest") -> str:
        return f"{self.address}/{repository}:{tag}"

    def manifest_digest(self, repository: str, reference: str) -> str | None:
        """The digest the registry serves for `repository:reference`, or None when absent."""
        accept = ", ".join(
            [
                "application/vnd.oci.image.index.v1+json",
                "application/vnd.docker.distribution.manifest.list.v2+json",
                "application/vnd.oci.image.manifest.v1+json",
                "application/vnd.docker.distribution.manifest.v2+json",
            ]
        )
        response = requests.head(
            f"{self.url}/v2/{repository}/manifests/{reference}",
            headers={"Accept": accept},
            auth=self.auth,
            timeout=30,
        )
        if response.status_code == 404:
            return None
        response.raise_for_status()
        return response.headers.get("Docker-Content-Digest")

    def log_tail(self, lines: int = 30) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _htpasswd(path: Path, username: str, password: str) -> None:
    htpasswd = require_command("htpasswd")
    run([htpasswd, "-B", "-b", "-c", str(path), username, password])


def _registry_config(root: Path, port: int, htpasswd_file: Path | None) -> str:
    lines = [
        "version: 0.1",
        "log:",
        "  level: info",
        "storage:",
        "  filesystem:",
        f"    rootdirectory: {root / 'data'}",
        "  delete:",
        "    enabled: true",
        "http:",
        f"  addr: 127.0.0.1:{port}",
        "  headers:",
        "    X-Content-Type-Options: [nosniff]",
    ]
    if htpasswd_file is not None:
        lines += [
            "auth:",
            "  htpasswd:",
            "    realm: sparkbuild-tests",
            f"    path: {htpasswd_file}",
        ]
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def start_registry(root: Path, *, auth: bool = False) -> Iterator[LocalRegistry]:
    """A registry serving from `root` on a free loopback port; stopped on exit.

    With `auth=True` it requires basic auth (bcrypt htpasswd, as the Debian package sets up)
    for a random user and password, available as `registry.username` / `.password`.
    """
    registry = serve_registry(root, auth=auth)
    try:
        yield registry
    finally:
        registry.stop()


def serve_registry(root: Path, *, auth: bool = False) -> LocalRegistry:
    """:func:`start_registry`'s registry, left running: the caller stops it."""
    binary = require_command("docker-registry")
    root.mkdir(parents=True, exist_ok=True)
    username = password = None
    htpasswd_file = None
    if auth:
        username, password = "sparkbuild", secrets.token_hex(12)
        htpasswd_file = root / "htpasswd"
        _htpasswd(htpasswd_file, username, password)
    for _attempt in range(3):  # another process may grab the free port before we bind it
        port = _free_port()
        config = root / "config.yml"
        config.write_text(_registry_config(root, port, htpasswd_file))
        log_path = root / "registry.log"
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                [binary, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT
            )
        registry = LocalRegistry(f"127.0.0.1:{port}", root, process, log_path, username, password)
        if _wait_until_serving(registry):
            return registry
        registry.stop()
    raise AssertionError(f"docker-registry did not start:\n{registry.log_tail()}")


def _wait_until_serving(registry: LocalRegistry, timeout: float = 20) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if registry.process.poll() is not None:
            return False
        try:
            status = requests.get(f"{registry.url}/v2/", timeout=2).status_code
            if status in (200, 401):
                return True
        except requests.ConnectionError:
            pass
        time.sleep(0.2)
    return False


def docker_login(registry: LocalRegistry, config_dir: Path) -> dict[str, str]:
    """Log the docker CLI into an auth registry with a private config dir.

    Returns the environment (DOCKER_CONFIG) under which the credentials apply.
    """
    if registry.auth is None:
        raise ValueError("this registry has no auth")
    config_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "DOCKER_CONFIG": str(config_dir)}
    result = subprocess.run(
        [docker_cli(), "login", registry.address, "-u", registry.auth[0], "--password-stdin"],
        input=registry.auth[1].encode(),
        capture_output=True,
        env=env,
        check=False,
    )
    if result.returncode != 0:
        raise AssertionError(f"docker login failed: {result.stderr.decode(errors='replace')}")
    return env


# --- arm64 Debian base images ---------------------------------------------------------------


def debian_mirror() -> str:
    """The Debian mirror this machine's apt uses (deb822 .sources or one-line .list files)."""
    candidates = sorted(Path("/etc/apt/sources.list.d").glob("*.sources"))
    candidates += sorted(Path("/etc/apt/sources.list.d").glob("*.list"))
    candidates.append(Path("/etc/apt/sources.list"))
    for path in candidates:
        if not path.is_file():
            continue
        text = path.read_text(errors="replace")
        for uri in re.findall(r"^URIs:\s*(\S+)", text, flags=re.MULTILINE):
            if "security" not in uri:
                return str(uri)
        for uri in re.findall(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)", text, flags=re.MULTILINE):
            if "security" not in uri:
                return str(uri)
    return "http://deb.debian.org/debian"


# The Debian with build tools that every image test needing a compiler or pip shares: one
# debootstrap per machine and architecture (an arm64 one runs under emulation, minutes).
BUILD_ROOTFS = ("cmake", "g++", "make", "python3", "python3-dev", "python3-pip", "unzip")


def debian_arm64_rootfs(
    packages: tuple[str, ...] = ("python3",),
    arch: str = "arm64",
    *,
    suite: str = "bookworm",
    mirror: str | None = None,
) -> Path:
    """A cached tarball of `debootstrap --arch=ARCH --variant=minbase SUITE` (arm64 bookworm
    unless `arch` or `suite` say otherwise, e.g. amd64 for native builds on this host).

    `packages` go to `--include`; each distinct list has its own cached tarball. `mirror`
    defaults to the one this machine's apt uses.
    """
    if arch == "arm64":
        require_arm64_emulation()
    debootstrap = require_command("debootstrap")
    cache = shared_test_cache() / "rootfs"
    cache.mkdir(parents=True, exist_ok=True)
    name = "-".join(sorted(packages)).replace("+", "p")
    tarball = cache / f"debian-{suite}-{arch}-{name}-v{_ROOTFS_LAYOUT}.tar"
    if tarball.exists():
        return tarball
    with FileLock(str(tarball) + ".lock"):
        if tarball.exists():
            return tarball
        with tempfile.TemporaryDirectory(dir=cache, prefix=".debootstrap-") as tmp:
            target = Path(tmp) / "root"
            include = ",".join(sorted(packages))
            cmd = [debootstrap, f"--arch={arch}", "--variant=minbase", f"--include={include}"]
            try:
                run([*cmd, suite, str(target), mirror or debian_mirror()], timeout=1800)
            finally:
                _unmount_under(target)
            partial = Path(tmp) / "rootfs.tar"
            # Drop apt lists and caches: they are large and no test needs them.
            for junk in ("var/lib/apt/lists", "var/cache/apt"):
                shutil.rmtree(target / junk, ignore_errors=True)
            run(["tar", "-C", str(target), "--numeric-owner", "-cf", str(partial), "."])
            os.replace(partial, tarball)
    return tarball


def _unmount_under(root: Path) -> None:
    """Unmount what a killed or failed debootstrap left mounted (its chroot's /proc): the
    temporary directory cannot be removed past a mount, and it is left in the cache."""
    prefix = str(root.resolve()) + "/"
    mounts = Path("/proc/self/mounts").read_text().splitlines()
    points = [line.split()[1] for line in mounts if line.split()[1].startswith(prefix)]
    for point in sorted(points, reverse=True):
        subprocess.run(["umount", "--lazy", point], check=False, capture_output=True)


def _tar_with_extras(rootfs: Path, extras: Mapping[str, Path], dest: Path) -> None:
    """Copy the root filesystem tarball and add directories at the given image paths.

    docker import rejects duplicate paths, so entries the root filesystem already has
    (parent directories such as dist-packages) are not added again.
    """
    shutil.copyfile(rootfs, dest)
    with tarfile.open(dest, "a") as archive:
        present = {name.removeprefix("./").rstrip("/") for name in archive.getnames()}
        for image_path, source in extras.items():
            base = image_path.strip("/")
            for path in sorted([source, *source.rglob("*")]):
                relative = path.relative_to(source).as_posix()
                name = base if relative == "." else f"{base}/{relative}"
                parts = name.split("/")
                for depth in range(1, len(parts)):
                    parent = "/".join(parts[:depth])
                    if parent not in present:
                        present.add(parent)
                        info = tarfile.TarInfo("./" + parent)
                        info.type, info.mode = tarfile.DIRTYPE, 0o755
                        archive.addfile(info)
                if name not in present:
                    present.add(name)
                    archive.add(path, arcname="./" + name, recursive=False)


def push_arm64_base(  # noqa: PLR0913 - a test image's build options, each with a default
    registry: LocalRegistry,
    repository: str,
    *,
    packages: tuple[str, ...] = ("python3",),
    extras: Mapping[str, Path] | None = None,
    tag: str = "latest",
    work_dir: Path,
    setup: str = "",
    context_files: Mapping[str, Path] | None = None,
    arch: str = "arm64",
) -> str:
    """Import a linux/arm64 Debian image (plus `extras`: image path -> local dir) and push it.

    `setup` is more Dockerfile text after the root filesystem (e.g. `RUN useradd ...` and a
    `USER`), with `context_files` (name -> local file or dir) beside it in the context.
    `arch` picks another Debian architecture (amd64 builds natively here).
    Returns the pushed reference `127.0.0.1:PORT/repository:tag`.
    """
    rootfs = debian_arm64_rootfs(packages, arch)
    ref = registry.ref(repository, tag)
    cli = docker_cli()
    context = Path(tempfile.mkdtemp(dir=work_dir, prefix="base-context-"))
    try:
        if extras:
            _tar_with_extras(rootfs, extras, context / "rootfs.tar")
        else:
            _link_or_copy(rootfs, context / "rootfs.tar")
        for name, source in (context_files or {}).items():
            if source.is_dir():
                shutil.copytree(source, context / name)
            else:
                shutil.copyfile(source, context / name)
        (context / "Dockerfile").write_text(_BASE_DOCKERFILE + setup)
        # `docker import --platform` leaves the config saying amd64 on dockerd 20.10; a
        # BuildKit build FROM scratch records the platform properly.
        buildkit = builder.find_client()
        build = ["buildx", "build", "--load"] if buildkit.kind == "buildx" else ["build"]
        result = subprocess.run(
            [buildkit.path, *build, "--platform", f"linux/{arch}", "--tag", ref, str(context)],
            env={**os.environ, "DOCKER_BUILDKIT": "1"},
            capture_output=True,
            check=False,
        )
    finally:
        shutil.rmtree(context, ignore_errors=True)
    if result.returncode != 0:
        raise AssertionError(f"base image build failed: {result.stderr.decode(errors='replace')}")
    run([cli, "push", ref])
    return ref


_BASE_DOCKERFILE = """\
FROM scratch
ADD rootfs.tar /
ENV LANG=C.UTF-8
CMD ["python3"]
"""


def _link_or_copy(source: Path, dest: Path) -> None:
    try:
        os.link(source, dest)
    except OSError:
        shutil.copyfile(source, dest)


def remove_images(client: docker.DockerClient, references: list[str]) -> None:
    """Remove images by reference or id, ignoring ones already gone."""
    for reference in references:
        with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
            client.images.remove(reference, force=True)


def python_in_image(image: str, code: str, *, platform: str = "linux/arm64") -> str:
    """``python3 -c CODE`` in a throwaway container of ``image`` (under emulation for a
    foreign ``platform``); its stdout. A failure is an AssertionError showing stderr."""
    run = subprocess.run(
        [docker_cli(), "run", "--rm", "--platform", platform, image, "python3", "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    return run.stdout
