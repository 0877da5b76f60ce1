"""Verdicts say what they ran: a `--command` run recorded for a build does not open publish.

The issue's scenario, end to end with real parts: build a real arm64 image (the publish
tests' tiny SGLang-like project), smoke the real vLLM engine on the CPU with `--command` and
`--record BUILD`, then `publish BUILD` to a real registry with htpasswd auth. The pass is
recorded with its target and `verified: false`, and publish refuses; `--force` publishes
loudly and records the publication as unverified.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sparkbuild.settings import Settings
from sparkbuild.spec import load_builds
from tests.support.docker_env import (
    BOOKWORM_PYTHON_SITE,
    docker_client,
    push_arm64_base,
    remove_images,
    start_registry,
)
from tests.support.image_project import prepare_and_build
from tests.support.publish_env import run_publish_cli, tiny_upstream, write_project
from tests.support.smoke_cli import run_smoke_cli, write_profile
from tests.support.vllm_cpu import tiny_llama, vllm_server_command

pytestmark = [pytest.mark.docker, pytest.mark.engine]

BUILD = "sglang-tiny"
PROFILE = "cpu-reference"
REPOSITORY = "sparkbuild/sglang"


def test_a_command_run_does_not_open_the_publish_gate(tmp_path: Path) -> None:
    client = docker_client()
    repo, site = tiny_upstream(tmp_path)
    project = tmp_path / "project"
    with (
        start_registry(tmp_path / "base-registry") as base_registry,
        start_registry(tmp_path / "registry", auth=True) as registry,
    ):
        base_ref = push_arm64_base(
            base_registry,
            "sparkbuild-tests/tiny-sglang",
            tag="v0.5.12",
            extras={BOOKWORM_PYTHON_SITE: site},
            work_dir=tmp_path,
        )
        write_project(
            project, repo, base_ref, {BUILD: {"ref": "v0.5.12", "smoke": [PROFILE]}}, "first"
        )
        build = load_builds(Settings(project_dir=project))[BUILD]
        built = prepare_and_build(
            build, Settings(project_dir=project, cache_dir=tmp_path / "cache")
        )
        try:
            write_profile(project, PROFILE)
            run = run_smoke_cli(
                project, "--command", vllm_server_command(), "--profile", PROFILE,
                "--model", str(tiny_llama()), "--record", BUILD,
            )  # fmt: skip
            assert run.returncode == 0, run.explain()
            assert "recorded as unverified" in run.stderr

            lock = yaml.safe_load((project / "images.lock").read_text())["builds"][BUILD]
            entry = lock["smoke"][built.image_id][PROFILE]
            assert entry["verdict"] == "pass" and entry["verified"] is False
            assert entry["target"].startswith("command:") and entry["image_id"] is None

            assert registry.auth is not None
            creds = {
                "SPARKBUILD_REGISTRY_USER": registry.auth[0],
                "SPARKBUILD_REGISTRY_PASSWORD": registry.auth[1],
            }
            refused = run_publish_cli(
                project, "publish", BUILD, "--registry", registry.address, env=creds
            )
            assert refused.exit_code == 1, refused.stdout + refused.stderr
            assert "no passing smoke verdict" in refused.stderr
            assert f"{PROFILE}: unverified pass (command:" in refused.stderr
            assert "smoke --image" in refused.stderr
            assert registry.manifest_digest(REPOSITORY, "0.5.12-sm121") is None

            forced = run_publish_cli(
                project, "publish", BUILD, "--registry", registry.address, "--force", env=creds
            )
            assert forced.exit_code == 0, forced.stdout + forced.stderr
            assert "PUBLISHING AN UNVERIFIED IMAGE" in forced.stderr
            published = yaml.safe_load((project / "images.lock").read_text())["builds"][BUILD]
            record = published["publish"][f"{registry.address}/{REPOSITORY}"]
            assert record["verified"] is False and record["image_id"] == built.image_id
            assert registry.manifest_digest(REPOSITORY, "0.5.12-sm121") == record["digest"]
        finally:
            remove_images(client, [built.image_id, base_ref])
