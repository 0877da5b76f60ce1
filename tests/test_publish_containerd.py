"""Publish with Docker's containerd image store: image ids that are manifest or index digests,
and immutable tags that serve OCI indexes with attestation manifests.

The daemon here uses the classic store, so the manifests and indexes the containerd store and
`buildx --push` produce are pushed to a real registry (docker-registry with htpasswd auth)
over its HTTP API (tests/support/oci_push.py). The lock pins each case's image id the way
that store reports it; `sparkbuild publish` then finds the tag already serving it and must
accept it (moving the aliases to the exact digest) or refuse content that is not that image.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.cli import CliResult
from tests.support.docker_env import LocalRegistry, start_registry
from tests.support.oci_push import Pushed, push_image, push_index, tag_manifest
from tests.support.preflight_lock import record_preflight
from tests.support.publish_env import record_smoke, run_publish_cli, tiny_upstream, write_project

# docker-registry only (no Docker engine), from the same host setup as the other publish tests.
pytestmark = [pytest.mark.docker]

BUILD = "sglang-tiny"
PROFILE = "cpu-reference"
TREE = "ab" * 20
TAG = f"0.5.12-sm121-{TREE[:12]}"
ALIAS = "0.5.12-sm121"


@dataclass
class Env:
    registry: LocalRegistry
    project: Path
    work: Path

    def publish(self, case: str, image_id: str) -> CliResult:
        """`sparkbuild publish` with a lock pinning ``image_id`` and a verified passing smoke."""
        lock = self.work / f"{case}.lock"
        image = {"image_id": image_id, "tree": TREE, "platform": "linux/arm64"}
        lock.write_text(yaml.safe_dump({"schema": 1, "builds": {BUILD: {"image": image}}}))
        record_smoke(lock, BUILD, PROFILE)
        record_preflight(lock, BUILD, PROFILE)  # publish needs both gates
        assert self.registry.auth is not None
        user, password = self.registry.auth
        return run_publish_cli(
            self.project,
            "--lock-file", str(lock),
            "publish", BUILD, "--registry", self.registry.address,
            "--repository", f"{case}/{{engine}}",
            env={"SPARKBUILD_REGISTRY_USER": user, "SPARKBUILD_REGISTRY_PASSWORD": password},
            docker_config=self.work / "docker-config-empty",
        )  # fmt: skip

    def recorded(self, case: str) -> dict[str, Any]:
        data = yaml.safe_load((self.work / f"{case}.lock").read_text())
        record: dict[str, Any] = data["builds"][BUILD]["publish"][
            f"{self.registry.address}/{case}/sglang"
        ]
        return record


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    work = tmp_path_factory.mktemp("containerd")
    (work / "docker-config-empty").mkdir()
    repo, _ = tiny_upstream(work)
    project = work / "project"
    builds = {BUILD: {"ref": "v0.5.12", "smoke": [PROFILE]}}
    write_project(project, repo, "127.0.0.1:5000/base:v0.5.12", builds, "first")
    with start_registry(work / "registry", auth=True) as registry:
        yield Env(registry, project, work)


def _multiarch(env: Env, case: str) -> tuple[Pushed, Pushed, Pushed]:
    """arm64 + amd64 images and the attested index under the immutable tag: (arm, amd, index)."""
    repository = f"{case}/sglang"
    arm = push_image(env.registry, repository, "linux/arm64", f"{case} arm64")
    amd = push_image(env.registry, repository, "linux/amd64", f"{case} amd64")
    index = push_index(env.registry, repository, TAG, {"linux/arm64": arm, "linux/amd64": amd})
    return arm, amd, index


def _ok(result: CliResult) -> None:
    assert result.exit_code == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("case", "pinned"),
    [
        ("classic", "config"),  # classic store id (config digest), pushed in an attested index
        ("containerd-index", "index"),  # containerd store id of the multi-platform image
        ("containerd-manifest", "manifest"),  # containerd store id of the arm64 manifest
    ],
)
def test_an_index_holding_the_pinned_image_is_published(env: Env, case: str, pinned: str) -> None:
    arm, _, index = _multiarch(env, case)
    image_id = {"config": arm.config_digest, "index": index.digest, "manifest": arm.digest}[pinned]
    assert image_id is not None

    result = env.publish(case, image_id)

    _ok(result)
    assert "already published" in result.stdout
    record = env.recorded(case)
    assert record["digest"] == index.digest and record["verified"] is True
    assert record["image_id"] == image_id
    # The alias is a manifest PUT of the same index: the exact digest, attestations included.
    assert env.registry.manifest_digest(f"{case}/sglang", ALIAS) == index.digest


def test_a_single_manifest_pinned_by_its_digest_is_published(env: Env) -> None:
    repository = "containerd-single/sglang"
    arm = push_image(env.registry, repository, "linux/arm64", "single arm64")
    tag_manifest(env.registry, repository, TAG, arm)

    result = env.publish("containerd-single", arm.digest)

    _ok(result)
    assert env.recorded("containerd-single")["digest"] == arm.digest
    assert env.registry.manifest_digest(repository, ALIAS) == arm.digest


def test_an_index_without_the_pinned_image_for_the_platform_is_refused(env: Env) -> None:
    case = "other-platform"
    _, amd, index = _multiarch(env, case)
    attestation_of_arm = index_manifests(env, case, index)[1]
    for image_id in (str(amd.config_digest), amd.digest, attestation_of_arm):
        result = env.publish(case, image_id)
        assert result.exit_code == 1, result.stdout + result.stderr
        assert "immutable tags never move" in result.stderr
        assert "an index of 4 manifest(s)" in result.stderr and "linux/arm64" in result.stderr
        assert env.registry.manifest_digest(f"{case}/sglang", ALIAS) is None


def index_manifests(env: Env, case: str, index: Pushed) -> list[str]:
    """The digests an index lists, in order (image, attestation, image, attestation)."""
    import requests

    response = requests.get(
        f"{env.registry.url}/v2/{case}/sglang/manifests/{index.digest}",
        headers={"Accept": index.media_type},
        auth=env.registry.auth,
        timeout=30,
    )
    response.raise_for_status()
    return [str(m["digest"]) for m in response.json()["manifests"]]
