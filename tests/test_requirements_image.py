"""The requirements layer in a real overlay build: real arm64 base, registry, BuildKit, PyPI.

The base is arm64 Debian bookworm with python3-pip (its Python is externally managed, as
the SGLang images' system Python is) and the real 0.5.12 `sglang/` tree. The spec asks for
`six==1.16.0`; `sparkbuild lock` pins the wheel pip downloads from PyPI by sha256, and
`sparkbuild build` installs exactly that file (the lock's pin) with the image's own Python, in one
layer on top of the overlay.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cache import shared_test_cache
from tests.support.docker_env import (
    BOOKWORM_PYTHON_SITE,
    BUILD_ROOTFS,
    docker_client,
    push_arm64_base,
    python_in_image,
    remove_images,
    start_registry,
)
from tests.support.image_project import (
    build_json,
    load_lock,
    make_patch_file,
    sparkbuild,
    write_spec,
)
from tests.support.sglang_releases import extract_wheel_package, sglang_release_repo

pytestmark = [pytest.mark.docker, pytest.mark.upstream]

VERSION = "0.5.12"
BUILD = "sglang-0.5.12-req"
MARKER = "python/sglang/srt/sparkbuild_marker.py"


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, list[str]]]:
    docker_client()
    cache = shared_test_cache()
    work = tmp_path_factory.mktemp("requirements-image")
    package = extract_wheel_package(VERSION, cache)
    repo = sglang_release_repo(cache, [VERSION])
    images: list[str] = []
    with start_registry(work / "registry") as registry:
        base = push_arm64_base(
            registry,
            "sparkbuild-tests/sglang-pip",
            tag=f"v{VERSION}",
            packages=BUILD_ROOTFS,
            extras={BOOKWORM_PYTHON_SITE: package},
            work_dir=work,
        )
        images.append(base)
        project = work / "project"
        make_patch_file(
            repo, f"v{VERSION}", {MARKER: "MARKER = 1\n"}, project / "patches" / "m.patch"
        )
        write_spec(
            project,
            "sglang",
            {
                "repo": str(repo),
                "package_dir": "python/sglang",
                "base_image": base,
                "python": "3.11",
                "tags": ["sparkbuild-tests/{build}:{tree_short}"],
                "requirements": [{"req": "six==1.16.0"}],
                "builds": {BUILD: {"ref": f"v{VERSION}", "patches": [{"file": "patches/m.patch"}]}},
            },
        )
        yield project, work / "cache", images
        remove_images(docker_client(), images)


def test_build_installs_exactly_the_locked_wheel(
    project: tuple[Path, Path, list[str]],
) -> None:
    path, cache, images = project
    locked = sparkbuild(path, cache, "lock", BUILD)
    assert locked.exit_code == 0, locked.stderr
    (pin,) = load_lock(path)["builds"][BUILD]["requirements"]
    wheel = cache / "wheels" / pin["filename"]
    assert pin["sha256"] == hashlib.sha256(wheel.read_bytes()).hexdigest()

    built = build_json(sparkbuild(path, cache, "build", BUILD, "--json"))
    images.append(built["image_id"])
    code = (
        "import six, importlib.metadata as m, platform; "
        "print(platform.machine(), six.__version__, m.version('six'))"
    )
    stdout = python_in_image(built["image_id"], code)
    assert stdout.split() == ["aarch64", "1.16.0", "1.16.0"]

    tampered = wheel.read_bytes() + b"x"
    wheel.write_bytes(tampered)
    again = sparkbuild(path, cache, "build", "--no-cache", BUILD, "--json")
    assert again.exit_code != 0 and "does not match images.lock" in again.stderr
