"""Reproducible images, on real BuildKit builds of a linux/arm64 image (emulated here).

The publication tests' tiny overlay build (a real arm64 Debian base with a two-file package,
in a loopback registry) is built from one lock entry again and again: in another project
directory, seconds later, without BuildKit's cache, and it comes out as one image id. A build
step that writes the time, a file with a random name and a ``.pyc`` with a timestamp is caught
by ``build --check-reproducible``, each named by file, and images.lock records it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sparkbuild.image.context import OVERLAY_TEMPLATE, packaged
from tests.support.cli import CliResult
from tests.support.docker_env import docker_cli
from tests.support.image_project import build_json, load_lock, sparkbuild
from tests.support.publish_env import BUILD, PublishEnv, publish_env

pytestmark = [pytest.mark.docker]

PLANTED = """
# Planted non-determinism: the clock, a random file name, a .pyc that holds its source's time.
RUN date +%s%N > /etc/sparkbuild-build-time \\
 && touch "/opt/random-$(od -An -N6 -tx1 /dev/urandom | tr -d ' \\n')" \\
 && echo 'STAMPED = 1' > /opt/stamped.py \\
 && python3 -c "import py_compile as p; p.compile('/opt/stamped.py', cfile='/opt/stamped.pyc', \\
    invalidation_mode=p.PycInvalidationMode.TIMESTAMP)"
"""


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PublishEnv]:
    with publish_env(tmp_path_factory.mktemp("reproducible"), "sparkbuild-tests/repro-{build}") as e:
        yield e


def _copy_project(env: PublishEnv, name: str) -> Path:
    """The project (spec, patches, images.lock) in another directory."""
    copy = env.work / name
    shutil.copytree(env.project, copy, ignore=shutil.ignore_patterns(".cache", "*.work"))
    return copy


def _build(env: PublishEnv, project: Path, *args: str) -> CliResult:
    return sparkbuild(project, env.work / f"cache-{project.name}", "build", BUILD, *args)


def _saved_layer_times(image_id: str) -> list[int]:
    """Every file time in the image's last layer, read from `docker save`."""
    saved = subprocess.run([docker_cli(), "save", image_id], capture_output=True, check=True)
    with tarfile.open(fileobj=__import__("io").BytesIO(saved.stdout)) as archive:
        manifest = json.loads(archive.extractfile("manifest.json").read())  # type: ignore[union-attr]
        layer = archive.extractfile(manifest[0]["Layers"][-1])
        assert layer is not None
        with tarfile.open(fileobj=layer) as inner:
            return [member.mtime for member in inner.getmembers()]


def test_rebuilds_from_one_lock_entry_give_one_image(env: PublishEnv) -> None:
    section = env.image_section()
    first = section["image_id"]
    env.images.append(first)
    inspect = json.loads(
        subprocess.run(
            [docker_cli(), "image", "inspect", first], capture_output=True, check=True
        ).stdout
    )[0]
    created = inspect["Config"]["Labels"]["org.opencontainers.image.created"]
    assert inspect["Created"].startswith(created.removesuffix("Z"))  # the commit's time, not now
    epoch = int(
        __import__("datetime").datetime.fromisoformat(created.replace("Z", "+00:00")).timestamp()
    )
    assert max(_saved_layer_times(first)) <= epoch
    assert section["builder"]["canonical_form"] == "1"
    assert "Docker Engine" in section["builder"]["engine"]

    # Another directory, another time, without BuildKit's cache, pinned by the same entry.
    time.sleep(1.5)
    elsewhere = _copy_project(env, "elsewhere")
    cache = env.work / f"cache-{elsewhere.name}"
    fetched = sparkbuild(elsewhere, cache, "prepare", "--locked", BUILD)
    assert fetched.exit_code == 0, fetched.output
    again = build_json(_build(env, elsewhere, "--locked", "--no-cache", "--json"))
    assert again["skipped"] is False
    assert again["image_id"] == first

    # The check: a second build without the cache in yet another directory, the same id.
    checked = build_json(_build(env, elsewhere, "--check-reproducible", "--json"))
    assert checked["image_id"] == first
    assert checked["reproducible"] == {
        "reproducible": True,
        "first": first,
        "second": first,
        "differences": [],
    }
    image = load_lock(elsewhere)["builds"][BUILD]["image"]
    assert image["reproducible"] is True
    assert image["differences"] == []
    # The check's second build left no image behind that carries the build's inputs digest.
    listed = subprocess.run(
        [
            docker_cli(),
            "images",
            "-q",
            "--no-trunc",
            "--filter",
            f"label=io.sparkbuild.inputs-digest={image['inputs_digest']}",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert set(listed) == {first}


def test_planted_non_determinism_is_named_by_file(env: PublishEnv) -> None:
    project = _copy_project(env, "planted")
    (project / "images.lock").unlink()
    template = packaged(OVERLAY_TEMPLATE).read_text()
    (project / "builds" / "docker").mkdir()
    (project / "builds" / "docker" / OVERLAY_TEMPLATE).write_text(template + PLANTED)

    result = _build(env, project, "--check-reproducible")
    assert result.exit_code == 1, result.output
    text = result.stderr
    assert "not reproducible" in text
    for path in ("/etc/sparkbuild-build-time", "/opt/stamped.pyc", "/opt/random-"):
        assert path in text, text
    assert "invalidation_mode=CHECKED_HASH" in text  # the .pyc's own remedy

    image: dict[str, Any] = load_lock(project)["builds"][BUILD]["image"]
    env.images.append(image["image_id"])
    assert image["reproducible"] is False
    lines = image["differences"]
    assert lines[0].split(":")[1].strip().startswith("content")  # the most useful first
    named = {line.split(":")[0] for line in lines}
    assert {"/etc/sparkbuild-build-time", "/opt/stamped.pyc"} <= named
    randoms = [line for line in lines if line.startswith("/opt/random-")]
    assert sorted(r.split(": ")[1].split(",")[0] for r in randoms) == [
        "only in the first build",
        "only in the second build",
    ]
    # Times were clamped, so no file differs by its time alone.
    assert not any(line.split(": ")[1].startswith("time") for line in lines)
