"""``--drop-caches`` on a container node (issue 46, critical): the privileged container is a
fixed helper, never the image under test, and with ``--key`` nothing runs before the
signature is checked.

A real Docker engine, real images (docker import), and Docker's own event stream as the
witness of which containers were created from which image. This sandbox refuses privileged
containers ("unable to apply caps"), so here the helper is created and fails to start; where
privileged containers run, it drops the cache and the run goes on to the boot. Both ways,
the image under test is never created before the drop, nor privileged.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import docker
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from tests.support.drop_helper import empty_image, helper_image
from tests.support.smoke_cli import SmokeRun, run_smoke_cli

pytestmark = [pytest.mark.docker]

PROFILE = Path(__file__).resolve().parents[1] / "smoke" / "cpu-reference.yaml"
BUSYBOX_DIGEST = "sha256:bdf57e528e45e4433820e045b29b4597825a1c9e38353532d90a01445013f82e"


@pytest.fixture(scope="module")
def images() -> dict[str, str]:
    return {"helper": helper_image(), "candidate": empty_image()}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "smoke").mkdir()
    return tmp_path


def _created(since: float, image_ids: set[str]) -> list[tuple[float, str]]:
    """(time, image id) of each container created since ``since`` from one of ``image_ids``."""
    api = docker.from_env()
    events = api.events(since=int(since) - 1, until=int(time.time()) + 1, decode=True,
                        filters={"type": "container", "event": "create"})  # fmt: skip
    found: list[tuple[float, str]] = []
    for event in events:
        image = str(event.get("Actor", {}).get("Attributes", {}).get("image", ""))
        ids = {image, _id_of(api, image)}
        hit = ids & image_ids
        if hit:
            found.append((float(event.get("timeNano", 0)) / 1e9, hit.pop()))
    return found


def _id_of(api: docker.DockerClient, image: str) -> str:
    try:
        return str(api.images.get(image).id)
    except docker.errors.DockerException:
        return ""


def _smoke(project: Path, candidate: str, *extra: str, env: dict[str, Any] | None = None
           ) -> SmokeRun:  # fmt: skip
    return run_smoke_cli(project, "--image", candidate, "--profile", str(PROFILE), "--model",
                         "org/tiny", "--drop-caches", *extra, env=env, timeout=300)  # fmt: skip


def test_the_page_cache_is_dropped_by_the_fixed_helper_not_the_image_under_test(
    project: Path, images: dict[str, str]
) -> None:
    started = time.time()
    run = _smoke(project, images["candidate"],
                 env={"SPARKBUILD_DROP_CACHES_HELPER": images["helper"]})  # fmt: skip
    created = _created(started, set(images.values()))
    helpers = [t for t, image in created if image == images["helper"]]
    candidates = [t for t, image in created if image == images["candidate"]]
    assert helpers, (created, run.stderr)
    if run.returncode == 2:  # privileged containers refused here: the drop stops the run
        assert "the privileged helper container of " + images["helper"] in run.stderr
        assert candidates == [], created  # the image under test never ran at all
    else:  # the drop ran; the image under test booted (and failed: it holds nothing)
        assert "dropped the page cache on this host" in run.stderr, run.stderr
        assert max(helpers) < min(candidates), created


def test_the_default_helper_is_busybox_by_digest(project: Path, images: dict[str, str]) -> None:
    """No registry here serves busybox: the pull by digest fails, by name, before any boot."""
    started = time.time()
    run = _smoke(project, images["candidate"])
    assert run.returncode == 2, run.stderr
    assert f"cannot pull the helper image docker.io/library/busybox:1.37.0@{BUSYBOX_DIGEST}" in (
        run.stderr
    )
    assert "--no-drop-caches" in run.stderr
    assert not [c for c in _created(started, set(images.values())) if c[1] == images["candidate"]]


def test_an_unpinned_helper_is_refused(project: Path, images: dict[str, str]) -> None:
    run = _smoke(project, images["candidate"],
                 env={"SPARKBUILD_DROP_CACHES_HELPER": "busybox:latest"})  # fmt: skip
    assert run.returncode == 2 and "is not pinned" in run.stderr, run.stderr


def test_with_key_nothing_runs_before_the_signature_is_checked(
    project: Path, images: dict[str, str]
) -> None:
    """Before: the image under test ran privileged as root, then the run failed "not
    signed". Now the check comes first, and neither the helper nor the image is created."""
    public = ec.generate_private_key(ec.SECP256R1()).public_key()
    key = project / "cosign.pub"
    pem = serialization.Encoding.PEM
    key.write_bytes(public.public_bytes(pem, serialization.PublicFormat.SubjectPublicKeyInfo))
    started = time.time()
    run = _smoke(project, images["candidate"], "--key", str(key),
                 env={"SPARKBUILD_DROP_CACHES_HELPER": images["helper"]})  # fmt: skip
    assert run.returncode == 1, run.stderr  # a signature error, as for a boot without the drop
    assert "is not signed by" in run.stderr and "no registry digest" in run.stderr
    assert _created(started, set(images.values())) == []
