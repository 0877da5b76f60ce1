"""The BuildKit client probe, the platform check, failure summaries and the no-daemon error,
against the real clients and binfmt state of this machine."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from sparkbuild import dockerhost
from sparkbuild.errors import SparkbuildError
from sparkbuild.image import builder, render_tags
from sparkbuild.settings import Settings
from sparkbuild.spec import load_builds
from tests.support.docker_env import docker_client
from tests.support.image_project import sparkbuild, write_spec

pytestmark = [pytest.mark.docker]


def test_finds_a_buildkit_capable_client() -> None:
    client = builder.find_client()
    if client.kind == "builtin":
        version = subprocess.run(
            [client.path, "--version"], capture_output=True, text=True, check=True
        ).stdout
        assert int(client.version.split(".")[0]) < 23, version
    else:
        buildx = [client.path, "buildx", "version"]
        assert subprocess.run(buildx, capture_output=True, check=False).returncode == 0


def test_newer_clients_without_buildx_are_passed_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A docker 28 client without buildx first on PATH refuses BuildKit builds; the probe
    must take a client with buildx or Debian's /usr/bin/docker (20.10) instead."""
    newer = _docker_client_script(tmp_path / "bin", version="28.1.1")
    monkeypatch.setenv("PATH", f"{newer.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    assert builder.docker_candidates()[0] == str(newer)
    assert builder.client_version(str(newer)) == "28.1.1" and not builder.has_buildx(str(newer))
    chosen = builder.find_client()
    assert os.path.realpath(chosen.path) != os.path.realpath(newer)


def _docker_client_script(directory: Path, *, version: str) -> Path:
    """A real `docker` executable that answers --version like docker 23+ and has no buildx."""
    directory.mkdir(parents=True)
    script = directory / "docker"
    script.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "--version" ]; then\n'
        f'  echo "Docker version {version}, build 0000000"; exit 0\n'
        "fi\n"
        "echo \"docker: 'buildx' is not a docker command.\" >&2\n"
        "exit 1\n"
    )
    script.chmod(0o755)
    return script


def test_builder_flag_needs_buildx() -> None:
    if any(
        subprocess.run([p, "buildx", "version"], capture_output=True, check=False).returncode == 0
        for p in builder.docker_candidates()
    ):
        assert builder.find_client(need_buildx=True).kind == "buildx"
        return
    with pytest.raises(SparkbuildError) as info:
        builder.find_client(need_buildx=True)
    assert "buildx" in info.value.message and info.value.hint and "buildx" in info.value.hint


def test_platform_without_emulation_is_refused(tmp_path: Path) -> None:
    empty_binfmt = tmp_path / "binfmt_misc"
    empty_binfmt.mkdir()
    foreign = "linux/arm64" if os.uname().machine == "x86_64" else "linux/amd64"
    with pytest.raises(SparkbuildError) as info:
        dockerhost.check_can_run(foreign, binfmt_dir=empty_binfmt)
    assert foreign in info.value.message
    assert info.value.hint and "setup-host.sh" in info.value.hint
    dockerhost.check_can_run(foreign)  # this machine has emulation (scripts/setup-host.sh)


def test_failure_summary_shows_the_failing_step() -> None:
    lines = [
        "#1 [internal] load build definition from Dockerfile",
        "#1 DONE 0.0s",
        "#5 [2/2] RUN python3 /tmp/sparkbuild-overlay/apply_overlay.py",
        *[f"#5 0.{i} noise line {i}" for i in range(30)],
        "#5 0.9 SyntaxError: invalid syntax",
        "#5 ERROR: executor failed running [/bin/sh -c python3 apply_overlay.py]: exit code: 1",
        "------",
        " > [2/2] RUN python3 /tmp/sparkbuild-overlay/apply_overlay.py:",
        "------",
        "executor failed running [/bin/sh -c python3 apply_overlay.py]: exit code: 1",
    ]
    summary = builder.failure_summary(lines)
    assert "[2/2] RUN python3" in summary
    assert "SyntaxError: invalid syntax" in summary
    assert "noise line 3\n" not in summary + "\n"
    assert summary.rstrip().endswith("exit code: 1")


def test_max_jobs_follows_memory() -> None:
    gib = 1024**3
    assert builder.max_jobs(119 * gib, 20) == 10  # 11 GiB per job
    assert builder.max_jobs(4 * gib, 2) == 1
    assert builder.max_jobs(512 * gib, 8) == 8


def test_no_daemon_says_how_to_start_one(tmp_path: Path) -> None:
    project = tmp_path / "project"
    write_spec(
        project,
        "sglang",
        {
            "repo": str(tmp_path / "none.git"),
            "package_dir": "python/sglang",
            "base_image": "127.0.0.1:1/x:y",
            "builds": {"b": {"ref": "v0.5.12"}},
        },
    )
    result = sparkbuild(
        project, tmp_path / "cache", "build", env={"DOCKER_HOST": f"unix://{tmp_path}/no.sock"}
    )
    assert result.exit_code == 1
    assert "no Docker daemon answers" in result.stderr
    assert "sudo scripts/setup-host.sh" in result.stderr
    docker_client()  # and the real one does answer


def test_tag_templates(tmp_path: Path) -> None:
    project = tmp_path / "project"
    write_spec(
        project,
        "vllm",
        {
            "repo": "x",
            "package_dir": "vllm",
            "tags": [
                "reg.example:5000/spark/{engine}:{version}-{tree_short}",
                "spark/{build}:{engine}",
            ],
            "builds": {
                "v-0.33": {"ref": "v0.33.0"},
                "bad": {"ref": "v0.33.0", "tags": ["x:{nope}"]},
            },
        },
    )
    builds = load_builds(Settings(project_dir=project))
    assert render_tags(builds["v-0.33"], "0123456789abcdef") == (
        "reg.example:5000/spark/vllm:0.33.0-0123456789ab",
        "spark/v-0.33:vllm",
    )
    with pytest.raises(SparkbuildError) as info:
        render_tags(builds["bad"], "0123456789abcdef")
    assert "x:{nope}" in info.value.message and "unknown placeholder" in info.value.message
    assert info.value.hint and "{tree_short}" in info.value.hint


def test_engine_selects_builds_of_that_engine(tmp_path: Path) -> None:
    project = tmp_path / "project"
    write_spec(
        project,
        "sglang",
        {
            "repo": str(tmp_path / "none.git"),
            "package_dir": "python/sglang",
            "builds": {"s": {"ref": "v0.5.12"}},
        },
    )
    none = sparkbuild(project, tmp_path / "cache", "build", "--engine", "vllm")
    assert none.exit_code == 2
    assert "no vllm builds" in none.stderr
    wrong = sparkbuild(project, tmp_path / "cache", "build", "s", "--engine", "vllm")
    assert wrong.exit_code == 2
    assert "s is not a vllm build" in wrong.stderr
