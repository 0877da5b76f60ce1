"""Two "nodes" on this machine for cluster tests: a user-defined Docker bridge network that
gives each rank's container its own address, a second Docker daemon (another endpoint with
its own image store), and a project with a two-node CPU profile and a cluster file.

The network and the daemon exist only for the test that made them: both are removed (the
daemon stopped by its pid) when its context ends, whatever happened.
"""

from __future__ import annotations

import contextlib
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

if __name__ == "__main__" and not __package__:  # run by path: make `tests` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support.smoke_cli import CPU_REFERENCE, without_deep_checks
from tests.support.vllm_image import MODEL_IN_IMAGE, os_mounts

__all__ = [
    "Network",
    "SecondDaemon",
    "bridge_network",
    "cluster_containers",
    "second_daemon",
    "write_cluster_project",
]


@dataclass(frozen=True)
class Network:
    name: str
    prefix: str  # "10.213.42": the nodes get .10, .11, ...

    def address(self, index: int) -> str:
        return f"{self.prefix}.{10 + index}"


@contextlib.contextmanager
def bridge_network() -> Iterator[Network]:
    """A user-defined bridge network with a subnet of its own (fixed rank addresses need
    one); a /24 picked at random from 10.213.0.0/16, another tried when one is taken."""
    network = make_bridge_network()
    try:
        yield network
    finally:
        remove_network(network.name)


def remove_network(name: str) -> None:
    subprocess.run(["docker", "network", "rm", name], capture_output=True, check=False)


def make_bridge_network() -> Network:
    name = f"sparkbuild-test-{uuid.uuid4().hex[:8]}"
    for _ in range(20):
        prefix = f"10.213.{random.randrange(1, 255)}"
        done = subprocess.run(
            ["docker", "network", "create", "--driver", "bridge", "--subnet", f"{prefix}.0/24",
             name], capture_output=True, text=True, check=False,
        )  # fmt: skip
        if done.returncode == 0:
            break
        if "overlap" not in done.stderr.lower():
            raise RuntimeError(f"docker network create failed: {done.stderr.strip()}")
    else:
        raise RuntimeError("no free /24 in 10.213.0.0/16 for the test network")
    return Network(name, prefix)


@dataclass(frozen=True)
class SecondDaemon:
    endpoint: str  # unix:///tmp/.../docker.sock

    def docker(self, *args: str, input_bytes: bytes | None = None) -> str:
        done = subprocess.run(
            ["docker", "--host", self.endpoint, *args], input=input_bytes,
            capture_output=True, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"docker {' '.join(args)}: {done.stderr.decode()[-500:]}")
        return done.stdout.decode()


@contextlib.contextmanager
def _own_bridge() -> Iterator[str]:
    """A bridge of the second daemon's own. Not ``--bridge none``: a dockerd started so
    deletes the host's docker0 (moby's removeDefaultBridgeInterface), and with it the network
    of every container the host's own daemon starts afterwards."""
    name = f"sbd2-{uuid.uuid4().hex[:8]}"  # at most 15 characters, as Linux wants
    subnet = f"10.231.{random.randrange(1, 255)}.1/24"
    subprocess.run(["ip", "link", "add", name, "type", "bridge"], check=True)
    try:
        subprocess.run(["ip", "addr", "add", subnet, "dev", name], check=True)
        subprocess.run(["ip", "link", "set", name, "up"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "link", "del", name], check=False, capture_output=True)


@contextlib.contextmanager
def second_daemon(host_files: Mapping[str, bytes] | None = None) -> Iterator[SecondDaemon]:
    """Another dockerd on this host (its own containerd, image store, socket and bridge; no
    iptables): a second node's Docker endpoint. Stopped by its pid afterwards.

    ``host_files`` makes it a node that differs: paths under ``/etc`` and ``/proc/driver``
    with the bytes that node has there (an ``/etc/os-release``, an ``/etc/dgx-release``, an
    NVIDIA driver's ``/proc/driver/nvidia/version``). The daemon then runs in a mount
    namespace of its own (``unshare --mount``) where ``/etc`` is an overlay holding them and
    ``/proc/driver`` a tmpfs: what it reports of its host (``/info``) and every bind mount it
    makes are that node's; nothing changes for this host."""
    root = Path(tempfile.mkdtemp(prefix="sb-d2-", dir="/tmp"))  # a socket path stays short
    socket = root / "docker.sock"
    log = (root / "dockerd.log").open("wb")
    with contextlib.ExitStack() as stack:
        bridge = stack.enter_context(_own_bridge())
        dockerd = ["dockerd", "--data-root", str(root / "data"), "--exec-root",
                   str(root / "exec"), "--pidfile", str(root / "dockerd.pid"), "--host",
                   f"unix://{socket}", "--bridge", bridge, "--iptables=false",
                   "--ip6tables=false", "--ip-masq=false"]  # fmt: skip
        argv = _in_own_mounts(root, host_files, dockerd) if host_files else dockerd
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        daemon = SecondDaemon(f"unix://{socket}")
        try:
            deadline = time.monotonic() + 60
            while True:
                with contextlib.suppress(RuntimeError):
                    daemon.docker("version")
                    break
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the second dockerd did not start:\n{_tail(root)}")
                time.sleep(0.5)
            yield daemon
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()
            shutil.rmtree(root, ignore_errors=True)


def _in_own_mounts(root: Path, files: Mapping[str, bytes], command: list[str]) -> list[str]:
    """``command`` in a private mount namespace where ``files`` are what this host has."""
    steps = ["set -e"]
    etc = {p: b for p, b in files.items() if p.startswith("/etc/")}
    driver = {p: b for p, b in files.items() if p.startswith("/proc/driver/")}
    if etc:
        upper, work = root / "etc-upper", root / "etc-work"
        for path, data in etc.items():
            placed = upper / path.removeprefix("/etc/")
            placed.parent.mkdir(parents=True, exist_ok=True)
            placed.write_bytes(data)
        work.mkdir()
        steps.append(
            f"mount -t overlay overlay -o lowerdir=/etc,upperdir={upper},workdir={work} /etc"
        )
    if driver:
        staged = root / "proc-driver"
        steps.append("mount -t tmpfs tmpfs /proc/driver")
        for path, data in driver.items():
            source = staged / path.removeprefix("/proc/driver/")
            source.parent.mkdir(parents=True, exist_ok=True)
            source.write_bytes(data)
            steps.append(f"mkdir -p {shlex.quote(str(Path(path).parent))}")
            steps.append(f"cp {shlex.quote(str(source))} {shlex.quote(path)}")
    steps.append("exec " + shlex.join(command))
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", "\n".join(steps)]


def _tail(root: Path) -> str:
    path = root / "dockerd.log"
    return "\n".join(path.read_text(errors="replace").splitlines()[-20:]) if path.exists() else ""


def write_cluster_project(
    project: Path,
    network: Network,
    endpoints: tuple[str, str] = ("local", "local"),
    **profile_changes: Any,
) -> tuple[str, str]:
    """``smoke/cpu-tp2.yaml`` (the CPU reference over two nodes: TP=2, ``vllm serve`` in the
    image, n-gram speculation) and ``clusters/pair-<random>.yaml`` (two nodes on ``network``,
    each rank's OpenMP threads on its own core; the name labels the containers, so no other
    run's are mistaken for this one's). Returns (profile, cluster) names."""
    profile = yaml.safe_load(CPU_REFERENCE.read_text(encoding="utf-8"))
    profile.update(
        description="vLLM on the CPU over two nodes (TP=2, mp executor), n-gram speculation",
        model=MODEL_IN_IMAGE,
        parallel={"nodes": 2, "tp": 2},
    )
    # Two prompts that ask for repetition, so the n-gram drafter has something to accept:
    # the cluster is what is under test here, and every request costs seconds on 2 cores.
    profile["prompts"] = ["repetitive"]
    # 48 tokens, as the CPU reference: random weights may spend a shorter completion on byte
    # tokens that decode to nothing, which the output check rightly calls empty (seen at 32
    # over TP=2, on repetitive/echo).
    # The two-node path is under test, not the deep checks (tests/test_smoke_deep_vllm_cpu.py).
    profile = without_deep_checks(profile)
    profile["expect"].update(boot_timeout_s=600, request_timeout_s=180, max_tokens=48)
    profile["container"] = {
        "gpus": "none",
        "launcher": ["vllm", "serve"],
        "mounts": os_mounts(),
        # A private /dev/shm per rank, as on separate machines (vLLM wants 160 MiB of it).
        "ipc": "private",
        "shm_size": "1g",
    }
    profile.update(profile_changes)
    (project / "smoke").mkdir(parents=True, exist_ok=True)
    (project / "smoke" / "cpu-tp2.yaml").write_text(yaml.safe_dump(profile, sort_keys=False))
    cluster = {
        "description": "two containers on one bridge network, through Docker endpoints",
        "nodes": [
            {"name": f"node-{i + 1}", "endpoint": endpoint, "address": network.address(i),
             "env": {"VLLM_CPU_OMP_THREADS_BIND": str(i)}}
            for i, endpoint in enumerate(endpoints)
        ],
        "fabric": {"network": network.name, "env": {"GLOO_SOCKET_IFNAME": "eth0"}},
    }  # fmt: skip
    name = f"pair-{uuid.uuid4().hex[:8]}"
    (project / "clusters").mkdir(parents=True, exist_ok=True)
    (project / "clusters" / f"{name}.yaml").write_text(yaml.safe_dump(cluster, sort_keys=False))
    return "cpu-tp2", name


def cluster_containers(label_value: str, endpoint: str | None = None) -> list[str]:
    """Names of containers (any state) labelled with cluster ``label_value``."""
    host = ["--host", endpoint] if endpoint else []
    done = subprocess.run(
        ["docker", *host, "ps", "-a", "--filter", f"label=org.sparkbuild.cluster={label_value}",
         "--format", "{{.Names}}"], capture_output=True, text=True, check=False,
    )  # fmt: skip
    return done.stdout.split()


# --- `python tests/support/cluster_env.py start|stop DIR`: docs/cluster.md's demo ---------------

_STATE = ".cluster-network"  # in DIR: the network to remove on stop


def start_demo(project: Path, worker_endpoint: str) -> dict[str, str]:
    """A two-node project in ``project`` (the leader on this host's daemon, the worker at
    ``worker_endpoint``) on a new bridge network, a lock pinning the CPU image as build
    ``cpu``, and the image itself: what ``smoke --cluster`` needs. Returns the exports."""
    from tests.support.vllm_image import MODEL_IN_IMAGE, vllm_image

    image = vllm_image()
    project.mkdir(parents=True, exist_ok=True)
    network = make_bridge_network()
    (project / _STATE).write_text(network.name + "\n", encoding="utf-8")
    _, cluster = write_cluster_project(project, network, endpoints=("local", worker_endpoint))
    image_id = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Id}}", image],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    lock = {"schema": 1, "builds": {"cpu": {"image": {"image_id": image_id}}}}
    (project / "images.lock").write_text(yaml.safe_dump(lock), encoding="utf-8")
    return {"CLUSTER": cluster, "CPU_IMAGE": image, "CPU_MODEL": MODEL_IN_IMAGE}


def stop_demo(project: Path) -> None:
    state = project / _STATE
    if state.is_file():
        remove_network(state.read_text(encoding="utf-8").strip())
        state.unlink()


def main(argv: list[str]) -> int:
    """``start DIR ENDPOINT``: prints the exports; ``stop DIR``: removes the network."""
    wanted = {"start": 3, "stop": 2}
    if not argv or wanted.get(argv[0]) != len(argv):
        usage = "usage: python tests/support/cluster_env.py start DIR ENDPOINT | stop DIR"
        print(usage, file=sys.stderr)
        return 2
    project = Path(argv[1]).absolute()
    if argv[0] == "stop":
        stop_demo(project)
        return 0
    try:
        exports = start_demo(project, argv[2])
    except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
        print(f"error: the two-node demo could not be set up: {exc}", file=sys.stderr)
        stop_demo(project)
        return 1
    print("".join(f"export {k}={shlex.quote(v)}\n" for k, v in exports.items()), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
