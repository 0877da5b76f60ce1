"""The Kubernetes path: the LeaderWorkerSet sparkbuild renders, validated against real schemas.

No Kubernetes API server can run on this machine, so what is proven here is the manifest:
the LWS fields against the LeaderWorkerSet CRD's own schema (kubernetes-sigs/lws v0.9.0,
tests/data/lws/), and both pod templates against the core API schemas kubernetes-validate
carries offline, strictly (an unknown field fails, as `kubectl apply --validate=strict`).
Applying it, the port-forward and the pods' image ids are proven only on a real cluster
(docs/cluster.md says so); their parsing of kubectl's JSON is tested below.
"""

from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from sparkbuild.engines.adapters import adapter_for
from sparkbuild.engines.cluster import ClusterSpec, KubernetesTarget, Node
from sparkbuild.engines.cluster_kube import KubeTarget, LwsPlan, pod_image_digests, render_lws
from sparkbuild.engines.profiles import Parallel
from sparkbuild.errors import EngineContainerError, UsageError
from tests.support.cli import run_cli

REPO = Path(__file__).resolve().parents[1]
LWS_SCHEMA = REPO / "tests" / "data" / "lws" / "leaderworkerset-v0.9.0.schema.json"
K8S_VERSION = kubernetes_validate.latest_version()
DIGEST = "sha256:" + "ab" * 32
IMAGE = f"registry.example/sparkbuild/sglang@{DIGEST}"


def _strict(schema: Any) -> Any:
    """The CRD's structural schema, strict: an object with declared properties takes no
    other keys (the API server prunes or, with --validate=strict, refuses them)."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if "properties" in out and not out.get("x-kubernetes-preserve-unknown-fields"):
            out.setdefault("additionalProperties", False)
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


def validate_lws(manifest: dict[str, Any]) -> None:
    """Raise if ``manifest`` is not a valid LeaderWorkerSet with valid pod templates."""
    schema = json.loads(LWS_SCHEMA.read_text())
    schema.pop("$comment", None)
    jsonschema.validate(manifest, _strict(schema))
    group = manifest["spec"]["leaderWorkerTemplate"]
    for key in ("leaderTemplate", "workerTemplate"):
        kubernetes_validate.validate(
            {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"check-{key}"},
             "template": group[key]},
            K8S_VERSION, strict=True,
        )  # fmt: skip


def _print_manifest(project: Path, profile: str, cluster: str = "k3s-4") -> dict[str, Any]:
    out = project / "lws.yaml"
    done = run_cli(
        "--project", str(project), "smoke", "--image", IMAGE, "--profile", profile,
        "--cluster", cluster, "--print-manifest", str(out),
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    manifest: dict[str, Any] = yaml.safe_load(out.read_text())
    return manifest


def _container(manifest: dict[str, Any], role: str) -> dict[str, Any]:
    template = manifest["spec"]["leaderWorkerTemplate"][f"{role}Template"]
    container: dict[str, Any] = template["spec"]["containers"][0]
    return container


@pytest.fixture
def project(tmp_path: Path) -> Path:
    for folder in ("smoke", "clusters"):
        (tmp_path / folder).symlink_to(REPO / folder)
    return tmp_path


@pytest.mark.parametrize(
    ("profile", "tp", "ep"),
    [
        ("nemotron3-super-nvfp4-mtp-3x4-tp4-sglang", 4, 1),
        ("nemotron3-super-nvfp4-mtp-3x4-tp4-ep4-sglang", 4, 4),
        ("gemma4-31b-mtp-tp4-sglang", 4, 1),
        ("qwen3.6-27b-fp8-tp2-sglang", 2, 1),
    ],
)
def test_the_shipped_cluster_profiles_render_a_valid_leaderworkerset(
    project: Path, profile: str, tp: int, ep: int
) -> None:
    manifest = _print_manifest(project, profile)

    validate_lws(manifest)
    group = manifest["spec"]["leaderWorkerTemplate"]
    assert manifest["kind"] == "LeaderWorkerSet" and group["size"] == tp
    # Its pods and headless Service are named after it: a DNS-1035 label with room to spare.
    assert re.fullmatch(r"[a-z]([a-z0-9-]{0,50}[a-z0-9])?", manifest["metadata"]["name"])
    leader, worker = _container(manifest, "leader"), _container(manifest, "worker")
    assert leader["image"] == worker["image"] == IMAGE
    assert leader["command"] == worker["command"] == ["python3"]
    for args, rank in ((leader["args"], "0"), (worker["args"], "$(LWS_WORKER_INDEX)")):
        assert args[args.index("--node-rank") + 1] == rank
        assert args[args.index("--nnodes") + 1] == str(tp)
        assert args[args.index("--dist-init-addr") + 1] == "$(LWS_LEADER_ADDRESS):29501"
        assert args[args.index("--tp-size") + 1] == str(tp)
        assert ("--ep-size" in args) == (ep > 1)
    assert leader["readinessProbe"]["httpGet"]["path"] == "/health"
    assert leader["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    env = {e["name"]: e.get("value") for e in leader["env"]}
    assert env["NCCL_SOCKET_IFNAME"] == "enp1s0f1np1"
    pod = group["workerTemplate"]["spec"]
    assert pod["hostNetwork"] is True
    assert {"name": "dshm", "mountPath": "/dev/shm"} in worker["volumeMounts"]
    hostnames = [
        t["matchExpressions"][0]["values"][0]
        for t in pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ]
    ]
    assert hostnames == ["spark-2", "spark-3", "spark-4"]  # the cluster's, whatever the size
    assert group["leaderTemplate"]["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "spark-1"}


def test_a_broken_manifest_fails_the_same_validation(project: Path) -> None:
    manifest = _print_manifest(project, "gemma4-31b-mtp-tp4-sglang")
    validate_lws(manifest)
    size_as_text = copy.deepcopy(manifest)
    size_as_text["spec"]["leaderWorkerTemplate"]["size"] = "four"
    typo_in_pod = copy.deepcopy(manifest)
    typo_in_pod["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["hostNetwrok"] = True
    typo_in_lws = copy.deepcopy(manifest)
    typo_in_lws["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "Sometimes"

    with pytest.raises(jsonschema.ValidationError):
        validate_lws(size_as_text)
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_lws(typo_in_pod)
    with pytest.raises(jsonschema.ValidationError):
        validate_lws(typo_in_lws)


def _plan(parallel: Parallel, launcher: list[str], serve: list[str], image: str = IMAGE) -> LwsPlan:
    return LwsPlan(
        name="sparkbuild-smoke-test", image=image, parallel=parallel,
        kube=KubernetesTarget(host_network=False, annotations={
            "k8s.v1.cni.cncf.io/networks": "roce-sriov"}, gpus_per_node=1),
        launcher=launcher, serve=serve, port=8000, health_path="/health",
        env={"VLLM_CPU_KVCACHE_SPACE": "1"}, mounts=[], rendezvous_port=29500,
    )  # fmt: skip


def test_vllm_mp_workers_run_headless_and_the_fabric_comes_by_annotation() -> None:
    adapter = adapter_for("vllm")
    serve = adapter.serve_args("/models/m", "0.0.0.0", 8000, ["--dtype", "bfloat16"])
    manifest = render_lws(adapter, _plan(Parallel(nodes=2, tp=2), ["vllm", "serve"], serve))

    validate_lws(manifest)
    leader, worker = _container(manifest, "leader"), _container(manifest, "worker")
    assert leader["command"] == ["vllm"] and leader["args"][:2] == ["serve", "/models/m"]
    assert "--headless" in worker["args"] and "--headless" not in leader["args"]
    assert worker["args"][worker["args"].index("--node-rank") + 1] == "$(LWS_WORKER_INDEX)"
    assert worker["args"][worker["args"].index("--master-addr") + 1] == "$(LWS_LEADER_ADDRESS)"
    template = manifest["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    assert template["metadata"]["annotations"] == {"k8s.v1.cni.cncf.io/networks": "roce-sriov"}
    assert "hostNetwork" not in template["spec"]


def test_kubernetes_runs_an_image_by_digest_only() -> None:
    adapter = adapter_for("vllm")
    plan = _plan(Parallel(nodes=2, tp=2), ["vllm", "serve"], [], image="sparkbuild/vllm:0.32")

    with pytest.raises(UsageError, match="by digest"):
        render_lws(adapter, plan)


def test_pod_image_ids_come_from_the_container_statuses() -> None:
    # The shape of `kubectl get pods -o json` (core/v1 PodList): containerd reports
    # REPO@sha256:..., docker-shim reported docker-pullable://REPO@sha256:...
    pods = {"kind": "PodList", "items": [
        {"metadata": {"name": "lws-0"}, "status": {"containerStatuses": [
            {"name": "engine", "imageID": f"registry.example/sparkbuild/sglang@{DIGEST}"}]}},
        {"metadata": {"name": "lws-0-1"}, "status": {"containerStatuses": [
            {"name": "engine", "imageID": f"docker-pullable://registry.example/x@{DIGEST}"}]}},
        {"metadata": {"name": "lws-0-2"}, "status": {"containerStatuses": [
            {"name": "engine", "imageID": ""}]}},
        {"metadata": {"name": "lws-0-3"}, "status": {}},
    ]}  # fmt: skip

    assert pod_image_digests(pods) == {
        "lws-0": DIGEST, "lws-0-1": DIGEST, "lws-0-2": None, "lws-0-3": None,
    }  # fmt: skip


def test_the_kubernetes_target_says_when_kubectl_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PATH", os.devnull)
    adapter = adapter_for("vllm")
    cluster = ClusterSpec(nodes=[Node(name="a", address="10.0.0.1"),
                                 Node(name="b", address="10.0.0.2")],
                          kubernetes=KubernetesTarget())  # fmt: skip
    target = KubeTarget("pair", cluster, adapter, _plan(Parallel(nodes=2, tp=2), ["vllm"], []))

    with pytest.raises(EngineContainerError, match="kubectl is not on PATH"):
        target.start()
    target.stop()  # nothing was applied: nothing to delete, and no error
