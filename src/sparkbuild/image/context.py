"""Build contexts: what BuildKit sees for an overlay or a source build.

Dockerfile templates ship with sparkbuild (``sparkbuild/data/docker/``). A project may
override one by placing a file of the same name in ``builds/docker/``; a build's
``dockerfile:`` field (relative to the project) overrides both.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from importlib import resources
from pathlib import Path, PurePosixPath

from sparkbuild.errors import BrokenInstallError, OverlayScopeError, SpecError
from sparkbuild.settings import Settings
from sparkbuild.source import ChangedFile, PreparedSource, scope
from sparkbuild.spec import Build

OVERLAY_TEMPLATE = "overlay.Dockerfile"
OVERLAY_HELPER = "apply_overlay.py"
# Sources an overlay cannot compile, even inside the package directory.
COMPILED_SUFFIXES = (".c", ".cc", ".cpp", ".cxx", ".cu", ".cuh", ".h", ".hpp", ".pyx", ".pxd")


@dataclass(frozen=True)
class Dockerfile:
    path: Path
    origin: str  # "spec", "project" or "sparkbuild" (the packaged template)

    def read(self) -> bytes:
        return self.path.read_bytes()


def template_name(build: Build) -> str:
    if build.image.mode == "overlay":
        return OVERLAY_TEMPLATE
    return f"{build.engine}-source.Dockerfile"


def packaged(name: str) -> Path:
    path = Path(str(resources.files("sparkbuild") / "data" / "docker" / name))
    if not path.is_file():
        raise BrokenInstallError(
            f"sparkbuild's template {name} is missing from its install",
            "reinstall sparkbuild (`pip install -e .`)",
        )
    return path


def find_dockerfile(build: Build, settings: Settings) -> Dockerfile:
    if build.image.dockerfile:
        path = (settings.project_dir / build.image.dockerfile).resolve()
        if not path.is_file():
            raise SpecError(
                f"{build.spec_file}: builds.{build.name}.dockerfile: no such file {path}",
                "the path is relative to the project directory",
            )
        return Dockerfile(path, "spec")
    name = template_name(build)
    project = settings.builds_dir / "docker" / name
    if project.is_file():
        return Dockerfile(project, "project")
    return Dockerfile(packaged(name), "sparkbuild")


def package_relative(build: Build, path: str) -> str | None:
    """``path`` relative to the package directory, or None when it lies outside it."""
    return scope.package_relative(build.package_dir, path)


def overlay_changes(prepared: PreparedSource) -> list[ChangedFile]:
    """The changes an overlay carries (tests and docs outside the package are left out);
    refuses, naming them, any it cannot carry."""
    build = prepared.build
    paths = [c.path for c in prepared.changed]
    outside = scope.refused(build.package_dir, paths)
    inside = [c for c in prepared.changed if package_relative(build, c.path) is not None]
    compiled = [c.path for c in inside if c.path.endswith(COMPILED_SUFFIXES) and c.status != "D"]
    if outside or compiled:
        listed = "\n  ".join(sorted(outside) + sorted(compiled))
        reason = (
            f"outside the package directory '{build.package_dir}'"
            if outside
            else "compiled sources"
        )
        if outside and compiled:
            reason = f"outside '{build.package_dir}' or compiled sources"
        raise OverlayScopeError(
            f"{build.name}: overlay mode can only replace Python package files, but its PRs and "
            f"patches change files {reason}:\n  {listed}",
            f"set `mode: source` for build '{build.name}' in {build.spec_file.name} to build from "
            "the patched source tree (tests and docs outside the package are left out by "
            "themselves)",
        )
    return inside


def package_name(build: Build) -> str:
    return PurePosixPath(build.package_dir).name


def write_overlay_context(
    prepared: PreparedSource, dest: Path, install_dir: str | None
) -> dict[str, object]:
    """Fill ``dest`` with files/, manifest.json and the helper; return the manifest."""
    build = prepared.build
    changes = overlay_changes(prepared)
    written = sorted(c.path for c in changes if c.status != "D")
    deleted = sorted(c.path for c in changes if c.status == "D")
    staging = dest / "tree"
    prepared.export(staging, written)
    files_dir = dest / "files"
    for path in written:
        relative = package_relative(build, path)
        assert relative is not None
        target = files_dir / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(staging / path, target)
    shutil.rmtree(staging, ignore_errors=True)
    files_dir.mkdir(parents=True, exist_ok=True)
    manifest: dict[str, object] = {
        "package": package_name(build),
        "install_dir": install_dir,
        "files": [package_relative(build, p) for p in written],
        "deleted": [package_relative(build, p) for p in deleted],
    }
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    shutil.copyfile(packaged(OVERLAY_HELPER), dest / OVERLAY_HELPER)
    return manifest


def write_source_context(prepared: PreparedSource, dest: Path) -> None:
    """The whole patched tree, as upstream's own Dockerfiles expect their context."""
    prepared.export(dest)
