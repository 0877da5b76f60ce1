"""Helpers for image-stage tests: a project directory with a spec, patches made with git,
the real `sparkbuild` CLI run on it, and the overlay tests' base image of a real release."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sparkbuild import source
from sparkbuild.image import ImageJob, ImageResult, build_image
from sparkbuild.settings import Settings
from sparkbuild.spec import Build
from tests.support.cache import shared_test_cache
from tests.support.cli import CliResult, run_cli
from tests.support.docker_env import (
    BOOKWORM_PYTHON_SITE,
    LocalRegistry,
    docker_client,
    push_arm64_base,
    remove_images,
    start_registry,
)
from tests.support.gitrepos import Edit, make_patch
from tests.support.sglang_releases import extract_wheel_package, sglang_release_repo


def make_patch_file(repo: Path | str, ref: str, edits: Mapping[str, Edit], dest: Path) -> Path:
    """:func:`tests.support.gitrepos.make_patch` written to ``dest`` (specs name patch files)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(make_patch(repo, ref, edits))
    return dest


def prepare_and_build(build: Build, settings: Settings) -> ImageResult:
    """The source stage, then the image stage, as `sparkbuild build` runs them."""
    job = ImageJob.start(build, settings)
    return build_image(source.prepare_source(build, settings, lock=job.lock.lock), job)


def write_spec(project: Path, engine: str, spec: dict[str, Any]) -> Path:
    path = project / "builds" / f"{engine}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"engine": engine, **spec}, sort_keys=False))
    return path


def sparkbuild(
    project: Path, cache: Path, *args: str, env: dict[str, str] | None = None
) -> CliResult:
    """``sparkbuild --project PROJECT --cache-dir CACHE ARGS`` through the one CLI runner."""
    return run_cli("--project", str(project), "--cache-dir", str(cache), *args, env=env)


def build_json(result: CliResult) -> dict[str, Any]:
    if result.exit_code != 0:
        raise AssertionError(f"sparkbuild build failed ({result.exit_code}):\n{result.stderr}")
    payload: dict[str, Any] = json.loads(result.stdout)
    (entry,) = payload["results"]
    return dict(entry)


def load_lock(project: Path) -> dict[str, Any]:
    path = project / "images.lock"
    data: dict[str, Any] = yaml.safe_load(path.read_text()) if path.exists() else {}
    return data


@dataclass
class OverlayEnv:
    """An arm64 base image with a real SGLang release's package in its site-packages, in a
    loopback registry, and the release repository the overlay's patches are made against."""

    version: str
    registry: LocalRegistry
    base_ref: str
    repo: Path
    work: Path
    images: list[str]  # removed when the environment closes; tests add what they build


@contextlib.contextmanager
def overlay_env(
    work: Path, version: str, repository: str, *, setup: str = ""
) -> Iterator[OverlayEnv]:
    """The base ``registry/repository:vVERSION`` (``setup``: more Dockerfile after the root
    filesystem, e.g. a ``USER``), pushed to a registry that lives as long as the block."""
    docker_client()
    cache = shared_test_cache()
    package = extract_wheel_package(version, cache)
    repo = sglang_release_repo(cache, [version])
    with start_registry(work / "registry") as registry:
        base_ref = push_arm64_base(
            registry,
            repository,
            tag=f"v{version}",
            extras={BOOKWORM_PYTHON_SITE: package},
            setup=setup,
            work_dir=work,
        )
        base_id = str(docker_client().images.get(base_ref).id)
        env = OverlayEnv(version, registry, base_ref, repo, work, [base_ref, base_id])
        try:
            yield env
        finally:
            remove_images(docker_client(), env.images)


def overlay_project(
    env: OverlayEnv, name: str, build: str, edits: Mapping[str, Edit], tags: list[str], **image: Any
) -> Path:
    """A project whose one build ``build`` overlays ``edits`` (as patches/sglang/fix.patch)
    onto the environment's base image; ``image`` overrides spec fields."""
    project = env.work / name
    patch = project / "patches" / "sglang" / "fix.patch"
    make_patch_file(env.repo, f"v{env.version}", edits, patch)
    write_spec(
        project,
        "sglang",
        {
            "repo": str(env.repo),
            "package_dir": "python/sglang",
            "base_image": env.base_ref,
            "tags": tags,
            **image,
            "builds": {
                build: {"ref": f"v{env.version}", "patches": [{"file": "patches/sglang/fix.patch"}]}
            },
        },
    )
    return project
