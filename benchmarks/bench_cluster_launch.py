"""What `--cluster` adds to a two-node launch, measured in the same run.

Both sides start the same two ranks of the same image on the same user-defined bridge
network (tests/support/cluster_env.py, tests/support/vllm_image.py): vLLM 0.32 on the CPU,
TP=2 over its mp executor, rank 1 `--headless`. The time is from the command to the leader's
first 200 on /health.

- **Reference**: the engine's own two-process launch, as a user types it: `docker run` of
  rank 1, then of rank 0, with the same arguments the adapter renders (so only the launcher
  differs). No image check, no labels, no lifelines, no log streaming.
- **Measured**: `sparkbuild smoke --image ... --cluster NAME`, from process start, with the
  leader's port read from its container as soon as it exists.

Rounds alternate (reference, measured, reference, ...) so both see the same host load. The
smoke run is stopped (SIGTERM, its own teardown) once its leader is ready.

    python benchmarks/bench_cluster_launch.py [--rounds N]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.cluster_env import Network, bridge_network, write_cluster_project  # noqa: E402
from tests.support.vllm_image import MODEL_IN_IMAGE, vllm_image  # noqa: E402

from sparkbuild.adapters import RankPlace, adapter_for  # noqa: E402
from sparkbuild.engines.profiles import load_profile  # noqa: E402
from sparkbuild.settings import Settings  # noqa: E402

TIMEOUT_S = 900.0


def _wait_healthy(port_of: object, started: float) -> float:
    session = requests.Session()
    while time.monotonic() - started < TIMEOUT_S:
        port = port_of() if callable(port_of) else port_of
        if port:
            try:
                if session.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    return time.monotonic() - started
            except requests.RequestException:
                pass
        time.sleep(0.2)
    raise RuntimeError("the leader was not ready in time")


def _published_port(name_filter: list[str]) -> int | None:
    names = subprocess.run(["docker", "ps", "-q", *name_filter], capture_output=True, text=True,
                           check=False).stdout.split()  # fmt: skip
    for name in names:
        out = subprocess.run(["docker", "port", name, "8000/tcp"], capture_output=True,
                             text=True, check=False).stdout.strip()  # fmt: skip
        if out:
            return int(out.splitlines()[0].rsplit(":", 1)[1])
    return None


def reference(project: Path, network: Network, image: str) -> float:
    """The engine's own launch: two `docker run`s with the adapter's rank arguments."""
    _, profile = load_profile(Settings(project_dir=project), "cpu-tp2", model=MODEL_IN_IMAGE)
    adapter = adapter_for("vllm")
    serve = adapter.serve_args(MODEL_IN_IMAGE, "0.0.0.0", 8000, profile.args)
    tag = uuid.uuid4().hex[:8]
    names = [f"bench-ref-{tag}-{rank}" for rank in range(2)]
    started = time.monotonic()
    try:
        for rank in (1, 0):
            place = RankPlace(rank, 2, network.address(0), 29511, network.address(rank))
            command = adapter.rank_command(["vllm", "serve"], serve, profile.parallel, place)
            env = {**profile.env, "GLOO_SOCKET_IFNAME": "eth0",
                   "VLLM_CPU_OMP_THREADS_BIND": str(rank)}  # fmt: skip
            subprocess.run(
                ["docker", "run", "-d", "--name", names[rank], "--network", network.name,
                 "--ip", network.address(rank), "--shm-size", "1g", "-v", "/usr:/usr:ro",
                 *(["-p", "127.0.0.1::8000"] if rank == 0 else []),
                 *(f"-e{k}={v}" for k, v in env.items()),
                 "--entrypoint", command.entrypoint[0], image, *command.args],
                capture_output=True, check=True,
            )  # fmt: skip
        return _wait_healthy(lambda: _published_port(["--filter", f"name={names[0]}"]), started)
    finally:
        subprocess.run(["docker", "rm", "-f", *names], capture_output=True, check=False)


def measured(project: Path, cluster: str, image: str) -> float:
    """`sparkbuild smoke --cluster`, from process start to the leader's first 200."""
    argv = [sys.executable, "-m", "sparkbuild", "--project", str(project), "smoke",
            "--image", image, "--profile", "cpu-tp2", "--cluster", cluster,
            "--model", MODEL_IN_IMAGE]  # fmt: skip
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "NO_COLOR": "1"})  # fmt: skip
    leader = ["--filter", f"label=org.sparkbuild.cluster={cluster}",
              "--filter", "label=org.sparkbuild.node=node-1"]  # fmt: skip
    try:
        return _wait_healthy(lambda: _published_port(leader), started)
    finally:
        proc.send_signal(signal.SIGTERM)  # its own teardown removes both containers
        proc.wait(timeout=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    image = vllm_image()
    with bridge_network() as network, tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp)
        _, cluster = write_cluster_project(project, network)
        refs: list[float] = []
        ours: list[float] = []
        for round_ in range(args.rounds):
            refs.append(reference(project, network, image))
            ours.append(measured(project, cluster, image))
            load = os.getloadavg()[0]
            ratio = ours[-1] / refs[-1]
            print(f"round {round_ + 1}: reference {refs[-1]:.1f} s, sparkbuild {ours[-1]:.1f} s "
                  f"(ratio {ratio:.3f}; load average {load:.1f})", flush=True)  # fmt: skip
    ref, our = statistics.median(refs), statistics.median(ours)
    print(
        f"median: reference {ref:.1f} s, sparkbuild --cluster {our:.1f} s, "
        f"ratio {our / ref:.3f} (aim <= 1.15)"
    )


if __name__ == "__main__":
    main()
