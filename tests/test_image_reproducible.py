"""Reproducible images, on real BuildKit builds of a linux/arm64 image (emulated here).

The publication tests' tiny overlay build (a real arm64 Debian base with a two-file package,
in a loopback registry) is built from one lock entry again and again: in another project
directory, seconds later, without BuildKit's cache, and it comes out as one image id. A build
step that writes the time, a file with a random name and a ``.pyc`` with a timestamp is caught
by ``build --check-reproducible``, each named by file, and images.lock records it.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sparkbuild.image.context import OVERLAY_TEMPLATE, packaged
from tests.support.cli import CliResult
from tests.support.docker_env import docker_cli
from tests.support.image_project import build_json, load_lock, sparkbuild
from tests.support.preflight_lock import record_preflight
from tests.support.publish_env import (
    BUILD,
    PROFILE,
    PublishEnv,
    generate_keys,
    publish_env,
    record_smoke,
    run_publish_cli,
)

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
    with publish_env(
        tmp_path_factory.mktemp("reproducible"), "sparkbuild-tests/repro-{build}"
    ) as e:
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
    with tarfile.open(fileobj=io.BytesIO(saved.stdout)) as archive:
        manifest = json.loads(archive.extractfile("manifest.json").read())  # type: ignore[union-attr]
        layer = archive.extractfile(manifest[0]["Layers"][-1])
        assert layer is not None
        with tarfile.open(fileobj=layer) as inner:
            return [int(member.mtime) for member in inner.getmembers()]


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


PASSPHRASE = "rebuild-me-bit-for-bit"


def _publish_signed(env: PublishEnv, lock: Path, key: Path, repository: str) -> str:
    """Publish the pinned image signed, with its attestations; its REF@DIGEST."""
    record_smoke(lock, BUILD, PROFILE)
    record_preflight(lock, BUILD, PROFILE)
    result = env.publish(
        "--sign-key",
        str(key),
        "--repository",
        repository,
        "--no-alias",
        "--json",
        lock=lock,
        env={**env.creds_env(), "SPARKBUILD_SIGNING_PASSWORD": PASSPHRASE},
    )
    assert result.exit_code == 0, result.output
    (payload,) = json.loads(result.stdout)["results"]
    return f"{env.registry.address}/{payload['reference'].split('/', 1)[1]}"


def _verify_rebuild(env: PublishEnv, reference: str, public: Path) -> CliResult:
    return run_publish_cli(
        env.project,
        "verify",
        reference,
        "--rebuild",
        "--key",
        str(public),
        "--json",
        env=env.creds_env(),
        docker_config=env.empty_docker_config,
    )


def test_verify_rebuild_from_the_provenance_alone(env: PublishEnv) -> None:
    private, public = generate_keys(env.project, env.work / "keys" / "cosign", PASSPHRASE)
    section = env.image_section()
    image_id = section["image_id"]
    for tag in section["tags"]:  # the planted build above took the same tags
        subprocess.run([docker_cli(), "tag", image_id, tag], check=True)

    reference = _publish_signed(env, env.lock_copy("good"), private, "rebuild/{engine}")
    # The project's own lock has no publication, and is not read: the provenance is enough.
    (env.project / "images.lock").rename(env.work / "project-lock.aside")
    try:
        rebuilt = _verify_rebuild(env, reference, public)
    finally:
        (env.work / "project-lock.aside").rename(env.project / "images.lock")
    assert rebuilt.exit_code == 0, rebuilt.output
    payload = json.loads(rebuilt.stdout)
    assert payload["ok"] is True
    assert payload["published"] == payload["rebuilt"] == image_id
    assert payload["differences"] == []

    # A provenance that pins another patch: refused before anything is built, naming it.
    lock = env.lock_copy("other-input")
    data = yaml.safe_load(lock.read_text())
    data["builds"][BUILD]["source"]["patches"][0]["sha256"] = "0" * 64
    lock.write_text(yaml.safe_dump(data))
    wrong = _publish_signed(env, lock, private, "rebuild-other/{engine}")
    refused = _verify_rebuild(env, wrong, public)
    assert refused.exit_code == 1, refused.output
    assert "refused to rebuild" in refused.stderr
    assert "patches/sglang/greeting.patch changed" in refused.stderr, refused.stderr
    assert "locked 000000000000" in refused.stderr  # the provenance's pin, named
