"""A source-mode build on a base image that runs as a non-root user (real arm64 base, real
registry, real BuildKit, a real wheel from PyPI).

The base is arm64 Debian with pip and `USER spark`. The build is `mode: source` with a
`requirements:` pin, and its Dockerfile is the packaged SGLang source template's own user
handling (everything up to `ARG SPARKBUILD_BASE_USER=`, and its last line) around one step
that only root can do. sparkbuild must read the base's USER in source mode too: the step runs
as root, the requirements layer installs as root, and the image runs as `spark` again (before,
the requirements layer left a source image running as root).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from sparkbuild.image import context
from tests.support.cache import shared_test_cache
from tests.support.docker_env import (
    BUILD_ROOTFS,
    docker_cli,
    docker_client,
    push_arm64_base,
    remove_images,
    start_registry,
)
from tests.support.image_project import build_json, load_lock, sparkbuild, write_spec
from tests.support.sglang_releases import download_wheel, sglang_release_repo

pytestmark = [pytest.mark.docker, pytest.mark.upstream]

VERSION = "0.5.12"
BUILD = "sglang-0.5.12-source-nonroot"
NON_ROOT_SETUP = """\
RUN echo 'spark:x:1000:1000::/home/spark:/bin/sh' >> /etc/passwd \\
    && echo 'spark:x:1000:' >> /etc/group \\
    && mkdir -p /home/spark && chown spark:spark /home/spark
USER spark
WORKDIR /home/spark
"""
# Only root may write under /opt; the file records who the step ran as.
ROOT_ONLY_STEP = "RUN mkdir -p /opt/sparkbuild && id -un > /opt/sparkbuild/built-as\n"
RESTORE = "USER ${SPARKBUILD_BASE_USER:-root}"


def _template_user_handling() -> tuple[str, str]:
    """The packaged template's head (through its USER root and ARG) and its last line."""
    template = context.packaged("sglang-source.Dockerfile").read_text()
    marker = "ARG SPARKBUILD_BASE_USER=\n"
    head = template[: template.index(marker) + len(marker)]
    assert "\nUSER root\n" in head
    last = template.rstrip("\n").rsplit("\n", 1)[1]
    assert last == RESTORE
    return head, last


def _seed_release_wheel(cache: Path) -> None:
    """The release wheel `lock` reads pins from, from the test cache (not downloaded again)."""
    wheel = download_wheel(VERSION, shared_test_cache())
    folder = cache / "wheels"  # kept there once the index gives its sha256
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    shutil.copyfile(wheel, folder / wheel.name)


def test_source_build_on_a_non_root_base_builds_as_root_and_runs_as_the_base_user(
    tmp_path: Path,
) -> None:
    docker_client()
    repo = sglang_release_repo(shared_test_cache(), [VERSION])
    images: list[str] = []
    with start_registry(tmp_path / "registry") as registry:
        base = push_arm64_base(
            registry,
            "sparkbuild-tests/source-nonroot",
            packages=BUILD_ROOTFS,
            setup=NON_ROOT_SETUP,
            work_dir=tmp_path,
        )
        images.append(base)
        try:
            project = tmp_path / "project"
            head, last = _template_user_handling()
            dockerfile = project / "docker" / "source.Dockerfile"
            dockerfile.parent.mkdir(parents=True)
            dockerfile.write_text(head + ROOT_ONLY_STEP + last + "\n")
            write_spec(
                project,
                "sglang",
                {
                    "repo": str(repo),
                    "package_dir": "python/sglang",
                    "mode": "source",
                    "base_image": base,
                    "dockerfile": "docker/source.Dockerfile",
                    "python": "3.11",
                    "tags": ["sparkbuild-tests/{build}:{tree_short}"],
                    "requirements": [{"req": "six==1.16.0", "mode": "source"}],
                    "builds": {BUILD: {"ref": f"v{VERSION}"}},
                },
            )
            cache = tmp_path / "cache"
            _seed_release_wheel(cache)
            locked = sparkbuild(project, cache, "lock", BUILD)
            assert locked.exit_code == 0, locked.stderr
            (pin,) = load_lock(project)["builds"][BUILD]["requirements"]
            assert (pin["name"], pin["version"]) == ("six", "1.16.0")

            built = build_json(sparkbuild(project, cache, "build", BUILD, "--json"))
            images.append(built["image_id"])
            inspect = subprocess.run(
                [docker_cli(), "image", "inspect", built["image_id"]],
                capture_output=True,
                text=True,
                check=True,
            )
            assert json.loads(inspect.stdout)[0]["Config"]["User"] == "spark"
            script = (
                "id -un; cat /opt/sparkbuild/built-as; "
                "python3 -c 'import six, platform; print(six.__version__, platform.machine())'"
            )
            run = [docker_cli(), "run", "--rm", "--platform", "linux/arm64", built["image_id"]]
            result = subprocess.run(
                [*run, "sh", "-c", script],
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            assert result.returncode == 0, result.stderr
            assert result.stdout.split() == ["spark", "root", "1.16.0", "aarch64"]
        finally:
            remove_images(docker_client(), images)
