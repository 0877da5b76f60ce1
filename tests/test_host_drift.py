"""Drift between a cluster's nodes, named before anything starts (engines/host_watch), on
real nodes that differ: a second Docker daemon on this host, started in a mount namespace of
its own whose /etc/os-release, /etc/dgx-release and /proc/driver/nvidia/version are a DGX
Spark's (tests/data/hosts/gb10; tests/support/cluster_env.second_daemon). Its daemon reports
that OS, and the reader container it starts reads that driver and DGX OS: the node is a
Spark in every file sparkbuild reads, beside this host, which has no NVIDIA driver.

The image under test is the 35 kB skeleton (tests/support/smoke_image), its shell from the
host's /usr as the cluster profile mounts it: copying it to the second daemon is instant, and
nothing here needs the engine to run.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

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
from tests.support.smoke_cli import run_smoke_cli
from tests.support.smoke_image import skeleton_image
from tests.support.vllm_image import MODEL_IN_IMAGE, os_mounts

pytestmark = pytest.mark.docker

GB10 = Path(__file__).parent / "data" / "hosts" / "gb10"
SPARK_FILES = ("/etc/os-release", "/etc/dgx-release", "/proc/driver/nvidia/version")


@pytest.fixture(scope="module")
def spark_node() -> Iterator[SecondDaemon]:
    files = {path: (GB10 / path.lstrip("/")).read_bytes() for path in SPARK_FILES}
    with second_daemon(files) as daemon:
        yield daemon


@pytest.fixture(scope="module")
def network() -> Iterator[Network]:
    with bridge_network() as made:
        yield made


def _project(tmp_path: Path, network: Network, node: SecondDaemon) -> str:
    """Two nodes, this host and the Spark; ranks that exit at once if they ever start (the
    shell from the host's /usr), on the hosts' own networks; a lock pinning the skeleton."""
    container = {"gpus": "none", "launcher": ["sh", "-c", "exit 3"], "mounts": os_mounts()}
    _, name = write_cluster_project(
        tmp_path, network, endpoints=("local", node.endpoint), container=container
    )
    cluster_file = tmp_path / "clusters" / f"{name}.yaml"
    cluster = yaml.safe_load(cluster_file.read_text())
    cluster["fabric"]["network"] = "host"
    cluster_file.write_text(yaml.safe_dump(cluster))
    image_id = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Id}}", skeleton_image()],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    lock = {"schema": 1, "builds": {"skel": {"image": {"image_id": image_id}}}}
    (tmp_path / "images.lock").write_text(yaml.safe_dump(lock))
    return name


def _nothing_on(name: str, node: SecondDaemon) -> bool:
    readers = node.docker("ps", "-aq", "--filter", "label=org.sparkbuild.reader")
    return (
        not cluster_containers(name)
        and not cluster_containers(name, node.endpoint)
        and (not readers.split())
    )


def test_a_node_on_another_driver_is_refused_before_anything_starts(
    tmp_path: Path, network: Network, spark_node: SecondDaemon
) -> None:
    name = _project(tmp_path, network, spark_node)

    run = run_smoke_cli(
        tmp_path, "--image", skeleton_image(), "--profile", "cpu-tp2", "--cluster", name,
        "--model", MODEL_IN_IMAGE, timeout=300,
    )  # fmt: skip

    assert run.returncode == 2, run.explain()
    assert (
        f"cluster {name}: NVIDIA driver differs between the nodes: node-1 none, node-2 "
        "580.126.09: nothing was started"
    ) in run.stderr, run.stderr
    assert "--allow-host-drift" in run.stderr
    assert run.result is None  # refused: no verdict
    assert _nothing_on(name, spark_node)


def test_allowed_drift_runs_and_the_verdict_says_so(
    tmp_path: Path, network: Network, spark_node: SecondDaemon
) -> None:
    name = _project(tmp_path, network, spark_node)

    run = run_smoke_cli(
        tmp_path, "--image", skeleton_image(), "--profile", "cpu-tp2", "--cluster", name,
        "--model", MODEL_IN_IMAGE, "--allow-host-drift", "--record", "skel", timeout=300,
    )  # fmt: skip

    # The ranks ran (and exited at once, by design): the drift did not stop the run.
    assert run.returncode == 1 and run.result is not None, run.explain()
    assert "exited with status 3" in run.check("boot")["detail"]
    host = run.result["host"]
    assert host["drift_allowed"] is True
    assert host["drift"] == [
        "NVIDIA driver differs between the nodes: node-1 none, node-2 580.126.09",
        "DGX OS differs between the nodes: node-1 none, node-2 DGX Spark 7.4.0",
    ]
    spark = host["nodes"][1]
    assert spark["node"] == "node-2" and spark["facts"]["os"] == "Ubuntu 24.04.3 LTS"
    assert spark["facts"]["driver"] == "580.126.09"
    assert spark["facts"]["dgx_os"] == "DGX Spark 7.4.0"
    assert "NVIDIA driver differs" in run.stderr and "running anyway" in run.stderr
    recorded = yaml.safe_load((tmp_path / "images.lock").read_text())["builds"]["skel"]
    (entry,) = next(iter(recorded["smoke"].values())).values()
    assert entry["hosts"]["drift_allowed"] is True and len(entry["hosts"]["drift"]) == 2
    assert [n["facts"].get("driver") for n in entry["hosts"]["nodes"]] == ["none", "580.126.09"]
    assert _nothing_on(name, spark_node)
