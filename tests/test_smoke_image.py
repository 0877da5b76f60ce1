"""`sparkbuild smoke --image`: the real vLLM engine inside a real container.

The image is a skeleton root filesystem with the host's /usr, the pyenv Python and the vLLM
venv bind-mounted read-only (tests/support/smoke_image.py): no registry needed, and what
runs is the real engine in its own namespaces, reached through a port published on
127.0.0.1. Needs the Docker engine that `scripts/setup-host.sh` starts.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from sparkbuild.engines.lifeline import owner_alive
from tests.support.smoke_cli import run_smoke_cli, write_profile
from tests.support.smoke_image import engine_mounts, skeleton_image
from tests.support.vllm_cpu import tiny_llama, vllm_cpu_venv

pytestmark = [pytest.mark.engine, pytest.mark.docker]


def _docker(*args: str) -> str:
    try:
        done = subprocess.run(["docker", *args], capture_output=True, text=True, check=False)
    except FileNotFoundError:
        pytest.fail("no docker client: run `sudo bash scripts/setup-host.sh`")
    if done.returncode != 0:
        pytest.fail(
            f"docker {' '.join(args)} failed: {done.stderr.strip()}\n"
            "start the engine with `sudo bash scripts/setup-host.sh`"
        )
    return done.stdout


@pytest.fixture(scope="module")
def image() -> str:
    _docker("version")
    return skeleton_image()


def _smoke_containers() -> set[str]:
    """Smoke containers whose sparkbuild process has ended: what a run left behind. Those
    of runs still going (another test, on another worker) are theirs to remove."""
    ids = _docker("ps", "-aq", "--filter", "label=org.sparkbuild.stage=smoke").split()
    labelled = {cid: _labels_of(cid) for cid in ids}
    return {
        cid
        for cid, labels in labelled.items()
        if labels is not None and owner_alive(labels) is not True
    }


def _labels_of(container: str) -> dict[str, str] | None:
    """The container's labels; None once it is gone (removed since it was listed)."""
    done = subprocess.run(
        ["docker", "inspect", "--format", "{{json .Config.Labels}}", container],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    text = done.stdout.strip()
    if done.returncode != 0:
        return None
    return json.loads(text) if text not in ("", "null") else {}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    venv = vllm_cpu_venv()
    write_profile(
        tmp_path,
        "ctr",
        container={
            "gpus": "all",  # the default; this host has no GPU, so tests pass --gpus none
            "launcher": [str(venv / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server"],
            "mounts": engine_mounts(venv),
        },
    )
    return tmp_path


def test_image_pass_records_under_the_tested_image_id(project: Path, image: str) -> None:
    image_id = _docker("image", "inspect", "--format", "{{.Id}}", image).strip()
    lock = project / "images.lock"
    lock.write_text(
        yaml.safe_dump({"schema": 1, "builds": {"cpu": {"image": {"image_id": image_id}}}})
    )
    before = _smoke_containers()

    run = run_smoke_cli(
        project, "--image", image, "--gpus", "none", "--profile", "ctr",
        "--model", str(tiny_llama()), "--record", "cpu",
    )  # fmt: skip

    assert run.returncode == 0, run.explain()
    assert run.result is not None and run.result["verdict"] == "pass"
    assert run.result["target"] == {"kind": "image", "value": image, "image_id": image_id}
    assert run.check("boot")["status"] == "pass"
    assert run.check("accept_len")["status"] == "pass" and run.result["accept_len"] > 1.0
    assert run.check("nan")["status"] == "pass"
    assert _smoke_containers() == before, "the smoke container was not removed"
    log_file = Path(run.result["log_file"])
    assert "Starting vLLM server on" in log_file.read_text(encoding="utf-8")
    smoke = yaml.safe_load(lock.read_text())["builds"]["cpu"]["smoke"]
    assert smoke[image_id]["ctr"]["verdict"] == "pass"
    assert smoke[image_id]["ctr"]["target"] == f"image:{image}"
    # The id read from the container that ran, so publish counts this verdict.
    assert smoke[image_id]["ctr"]["verified"] is True
    assert smoke[image_id]["ctr"]["image_id"] == image_id


def test_image_boot_failure_keeps_container_logs_and_removes_it(project: Path, image: str) -> None:
    path = project / "smoke" / "ctr.yaml"
    data = yaml.safe_load(path.read_text())
    data["args"] = [*data["args"], "--no-such-flag-for-sparkbuild"]
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    before = _smoke_containers()

    run = run_smoke_cli(
        project, "--image", image, "--gpus", "none", "--profile", "ctr",
        "--model", str(tiny_llama()),
    )  # fmt: skip

    assert run.returncode == 1, run.explain()
    assert run.result is not None
    boot = run.check("boot")
    assert boot["status"] == "fail" and "exited with status" in boot["detail"], boot
    assert any("--no-such-flag-for-sparkbuild" in line for line in run.result["log_excerpt"])
    assert [d["id"] for d in run.result["diagnoses"]] == ["unknown-engine-flag"]
    assert _smoke_containers() == before


def test_default_gpu_flags_fail_clearly_without_gpus(project: Path, image: str) -> None:
    # `--gpus all` is the default for real Spark hosts; here no GPU runtime exists.
    before = _smoke_containers()
    run = run_smoke_cli(project, "--image", image, "--profile", "ctr", "--model", "m")
    assert run.returncode == 1
    assert "cannot start a container" in run.stderr and "--gpus" in run.stderr
    assert _smoke_containers() == before


def test_record_refuses_an_image_that_is_not_the_pinned_one(project: Path, image: str) -> None:
    lock = project / "images.lock"
    pinned = {"schema": 1, "builds": {"cpu": {"image": {"image_id": "sha256:" + "0" * 64}}}}
    lock.write_text(yaml.safe_dump(pinned))
    run = run_smoke_cli(
        project, "--image", image, "--gpus", "none", "--profile", "ctr", "--model", "m",
        "--record", "cpu",
    )  # fmt: skip
    assert run.returncode == 1 and run.result is None
    assert "is not build 'cpu''s image in images.lock" in run.stderr
    assert yaml.safe_load(lock.read_text()) == pinned
