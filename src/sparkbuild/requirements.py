"""Extra Python packages for an image: resolve, pin by sha256, check against the release.

A spec's ``requirements:`` (file level and per build, each with a ``when`` range like a
patch) name PEP 508 requirements such as ``transformers==5.8.1``. For each build:

* **resolve**: ``pip download --no-deps --only-binary=:all:`` for the image's platform
  (linux/aarch64 manylinux) and the base image's Python, so the pinned file is the one the
  image installs; its sha256 is computed from the downloaded file. Wheels only: a
  requirement that needs compiling fails here, with a hint to use a source build.
* **conflicts**: the engine release's own pins come from ``python/pyproject.toml`` in the
  resolved tree (``pyproject.toml`` at the package's parent), else from the release
  wheel's METADATA (checked against the package index's sha256 before it is read). A
  requirement whose version the release pins differently, or a pinned wheel whose own
  dependencies the release pins differently, is a conflict naming both; ``override: true``
  on the requirement says the replacement is intended.
* **lock**: ``builds.<name>.requirements`` in images.lock holds name, version, file and
  sha256 per wheel; ``--locked`` installs exactly those, and a cached wheel whose hash
  differs is refused.
* **image**: the wheels go into the build context and one extra layer installs them with
  the base image's own Python (``--no-index --no-deps --require-hashes``): containers cannot
  reach PyPI, and the hashes pin the exact files.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement
from packaging.requirements import Requirement as PEP508Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from sparkbuild import cachetrust, git, lockfile, wheelindex
from sparkbuild.errors import LockError, RequirementError, SpecError
from sparkbuild.jsontext import JsonObject
from sparkbuild.settings import Settings
from sparkbuild.source import PreparedSource
from sparkbuild.spec import Build, Requirement

CONTEXT_DIR = "sparkbuild-requirements"
_PLATFORMS = ("manylinux2014_aarch64", "manylinux_2_28_aarch64", "manylinux_2_34_aarch64")
_RELEASE_PLATFORMS = ("manylinux_2_34_aarch64", "manylinux2014_aarch64")


@dataclass(frozen=True)
class Conflict:
    """Our requirement (or a pinned wheel's dependency) against the release's own pin."""

    ours: str
    theirs: str
    source: str  # where the release's pin was read
    overridden: bool

    def describe(self, build: Build) -> str:
        verb = "overrides" if self.overridden else "conflicts with"
        return (
            f"{build.name}: requirement '{self.ours}' {verb} {build.engine} "
            f"{build.version}'s own '{self.theirs}' ({self.source})"
        )


def target_environment(python: str) -> dict[str, str]:
    """PEP 508 marker values for the image: Linux, aarch64, CPython ``python``."""
    env = {k: str(v) for k, v in default_environment().items()}
    env.update(
        {
            "sys_platform": "linux",
            "platform_system": "Linux",
            "platform_machine": "aarch64",
            "os_name": "posix",
            "implementation_name": "cpython",
            "platform_python_implementation": "CPython",
            "python_version": python,
            "python_full_version": f"{python}.0",
        }
    )
    return env


def pins_from_lines(lines: list[str], python: str) -> dict[str, PEP508Requirement]:
    """Requirements by normalized name, those whose markers hold for the image (no extras)."""
    env = target_environment(python)
    pins: dict[str, PEP508Requirement] = {}
    for line in lines:
        try:
            req = PEP508Requirement(line)
        except InvalidRequirement:
            continue
        if req.marker is not None and not req.marker.evaluate(env | {"extra": ""}):
            continue
        pins[canonicalize_name(req.name)] = req
    return pins


def pins_from_pyproject(text: str, python: str) -> dict[str, PEP508Requirement]:
    data = tomllib.loads(text)
    return pins_from_lines(list(data.get("project", {}).get("dependencies", [])), python)


def pins_from_metadata(text: str, python: str) -> dict[str, PEP508Requirement]:
    lines = [
        line.split(":", 1)[1].strip()
        for line in text.splitlines()
        if line.startswith("Requires-Dist:")
    ]
    return pins_from_lines(lines, python)


def wheel_metadata(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return archive.read(name).decode()


def _pip_download(args: list[str], dest: Path, what: str) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    cmd += ["--disable-pip-version-check", "--quiet", "-d", str(dest), *args]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wheels = sorted(dest.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise RequirementError(
            f"cannot download a wheel for {what}: " + (" ".join(tail) or "pip found none"),
            "a requirement that needs compiling goes into a `mode: source` build; check the "
            "name and version on PyPI",
        )
    return wheels[0]


def release_wheel(build: Build, settings: Settings) -> Path:
    """The engine release's own wheel (for its METADATA): checked against the package
    index's sha256 before it is read, cached while its bytes still are the index's
    (``wheelindex``); any other wheel of that name in the cache is never read."""
    args = [f"--platform={p}" for p in _RELEASE_PLATFORMS] + ["--implementation=cp"]
    version = str(build.version)
    got = wheelindex.release(settings.cache_dir, build.engine, version, args, "release")
    if isinstance(got, str):
        raise RequirementError(
            f"{build.name}: cannot download the {build.engine} {build.version} wheel for the "
            f"release's own pins: {got}",
            "check the network and the version on the package index, then run again",
        )
    return got


def release_pins(
    build: Build, settings: Settings, pyproject: str | None
) -> tuple[dict[str, PEP508Requirement], str]:
    """The release's own requirements and where they were read."""
    if pyproject is not None:
        return pins_from_pyproject(pyproject, build.image.python), "python/pyproject.toml"
    wheel = release_wheel(build, settings)
    return pins_from_metadata(wheel_metadata(wheel), build.image.python), f"{wheel.name} METADATA"


def _conflict(version: str, theirs: PEP508Requirement) -> bool:
    return bool(str(theirs.specifier)) and not theirs.specifier.contains(
        Version(version), prereleases=True
    )


def spec_conflicts(build: Build, pins: dict[str, PEP508Requirement], source: str) -> list[Conflict]:
    """Conflicts visible without resolving: the release pins ``==X`` outside our range."""
    found = []
    for requirement in build.active_requirements():
        theirs = pins.get(requirement.name)
        if theirs is None:
            continue
        exact = [s.version for s in theirs.specifier if s.operator in ("==", "===")]
        ours = requirement.parsed().specifier
        if exact and not any(ours.contains(v, prereleases=True) for v in exact):
            found.append(Conflict(requirement.req, str(theirs), source, requirement.override))
    return found


def wheel_conflicts(
    build: Build,
    pinned: list[lockfile.LockedWheel],
    wheels: dict[str, Path],
    pins: dict[str, PEP508Requirement],
    source: str,
) -> list[Conflict]:
    """Resolved versions and the wheels' own dependencies against the release's pins."""
    overrides = {r.name for r in build.active_requirements() if r.override}
    ours = {p.name for p in pinned}
    found = []
    for pin in pinned:
        theirs = pins.get(pin.name)
        if theirs is not None and _conflict(pin.version, theirs):
            found.append(Conflict(pin.requirement, str(theirs), source, pin.name in overrides))
        needs = pins_from_metadata(wheel_metadata(wheels[pin.name]), build.image.python)
        for name, need in needs.items():
            release = pins.get(name)
            if name in ours or release is None:
                continue
            exact = [s.version for s in release.specifier if s.operator in ("==", "===")]
            if exact and not any(need.specifier.contains(v, prereleases=True) for v in exact):
                found.append(
                    Conflict(f"{pin.name} {pin.version} needs {need}", str(release), source, False)
                )
    return found


def raise_on_conflicts(build: Build, conflicts: list[Conflict]) -> None:
    blocking = [c for c in conflicts if not c.overridden]
    if blocking:
        listed = "\n  ".join(c.describe(build) for c in blocking)
        raise SpecError(
            f"{build.spec_file}: builds.{build.name}.requirements:\n  {listed}",
            "pick a version the release allows, or add `override: true` to the requirement "
            "to replace the release's pin on purpose",
        )


def wheel_cache(settings: Settings) -> Path:
    """The cache's private ``wheels/`` (``cachetrust``: the user's own, written by no one
    else): what is pinned is hashed there, and copied from there into the image."""
    return cachetrust.private_dir(settings.cache_dir / "wheels", "the wheel cache")


def resolve_one(
    requirement: Requirement, build: Build, settings: Settings
) -> tuple[lockfile.LockedWheel, Path]:
    """The newest wheel for the image that satisfies ``requirement``, downloaded and hashed."""
    python = build.image.python
    cache = wheel_cache(settings)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".dl-") as tmp:
        args = [f"--platform={p}" for p in _PLATFORMS]
        args += [f"--python-version={python}", "--implementation=cp", requirement.req]
        wheel = _pip_download(
            args, Path(tmp), f"'{requirement.req}' (linux/aarch64, Python {python})"
        )
        name, version, _, _ = parse_wheel_filename(wheel.name)
        if not requirement.parsed().specifier.contains(version, prereleases=True):
            raise RequirementError(f"pip returned {wheel.name} for '{requirement.req}'")
        target = cache / wheel.name
        os.replace(wheel, target)
    pinned = lockfile.LockedWheel(
        requirement=requirement.req,
        name=str(name),
        version=str(version),
        filename=target.name,
        sha256=cachetrust.sha256_of(target),
    )
    return pinned, target


def locked_wheel(pin: lockfile.LockedWheel, settings: Settings) -> Path:
    """The exact file images.lock pins: from the cache, else downloaded; hash verified."""
    path = wheel_cache(settings) / pin.filename
    if path.is_symlink():  # never read through: fetched again in its place
        path.unlink()
    if not path.is_file():
        with tempfile.TemporaryDirectory(dir=path.parent, prefix=".dl-") as tmp:
            name, version, _, tags = parse_wheel_filename(pin.filename)
            tag = next(iter(tags))
            args = [f"--platform={tag.platform}", f"--implementation={tag.interpreter[:2]}"]
            args = [] if tag.platform == "any" else args
            got = _pip_download([*args, f"{name}=={version}"], Path(tmp), pin.filename)
            os.replace(got, path)
    actual = cachetrust.sha256_of(path)
    if actual != pin.sha256:
        raise LockError(
            f"{pin.filename}: sha256 {actual} does not match images.lock ({pin.sha256})",
            "delete the cached file and run again; if PyPI's file changed, "
            "re-run `sparkbuild lock`",
        )
    return path


def resolve(build: Build, settings: Settings) -> tuple[list[lockfile.LockedWheel], dict[str, Path]]:
    pinned: list[lockfile.LockedWheel] = []
    wheels: dict[str, Path] = {}
    for requirement in build.active_requirements():
        pin, path = resolve_one(requirement, build, settings)
        pinned.append(pin)
        wheels[pin.name] = path
    return pinned, wheels


def locked_pins(entry: lockfile.BuildEntry | None) -> list[lockfile.LockedWheel] | None:
    """The requirement pins of a lock entry (None when the entry has no such section)."""
    if entry is None or entry.requirements is None:
        return None
    return list(entry.requirements)


_SAFE_FILENAME = re.compile(lockfile.WHEEL_FILENAME)  # checked on read too; again before use


def write_context(dest: Path, pins: list[lockfile.LockedWheel], wheels: list[Path]) -> None:
    """``dest/sparkbuild-requirements/``: the wheels and a hash-pinned requirements file."""
    folder = dest / CONTEXT_DIR
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for pin, wheel in zip(pins, wheels, strict=True):
        if not _SAFE_FILENAME.match(pin.filename):
            raise LockError(f"images.lock: unsafe wheel file name {pin.filename!r}")
        shutil.copyfile(wheel, folder / pin.filename)
        lines.append(f"{pin.name}=={pin.version} --hash=sha256:{pin.sha256}")
    (folder / "requirements.txt").write_text("\n".join(lines) + "\n")


LAYER = """
# sparkbuild requirements: one extra layer with the wheels images.lock pins (by sha256),
# installed by the base image's own Python from the build context (no index, no deps).
# PIP_BREAK_SYSTEM_PACKAGES: base images install the engine into the system Python, which
# Debian/Ubuntu mark externally managed (PEP 668); older pips ignore the variable.
# Installed as root (the engine's site-packages belong to root), then the image runs as the
# base's own user again, as the overlay step leaves it.
ARG SPARKBUILD_PYTHON=python3
ARG SPARKBUILD_BASE_USER=
USER root
RUN --mount=type=bind,target=/tmp/sparkbuild-context \\
    PIP_BREAK_SYSTEM_PACKAGES=1 "${SPARKBUILD_PYTHON}" -m pip install \\
    --no-index --no-deps --require-hashes --no-cache-dir \\
    --find-links /tmp/sparkbuild-context/sparkbuild-requirements \\
    -r /tmp/sparkbuild-context/sparkbuild-requirements/requirements.txt
USER ${SPARKBUILD_BASE_USER:-root}
"""


def dockerfile_with_layer(template: bytes) -> bytes:
    """The Dockerfile with the requirements layer after everything else (its last stage)."""
    text = template.decode()
    return (text.rstrip("\n") + "\n" + LAYER).encode()


def tree_pyproject(prepared: PreparedSource) -> str | None:
    """``pyproject.toml`` beside the package directory in the patched tree, if there is one."""
    parent = PurePosixPath(prepared.build.package_dir).parent
    path = "pyproject.toml" if str(parent) == "." else f"{parent}/pyproject.toml"
    result = git.run(["show", f"{prepared.tree}:{path}"], git_dir=prepared.mirror, check=False)
    return result.stdout.decode() if result.returncode == 0 else None


@dataclass(frozen=True)
class RequirementReport:
    """What `patches`/`lock` say about one build's requirements."""

    build: Build
    source: str  # where the release's pins were read
    conflicts: tuple[Conflict, ...]
    pinned: tuple[lockfile.LockedWheel, ...] = ()

    @property
    def ok(self) -> bool:
        return not any(not c.overridden for c in self.conflicts)

    def to_json(self) -> JsonObject:
        return {
            "requirements": [r.req for r in self.build.active_requirements()],
            "release_pins_from": self.source,
            "conflicts": [{**asdict(c), "message": c.describe(self.build)} for c in self.conflicts],
            "pinned": [p.to_json() for p in self.pinned],
        }


def check(prepared: PreparedSource, settings: Settings) -> RequirementReport | None:
    """`patches` time: the build's requirements against the release's own pins (no resolve)."""
    build = prepared.build
    if not build.active_requirements():
        return None
    pins, source = release_pins(build, settings, tree_pyproject(prepared))
    return RequirementReport(build, source, tuple(spec_conflicts(build, pins, source)))


def lock_requirements(prepared: PreparedSource, settings: Settings) -> RequirementReport | None:
    """`lock` time: resolve, hash, check every conflict; raise on one not overridden."""
    build = prepared.build
    if not build.active_requirements():
        return None
    pins, source = release_pins(build, settings, tree_pyproject(prepared))
    pinned, wheels = resolve(build, settings)
    conflicts = spec_conflicts(build, pins, source)
    seen = {(c.ours, c.theirs) for c in conflicts}
    conflicts += [
        c
        for c in wheel_conflicts(build, pinned, wheels, pins, source)
        if (c.ours, c.theirs) not in seen
    ]
    raise_on_conflicts(build, conflicts)
    return RequirementReport(build, source, tuple(conflicts), tuple(pinned))


def record(report: RequirementReport, lock: lockfile.LockHandle) -> None:
    """Queue ``builds.<build>.requirements`` in ``lock`` (written with the build's entry)."""
    wheels = list(report.pinned)
    lock.set_section(report.build.name, wheels)


def image_wheels(
    build: Build, settings: Settings, entry: lockfile.BuildEntry | None, *, locked: bool
) -> tuple[list[lockfile.LockedWheel], list[Path]]:
    """The pins and files an image of ``build`` installs: the lock's, else resolved now.

    With ``locked`` the lock must pin exactly the build's active requirements.
    """
    wanted = [r.req for r in build.active_requirements()]
    if not wanted:
        return [], []
    pins = locked_pins(entry)
    if pins is not None and [p.requirement for p in pins] == wanted:
        return pins, [locked_wheel(p, settings) for p in pins]
    if locked:
        raise LockError(
            f"{build.name}: images.lock does not pin its requirements ({', '.join(wanted)})",
            f"run `sparkbuild lock {build.name}` and commit images.lock",
        )
    pinned, wheels = resolve(build, settings)
    return pinned, [wheels[p.name] for p in pinned]


def lapsed_pins(build: Build, pyproject: str | None) -> list[str]:
    """The packages :meth:`Build.lapsed_requirements` names that the release still requires
    (its ``python/pyproject.toml``; all of them when the tree has none to tell)."""
    lapsed = build.lapsed_requirements()
    if pyproject is None or not lapsed:
        return lapsed
    required = pins_from_pyproject(pyproject, build.image.python)
    return [name for name in lapsed if name in required]
