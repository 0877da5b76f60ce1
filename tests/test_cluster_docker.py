"""`sparkbuild smoke --cluster`: the real vLLM engine across two "nodes" on Docker endpoints.

Each node is a container of an image that holds the CPU vLLM venv and the tiny model
(tests/support/vllm_image.py), on a user-defined bridge network with its own address; both
are reached through the local daemon, named twice in the cluster file. The engine's own
multi-node runtime does the distribution: vLLM's mp executor, TP=2, gloo between the two
containers, `--headless` on rank 1. A second Docker daemon on this host stands for a node
whose store differs. x86_64 here: the Sparks' arm64 is not needed to prove the launcher.

The two-node pass over ssh:// (a real sshd on 127.0.0.1) is docs/cluster.md's demo block,
which tests/test_docs_commands.py runs as written: the suite's one passing two-node boot.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.cluster_env import (
    Network,
    SecondDaemon,
    bridge_network,
    cluster_containers,
    second_daemon,
    write_cluster_project,
)
from tests.support.smoke_cli import run_smoke_cli, run_under_a_floor
from tests.support.vllm_image import MODEL_IN_IMAGE, vllm_image

pytestmark = [pytest.mark.engine, pytest.mark.docker]


def _image_id(image: str, endpoint: str | None = None) -> str:
    host = ["--host", endpoint] if endpoint else []
    return subprocess.run(
        ["docker", *host, "image", "inspect", "--format", "{{.Id}}", image],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip


@pytest.fixture(scope="module")
def image() -> str:
    return vllm_image()


@pytest.fixture(scope="module")
def network() -> Iterator[Network]:
    with bridge_network() as made:
        yield made


def _pinned_project(project: Path, image: str, network: Network, **kwargs: Any) -> str:
    """The two-node profile, a cluster file, and a lock pinning ``image``."""
    _, cluster = write_cluster_project(project, network, **kwargs)
    lock = {"schema": 1, "builds": {"cpu": {"image": {"image_id": _image_id(image)}}}}
    (project / "images.lock").write_text(yaml.safe_dump(lock))
    return cluster


@pytest.fixture
def project(tmp_path: Path, image: str, network: Network) -> tuple[Path, str]:
    """A project with the two-node profile, a cluster file, and a lock pinning ``image``."""
    return tmp_path, _pinned_project(tmp_path, image, network)


@pytest.mark.parametrize(
    ("node", "role"),
    [("node-2", "worker rank 1"), ("node-1", "the leader")],
    ids=["worker", "leader"],
)
def test_a_rank_killed_mid_run_fails_naming_its_node_and_leaves_nothing(
    project: tuple[Path, str], image: str, node: str, role: str
) -> None:
    # A headless vLLM worker does not exit when its leader dies, and a leader waits on a dead
    # worker: either way the run must end, name the node, and remove the other rank too.
    project_dir, cluster_name = project
    out = project_dir / "result.json"
    argv = [sys.executable, "-m", "sparkbuild", "--project", str(project_dir), "smoke",
            "--image", image, "--profile", "cpu-tp2", "--cluster", cluster_name,
            "--model", MODEL_IN_IMAGE, "--json-file", str(out)]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "NO_COLOR": "1"})  # fmt: skip
    killed = threading.Event()
    stderr: list[str] = []

    def watch() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            stderr.append(line)
            if "request " in line and not killed.is_set():  # the requests have begun
                names = subprocess.run(
                    ["docker", "ps", "-q", "--filter", f"label=org.sparkbuild.node={node}",
                     "--filter", f"label=org.sparkbuild.cluster={cluster_name}"],
                    capture_output=True, text=True, check=False,
                ).stdout.split()  # fmt: skip
                for name in names:
                    subprocess.run(["docker", "kill", name], capture_output=True, check=False)
                killed.set()

    reader = threading.Thread(target=watch, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=1200)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        pytest.fail("the smoke run did not end after its worker was killed")
    reader.join(timeout=10)
    told = "".join(stderr)

    assert killed.is_set(), told[-3000:]
    assert proc.returncode == 1, told[-3000:]
    result = json.loads(out.read_text())
    assert result["verdict"] == "fail"
    assert result["cluster"]["failed"].startswith(f"{role} on node {node} exited")
    errors = next(c for c in result["checks"] if c["name"] == "errors")
    assert errors["status"] == "fail" and node in errors["detail"], errors
    assert node in told
    deadline = time.monotonic() + 30
    while cluster_containers(cluster_name) and time.monotonic() < deadline:
        time.sleep(1)
    assert cluster_containers(cluster_name) == []


def _host_bridge_up() -> bool:
    shown = subprocess.run(["ip", "link", "show", "docker0"], check=False, capture_output=True)
    return shown.returncode == 0


@pytest.fixture(scope="module")
def other_daemon() -> Iterator[SecondDaemon]:
    bridge_before = _host_bridge_up()
    with second_daemon() as daemon:
        yield daemon
    # A second dockerd must not take the host daemon's bridge with it when it stops.
    assert _host_bridge_up() == bridge_before


def test_a_node_holding_another_image_is_refused_before_boot(
    tmp_path: Path, image: str, network: Network, other_daemon: SecondDaemon
) -> None:
    # node-2's daemon holds another image under the same reference.
    other_daemon.docker("import", "--change", "LABEL org.sparkbuild.test=other", "-", image,
                        input_bytes=_empty_tar())  # fmt: skip
    other_id = _image_id(image, other_daemon.endpoint)
    assert other_id != _image_id(image)
    _, name = write_cluster_project(tmp_path, network, endpoints=("local", other_daemon.endpoint))
    began = time.monotonic()

    run = run_smoke_cli(
        tmp_path, "--image", image, "--profile", "cpu-tp2", "--cluster", name,
        "--model", MODEL_IN_IMAGE, timeout=300,
    )  # fmt: skip

    assert run.returncode == 1, run.explain()
    assert "node node-2" in run.stderr and other_id[:19] in run.stderr, run.stderr
    assert "holds another image" in run.stderr
    assert time.monotonic() - began < 120  # refused, not booted and timed out
    assert cluster_containers(name) == []
    assert cluster_containers(name, endpoint=other_daemon.endpoint) == []


def test_a_node_without_the_image_receives_it_over_the_docker_api(
    other_daemon: SecondDaemon,
) -> None:
    from sparkbuild.engines.cluster import Node
    from sparkbuild.engines.cluster_target import sync_image
    from tests.support.smoke_image import skeleton_image

    small = skeleton_image()  # 35 kB: the path is the same for a 10 GB image
    pin = _image_id(small)
    nodes = [Node(name="here", address="10.0.0.1"),
             Node(name="there", endpoint=other_daemon.endpoint, address="10.0.0.2")]  # fmt: skip
    told: list[str] = []

    held = sync_image(nodes, small, pin, progress=told.append)

    assert [(n.node, n.image_id) for n in held] == [("here", pin), ("there", pin)]
    assert _image_id(small, other_daemon.endpoint) == pin  # same id, under the same name
    assert any(line.startswith("there: no copy of") for line in told), told
    assert any(line.startswith("there: received") for line in told), told
    assert not any(line.startswith("here: no copy") for line in told)


def test_a_node_without_the_image_pulls_it_by_digest_from_a_registry(
    tmp_path: Path, other_daemon: SecondDaemon
) -> None:
    from sparkbuild.engines.cluster import Node
    from sparkbuild.engines.cluster_target import sync_image
    from tests.support.docker_env import start_registry

    # An image of its own (a pushed image gains a digest, which the shared ones must not),
    # pushed to a real registry on loopback that the second daemon reaches as well.
    repository = f"sb-pull-{uuid.uuid4().hex[:8]}"
    image = f"{repository}:test"
    subprocess.run(["docker", "import", "--change", f"LABEL org.sparkbuild.test={image}", "-",
                    image], input=_empty_tar(), capture_output=True, check=True)  # fmt: skip
    pin = _image_id(image)
    try:
        with start_registry(tmp_path / "registry") as registry:
            pushed = registry.ref(repository, "test")
            subprocess.run(["docker", "tag", image, pushed], check=True)
            subprocess.run(["docker", "push", pushed], capture_output=True, check=True)
            nodes = [Node(name="there", endpoint=other_daemon.endpoint, address="10.0.0.2")]
            told: list[str] = []

            held = sync_image(nodes, image, pin, progress=told.append)

            served = registry.manifest_digest(repository, "test")
    finally:
        subprocess.run(["docker", "rmi", "-f", pin], capture_output=True, check=False)

    assert [(n.node, n.image_id) for n in held] == [("there", pin)]
    assert _image_id(image, other_daemon.endpoint) == pin  # same id, under the same name
    assert served is not None
    assert f"there: pulling {registry.address}/{repository}@{served}" in told, told
    assert not any("sending it over the Docker API" in line for line in told), told


# `python -m sparkbuild`, with Ctrl-C raising KeyboardInterrupt as in a terminal: a job
# started in the background (as CI may start pytest) inherits SIGINT ignored.
CTRL_C_AS_FROM_A_TERMINAL = (
    "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "sys.argv[0] = 'sparkbuild'; runpy.run_module('sparkbuild', run_name='__main__')"
)


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_a_cluster_run_stopped_or_killed_mid_boot_leaves_nothing_on_any_node(
    project: tuple[Path, str], image: str, how: signal.Signals
) -> None:
    project_dir, name = project
    proc = subprocess.Popen(
        [sys.executable, "-c", CTRL_C_AS_FROM_A_TERMINAL, "--project", str(project_dir),
         "smoke", "--image", image, "--profile", "cpu-tp2", "--cluster", name,
         "--model", MODEL_IN_IMAGE],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while len(cluster_containers(name)) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert len(cluster_containers(name)) == 2, "both ranks should have started"

    proc.send_signal(how)
    proc.wait(timeout=120)
    deadline = time.monotonic() + 60  # a SIGKILL leaves it to each container's lifeline
    while cluster_containers(name) and time.monotonic() < deadline:
        time.sleep(1)

    assert cluster_containers(name) == []


def test_a_cluster_smaller_than_the_profile_is_refused_naming_both_numbers(
    tmp_path: Path, image: str, network: Network
) -> None:
    _, name = write_cluster_project(tmp_path, network, parallel={"nodes": 4, "tp": 4})

    run = run_smoke_cli(
        tmp_path, "--image", image, "--profile", "cpu-tp2", "--cluster", name,
        "--model", MODEL_IN_IMAGE, timeout=120,
    )  # fmt: skip

    assert run.returncode == 2, run.explain()
    assert "needs 4 nodes" in run.stderr and f"cluster {name} has 2" in run.stderr, run.stderr
    assert cluster_containers(name) == []


def _empty_tar() -> bytes:
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("etc")
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
    return buffer.getvalue()


def test_a_floor_just_under_the_free_memory_stops_every_rank_at_once(
    project: tuple[Path, str], image: str
) -> None:
    # Both ranks on this host's daemon: the guard samples it for each node, and stops the
    # cluster whole (every rank's container killed together) the moment one falls under.
    project_dir, name = project

    _, run = run_under_a_floor(
        project_dir, "--image", image, "--profile", "cpu-tp2", "--cluster", name,
        "--model", MODEL_IN_IMAGE,
    )  # fmt: skip

    assert run.returncode == 1, run.explain()
    guard = run.check("host-memory")
    assert guard["status"] == "fail", run.explain()
    assert run.result is not None
    stopped = run.result["host"]["memory"]["stopped"]
    assert stopped is not None and stopped["node"] in ("node-1", "node-2"), stopped
    assert f"MemAvailable on {stopped['node']} fell to" in guard["detail"]
    assert stopped["what"].startswith("containers sparkbuild-smoke-"), stopped
    assert stopped["what"].count("sparkbuild-smoke-") == 2  # both ranks, together
    assert stopped["gone_after_s"] is not None and stopped["gone_after_s"] < 1.0, stopped
    nodes = [n["node"] for n in run.result["host"]["memory"]["nodes"]]
    assert nodes == ["node-1", "node-2"]
    assert [n["node"] for n in run.result["host"]["nodes"]] == ["node-1", "node-2"]
    assert run.result["host"]["drift"] == []
    assert cluster_containers(name) == []
