"""Clusters without an engine: cluster files, parallel layouts, each engine's multi-node
command line, topology in claims, and what publish counts of a cluster verdict."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import yaml

from sparkbuild import lockfile
from sparkbuild.adapters import RankPlace, adapter_for
from sparkbuild.bench.claims import load_claims
from sparkbuild.bench.claims_report import compare_claims
from sparkbuild.bench.results import BenchReport, CellResult, RunFigures, cell_stats
from sparkbuild.engines.cluster import load_cluster
from sparkbuild.engines.profiles import Parallel
from sparkbuild.errors import SpecError, UsageError
from sparkbuild.publish.gate import smoke_verdicts
from sparkbuild.settings import Settings
from sparkbuild.spec import Build
from tests.support.cli import run_cli

REPO = Path(__file__).resolve().parents[1]
PIN = "sha256:" + "1" * 64
OTHER = "sha256:" + "2" * 64


def _cluster(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "clusters" / "c.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.mark.parametrize("name", ["spark-pair", "spark-ring-4", "k3s-4"])
def test_the_shipped_cluster_files_load(name: str) -> None:
    _, spec = load_cluster(Settings(project_dir=REPO), name)

    assert spec.nodes[0].name == "spark-1" and len(spec.nodes) in (2, 4)
    assert spec.fabric.env["NCCL_SOCKET_IFNAME"] == "enp1s0f1np1"


@pytest.mark.parametrize(
    ("body", "line", "says"),
    [
        (
            "nodes:\n  - name: a\n    address: 10.0.0.1\n    endpoint: 'ssh://-oProxyCommand=x'\n",
            4,
            "not a host name",
        ),
        (
            "nodes:\n  - name: a\n    address: 10.0.0.1\n    endpoint: ftp://x:21\n",
            4,
            "scheme 'ftp'",
        ),
        ("nodes:\n  - name: a\n    adress: 10.0.0.1\n", 3, "did you mean 'address'"),
        (
            "nodes:\n  - {name: a, address: 10.0.0.1}\n  - {name: a, address: 10.0.0.2}\n",
            1,
            "named twice",
        ),
        ("nodes:\n  - {name: A_1, address: 10.0.0.1}\n", 2, "DNS label"),
        # issue 34: a finite but absurd wait crashed the run (kubectl's and Python's timeouts)
        (
            "nodes:\n  - {name: a, address: 10.0.0.1}\nkubernetes:\n  ready_timeout_s: 1e300\n",
            4,
            "kubernetes.ready_timeout_s: Input should be less than or equal to 604800",
        ),
        (
            "nodes:\n  - {name: a, address: 10.0.0.1}\nfabric:\n  env: {'NCCL IF': eth0}\n",
            4,
            "not an environment variable name",
        ),
    ],
)
def test_a_bad_cluster_file_names_the_file_line_and_field(
    tmp_path: Path, body: str, line: int, says: str
) -> None:
    path = _cluster(tmp_path, body)

    with pytest.raises(SpecError) as caught:
        load_cluster(Settings(project_dir=tmp_path), "c")

    assert f"{path}:" in caught.value.message and says in caught.value.message
    assert f"{path}:{line}" in caught.value.message, caught.value.message


def test_a_layout_whose_ranks_do_not_spread_over_its_nodes_is_refused() -> None:
    with pytest.raises(ValueError, match="do not spread evenly over 4 nodes"):
        Parallel(nodes=4, tp=2)
    with pytest.raises(ValueError, match="ep 3 does not divide tp 4"):
        Parallel(nodes=4, tp=4, ep=3)
    assert Parallel(nodes=2, tp=4, pp=1).label() == "nodes=2 tp=4 ep=1"


def _place(rank: int, nodes: int = 2) -> RankPlace:
    return RankPlace(rank, nodes, "10.0.0.1", 29501, f"10.0.0.{rank + 1}")


def test_vllm_mp_ranks_rendezvous_at_the_leader_and_workers_run_headless() -> None:
    adapter = adapter_for("vllm")
    serve = adapter.serve_args("/m", "0.0.0.0", 8000, ["--dtype", "bfloat16"])

    leader = adapter.rank_command(["vllm", "serve"], serve, Parallel(nodes=2, tp=2), _place(0))
    worker = adapter.rank_command(["vllm", "serve"], serve, Parallel(nodes=2, tp=2), _place(1))

    assert leader.entrypoint == ["vllm"] and leader.serves_http
    assert leader.args == [
        "serve", "/m", "--host", "0.0.0.0", "--port", "8000", "--dtype", "bfloat16",
        "--tensor-parallel-size", "2", "--distributed-executor-backend", "mp", "--nnodes", "2",
        "--node-rank", "0", "--master-addr", "10.0.0.1", "--master-port", "29501",
    ]  # fmt: skip
    assert worker.args[worker.args.index("--node-rank") + 1] == "1"
    assert worker.args[-1] == "--headless" and not worker.serves_http


def test_vllm_ray_starts_ray_on_every_node_and_serves_from_the_head_only() -> None:
    adapter = adapter_for("vllm")
    layout = Parallel(nodes=2, tp=2, launcher="ray")

    head = adapter.rank_command(["vllm", "serve"], ["--model", "/m"], layout, _place(0))
    worker = adapter.rank_command(["vllm", "serve"], ["--model", "/m"], layout, _place(1))

    assert worker.entrypoint == ["ray"] and not worker.serves_http
    assert worker.args == ["start", "--block", "--address=10.0.0.1:29501",
                           "--node-ip-address=10.0.0.2"]  # fmt: skip
    assert head.entrypoint == ["sh", "-c"] and head.serves_http
    script = head.args[0]
    assert script.startswith("ray start --head --port=29501 --node-ip-address=10.0.0.1 && ")
    assert "-ge 2 ]" in script  # waits until both nodes joined Ray
    assert script.endswith(
        "exec vllm serve /m --tensor-parallel-size 2 --distributed-executor-backend ray"
    )


def test_vllm_expert_parallel_is_the_whole_tensor_parallel_group() -> None:
    adapter = adapter_for("vllm")

    command = adapter.rank_command(["vllm", "serve"], [], Parallel(nodes=4, tp=4, ep=4),
                                   _place(0, 4))  # fmt: skip
    assert "--enable-expert-parallel" in command.args
    with pytest.raises(UsageError, match="ep = tp = 4"):
        adapter.rank_command(["vllm", "serve"], [], Parallel(nodes=4, tp=4, ep=2), _place(0, 4))


def test_sglang_ranks_share_the_dist_init_address() -> None:
    adapter = adapter_for("sglang")
    serve = adapter.serve_args("/m", "0.0.0.0", 30000, [])

    worker = adapter.rank_command(["python3", "-m", "sglang.launch_server"], serve,
                                  Parallel(nodes=4, tp=4, ep=4), _place(3, 4))  # fmt: skip

    assert worker.entrypoint == ["python3"] and not worker.serves_http
    assert worker.args[-10:] == [
        "--tp-size", "4", "--ep-size", "4", "--nnodes", "4", "--node-rank", "3",
        "--dist-init-addr", "10.0.0.1:29501",
    ]  # fmt: skip


def test_the_joined_ranks_come_from_each_engines_own_log_line() -> None:
    vllm, sglang = adapter_for("vllm"), adapter_for("sglang")
    vllm_log = [
        "[node-1] (Worker pid=36) INFO [parallel_state.py:1906] world_size=2 rank=0 "
        "local_rank=0 distributed_init_method=tcp://10.0.0.1:29555 backend=gloo",
        "[node-1] (EngineCore) INFO DP group leader: node_rank=0, world_size=2, local",
        "[node-2] (Worker pid=20) INFO [parallel_state.py:1906] world_size=2 rank=1 "
        "local_rank=0 distributed_init_method=tcp://10.0.0.1:29555 backend=gloo",
    ]
    sglang_log = ["[TP1] Created global TCPStore at 10.0.0.1:29501 (rank=1, world_size=4)"]

    assert vllm.joined_ranks(vllm_log) == (2, {0, 1})
    assert vllm.joined_ranks(vllm_log[:2]) == (2, {0})
    assert sglang.joined_ranks(sglang_log) == (4, {1})
    from sparkbuild.smoke.checks import check_ranks

    assert check_ranks(2, 2, {0, 1}, ["node-1", "node-2"]).status == "pass"
    missing = check_ranks(2, *vllm.joined_ranks(vllm_log[:2]), ["node-1", "node-2"])
    assert missing.status == "fail" and "rank(s) 1 (node-2) never joined" in missing.detail
    assert check_ranks(2, None, set(), ["node-1", "node-2"]).status == "fail"


def _project(tmp_path: Path, profile: dict[str, Any], cluster_nodes: int = 2) -> Path:
    (tmp_path / "smoke").mkdir()
    (tmp_path / "smoke" / "p.yaml").write_text(yaml.safe_dump(profile))
    nodes = [{"name": f"n{i}", "address": f"10.0.0.{i + 1}"} for i in range(cluster_nodes)]
    _cluster(tmp_path, yaml.safe_dump({"nodes": nodes}))
    return tmp_path


def test_a_cluster_profile_is_refused_on_one_box_and_profile_flags_that_clash(
    tmp_path: Path,
) -> None:
    project = _project(tmp_path, {"engine": "vllm", "model": "/m",
                                  "parallel": {"nodes": 2, "tp": 2}})  # fmt: skip

    one_box = run_cli("--project", str(project), "smoke", "--command", "true", "--profile", "p")
    no_image = run_cli("--project", str(project), "smoke", "--command", "true", "--profile", "p",
                       "--cluster", "c")  # fmt: skip

    assert one_box.exit_code == 2 and "needs 2 nodes" in one_box.output
    assert "--cluster" in one_box.output
    assert no_image.exit_code == 2 and "give --image with it" in no_image.output


def test_bench_refuses_a_cluster_smaller_than_its_profile_before_any_node(
    tmp_path: Path,
) -> None:
    project = _project(tmp_path, {"engine": "vllm", "model": "/m",
                                  "parallel": {"nodes": 4, "tp": 4}})  # fmt: skip

    # Refused before any node's Docker is asked anything (no image is needed either).
    done = run_cli("--project", str(project), "bench", "--image", "img", "--profile", "p",
                   "--cluster", "c")  # fmt: skip

    assert done.exit_code == 2, done.output
    assert "needs 4 nodes" in done.output and "cluster c has 2" in done.output


def test_a_profile_that_sets_the_multi_node_flags_itself_is_refused(tmp_path: Path) -> None:
    from sparkbuild.engines.launch import check_cluster_profile
    from sparkbuild.engines.profiles import SmokeProfile

    profile = SmokeProfile(engine="sglang", model="/m", args=["--tp-size", "2"],
                           parallel=Parallel(nodes=2, tp=2))  # fmt: skip

    with pytest.raises(UsageError, match="--tp-size"):
        check_cluster_profile(profile, adapter_for("sglang"), 2, "c")


def _smoke(nodes: list[str] | None, verified: bool = True) -> lockfile.SmokeRecord:
    record = lockfile.SmokeRecord(verdict="pass", verified=verified, image_id=PIN,
                                  target="cluster:pair")  # fmt: skip
    if nodes is not None:
        record.nodes = [lockfile.NodeRecord(name=f"n{i}", image_id=node)
                        for i, node in enumerate(nodes)]  # fmt: skip
    return record


def test_publish_counts_a_cluster_verdict_only_when_every_node_ran_the_pin() -> None:
    name = "qwen3.6-27b-fp8-tp2-sglang"
    build = cast(Build, SimpleNamespace(smoke_profiles=(name,)))  # all the gate reads of it

    def counted(record: lockfile.SmokeRecord, cluster: bool) -> str:
        entry = lockfile.BuildEntry(smoke={PIN: {name: record}})
        return smoke_verdicts(entry, build, PIN, {name} if cluster else ())[name]

    assert counted(_smoke([PIN, PIN]), cluster=True) == "pass"
    assert (
        counted(_smoke([PIN, OTHER]), cluster=True) == "unverified pass (a node ran another image)"
    )
    assert counted(_smoke(None), cluster=True) == "unverified pass (not a cluster run)"
    assert counted(_smoke([PIN, OTHER]), cluster=False).startswith("unverified pass")
    assert counted(_smoke(None), cluster=False) == "pass"  # one box, as before


def _report(topology: Parallel | None, profile: str) -> BenchReport:
    runs = [RunFigures(ttft_s=0.1, prefill_tps=1000.0, decode_tps_request=9.0,
                       decode_tps_aggregate=9.0, output_tps=9.0, seconds=1.0, requests=1,
                       errors=0, prompt_tokens=512, completion_tokens=128)]  # fmt: skip
    built = CellResult.model_validate({
        "pp": 512, "tg": 128, "depth": 0, "concurrency": 1, "accept_len": None,
        "prompt_tokens_target": 512, "prompt_tokens": 512, "completion_tokens": 128,
        "requests": 1, "errors": 0, "runs": runs, **cell_stats(runs),
    })  # fmt: skip
    return BenchReport.model_validate({
        "created": "2026-11-23T00:00:00+0000", "label": "run", "profile": profile,
        "harness": {"version": "1", "sparkbuild": "0", "http_client": "httpx"},
        "host": {"hostname": "h", "platform": "p", "machine": "aarch64", "cpus": 20,
                 "python": "3.12"},
        "target": {"kind": "cluster", "value": "pair"},
        "engine": {"name": "sglang", "model": "Qwen/Qwen3.6-27B-FP8",
                   "served_model": "Qwen/Qwen3.6-27B-FP8"},
        "topology": topology.model_dump() if topology else None,
        "sweep": {"pp": [512], "tg": [128], "depth": [0], "concurrency": [1], "runs": 1,
                  "seed": 0, "warmup": False},
        "complete": True, "cells": [built.model_dump()],
    })  # fmt: skip


def test_a_tp2_claim_is_compared_only_with_a_tp2_run() -> None:
    claims = [c for c in load_claims(REPO / "claims" / "qwen3.6-27b-sglang-vllm.yaml")
              if c.setup_name == "S1-tp2"]  # fmt: skip
    pair = _report(Parallel(nodes=2, tp=2), "qwen3.6-27b-fp8-tp2-sglang")
    one_box = _report(Parallel(), "qwen3.6-27b-fp8-tp2-sglang")
    unknown = _report(None, "qwen3.6-27b-fp8-tp2-sglang")

    on_pair = compare_claims(pair, claims, ["S1-tp2"]).rows
    on_one = compare_claims(one_box, claims, ["S1-tp2"]).rows
    on_unknown = compare_claims(unknown, claims, ["S1-tp2"]).rows

    c1 = next(r for r in on_pair if r.claim.claim.cell.concurrency == 1)
    assert c1.status == "compared" and c1.ratio == pytest.approx(9.0 / 8.1, rel=1e-3)
    assert {r.status for r in on_one} == {"not comparable"}
    differs = "topology differs: claim nodes=2 tp=2 ep=1, run nodes=1 tp=1 ep=1"
    assert all(differs in (r.reason or "") for r in on_one)
    assert all("topology is unknown" in (r.reason or "") for r in on_unknown)


def test_every_published_multi_spark_setup_declares_its_topology() -> None:
    for path in sorted((REPO / "claims").glob("*.yaml")):
        for claim in load_claims(path):
            hardware = claim.setup.hardware or ""
            if hardware.startswith(("2x", "4x", "8x")):
                topology = claim.setup.topology
                assert topology is not None, f"{path.name} {claim.setup_name}"
                assert hardware.startswith(f"{topology.nodes}x")
                assert f"TP={topology.tp}" in hardware


CLUSTER_LINES = {
    # torch 2.13's messages (libtorch_cpu.so) as a cluster log shows them, node-prefixed.
    "rank-rendezvous-timeout": "[node-2] torch.distributed.DistNetworkError: The client socket "
    "has timed out after 600000ms while trying to connect to (10.0.0.1, 29501).",
    "fabric-interface-not-found": "[node-2] RuntimeError: [enforce fail at gloo/transport/tcp/"
    "device.cc:84] ifa != nullptr. Unable to find address for: enp1s0f1np1",
    "fabric-collective-timeout": "[node-3] [rank2]:[E] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE) ran for 600000 milliseconds",
    "fabric-address-unreachable": "[node-4] OSError: [Errno 113] No route to host",
    # vLLM 0.32 on the CPU, seen on this machine in a container with Docker's default shm.
    "shm-too-small": "[node-1] (EngineCore pid=25) ERROR [core.py:1510] RuntimeError: "
    "Insufficient space in /dev/shm for shared-memory allocation: 160 MiB required, 64 MiB free.",
}


@pytest.mark.parametrize("signature_id", sorted(CLUSTER_LINES))
def test_multi_node_failures_are_diagnosed_naming_the_node(signature_id: str) -> None:
    from sparkbuild.engines.signatures import diagnose

    line = CLUSTER_LINES[signature_id]
    found = diagnose(["[node-1] INFO starting", line], "sglang")

    assert [d.id for d in found] == [signature_id]
    assert found[0].line.startswith(line[: line.index("]") + 1])  # the node it came from
    assert "fabric" in found[0].remedy or "container" in found[0].remedy
