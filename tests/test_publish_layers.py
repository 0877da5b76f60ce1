"""`sparkbuild publish` refuses, before pushing, a layer over the registry's limit.

A real arm64 overlay image (the tiny SGLang-like project of the publish tests), a real
registry behind htpasswd auth, and the CLI. With a small configured limit the push is refused
naming the layer that is too large and the remedy, and the registry receives nothing; with a
limit the image fits, the same command publishes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from sparkbuild.errors import UsageError
from sparkbuild.publish import layers
from sparkbuild.settings import Settings
from sparkbuild.spec import load_builds
from tests.support.docker_env import (
    BOOKWORM_PYTHON_SITE,
    LocalRegistry,
    docker_client,
    push_arm64_base,
    remove_images,
    start_registry,
)
from tests.support.image_project import prepare_and_build
from tests.support.preflight_lock import record_preflight
from tests.support.publish_env import record_smoke, run_publish_cli, tiny_upstream, write_project

pytestmark = [pytest.mark.docker]

BUILD = "sglang-layers"
PROFILE = "cpu-reference"


@dataclass
class Env:
    registry: LocalRegistry
    project: Path
    image_id: str
    docker_config: Path

    def publish(self, *args: str) -> tuple[int, str]:
        assert self.registry.auth is not None
        user, password = self.registry.auth
        result = run_publish_cli(
            self.project,
            "publish",
            BUILD,
            "--registry",
            self.registry.address,
            "--no-alias",
            *args,
            env={"SPARKBUILD_REGISTRY_USER": user, "SPARKBUILD_REGISTRY_PASSWORD": password},
            docker_config=self.docker_config,
        )
        return result.exit_code, result.stdout + result.stderr

    def repositories(self) -> list[str]:
        response = requests.get(f"{self.registry.url}/v2/_catalog", auth=self.registry.auth)
        response.raise_for_status()
        return list(response.json().get("repositories") or [])


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    docker_client()
    work = tmp_path_factory.mktemp("publish-layers")
    repo, site = tiny_upstream(work)
    config = work / "docker-config"
    config.mkdir()
    images: list[str] = []
    with (
        start_registry(work / "base-registry") as base_registry,
        start_registry(work / "registry", auth=True) as registry,
    ):
        base_ref = push_arm64_base(
            base_registry,
            "sparkbuild-tests/tiny-sglang-layers",
            tag="v0.5.12",
            extras={BOOKWORM_PYTHON_SITE: site},
            work_dir=work,
        )
        images.append(base_ref)
        project = work / "project"
        write_project(project, repo, base_ref, {BUILD: {"ref": "v0.5.12", "smoke": [PROFILE]}}, "x")
        build = load_builds(Settings(project_dir=project))[BUILD]
        result = prepare_and_build(build, Settings(project_dir=project, cache_dir=work / "cache"))
        images.append(result.image_id)
        record_smoke(project / "images.lock", BUILD, PROFILE)
        record_preflight(project / "images.lock", BUILD, PROFILE)  # publish needs both gates
        try:
            yield Env(registry, project, result.image_id, config)
        finally:
            remove_images(docker_client(), images)


def test_a_layer_over_the_limit_is_refused_before_the_push(env: Env) -> None:
    image = docker_client().images.get(env.image_id)
    biggest = max(layers.layers(image), key=lambda layer: layer.size)
    assert "rootfs.tar" in biggest.created_by  # the base's root filesystem
    limit = biggest.size - 1

    code, output = env.publish("--max-layer-size", str(limit))
    assert code == 1, output
    assert f"exceed the registry's limit of {layers.human(limit)}" in output
    assert f"{layers.human(biggest.size)}, made by: " in output and "rootfs.tar" in output
    assert "nothing was pushed" in output and "--max-layer-size" in output
    assert "split the step" in output
    assert "Traceback" not in output
    assert env.repositories() == []  # not one blob or manifest reached the registry

    code, output = env.publish("--max-layer-size", str(biggest.size))
    assert code == 0, output
    assert env.repositories() != []


def test_limits_by_registry_and_size_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(layers.LIMIT_ENV, raising=False)
    assert layers.limit_for("ghcr.io", None) == 10 * 1000**3
    assert layers.limit_for("127.0.0.1:5000", None) is None
    assert layers.limit_for("ghcr.io", "512MiB") == 512 * 1024**2
    monkeypatch.setenv(layers.LIMIT_ENV, "1.5GB")
    assert layers.limit_for("127.0.0.1:5000", None) == 1_500_000_000
    with pytest.raises(UsageError, match="not a size"):
        layers.parse_size("ten gigs")
