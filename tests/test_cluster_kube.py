"""The Kubernetes path: the LeaderWorkerSet sparkbuild renders, validated against real schemas.

No Kubernetes API server can run on this machine, so what is proven here is the manifest:
the LWS fields against the LeaderWorkerSet CRD's own schema (kubernetes-sigs/lws v0.9.0,
tests/data/lws/), and both pod templates against the core API schemas kubernetes-validate
carries offline, strictly (an unknown field fails, as `kubectl apply --validate=strict`).
Applying it, the port-forward and the pods' image ids are proven only on a real cluster
(docs/cluster.md says so); their parsing of kubectl's JSON is tested below, and so is what
the Kubernetes target asks of kubectl, in what order, and that it deletes the group whatever
happens (a stand-in kubectl on PATH that answers in kubectl's own formats).
"""

from __future__ import annotations

import copy
import json
import os
import re
import time
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from sparkbuild.adapters import adapter_for
from sparkbuild.engines.cluster import ClusterSpec, KubernetesTarget, Node
from sparkbuild.engines.cluster_kube import KubeTarget, LwsPlan, pod_image_digests, render_lws
from sparkbuild.engines.profiles import Parallel
from sparkbuild.errors import ClusterImageError, EngineContainerError, UsageError
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


# What kubectl does against a live API server cannot run here; the order of the calls, what
# is applied and that the group is deleted whatever happens can. A stand-in `kubectl` on PATH
# records each call and answers with kubectl's own output formats (a core/v1 PodList for
# `get pods -o json`, log lines for `logs -f`, a long-running `port-forward`).
FAKE_KUBECTL = """#!{python}
import json, os, sys, time
state = os.environ["FAKE_KUBE_DIR"]
args = sys.argv[1:]
with open(os.path.join(state, "calls.jsonl"), "a") as calls:
    calls.write(json.dumps(args) + "\\n")
verbs = [a for a in args if not a.startswith("-")]
verb = verbs[2] if args[:1] == ["--context"] else verbs[1]  # after --namespace NS
if verb == "apply":
    open(os.path.join(state, "applied.json"), "w").write(sys.stdin.read())
elif verb == "wait" and os.path.exists(os.path.join(state, "wait-fails")):
    sys.exit("error: timed out waiting for the condition on leaderworkersets/x")
elif verb == "get":
    answers = sorted(n for n in os.listdir(state) if n.startswith("pods-"))
    sys.stdout.write(open(os.path.join(state, answers[0])).read())
    if len(answers) > 1:
        os.remove(os.path.join(state, answers[0]))
elif verb == "logs":
    print("INFO world_size=2 from " + args[-1])
elif verb == "port-forward":
    time.sleep(120)
"""


def _pod_list(name: str, digests: list[str | None]) -> str:
    def pod(rank: int, digest: str | None) -> dict[str, Any]:
        pod_name = f"{name}-0" if rank == 0 else f"{name}-0-{rank}"  # LWS's own pod names
        statuses = [{"name": "engine", "imageID": f"registry.example/x@{digest}"}] if digest else []
        return {"metadata": {"name": pod_name}, "status": {"containerStatuses": statuses}}

    items = [pod(rank, digest) for rank, digest in enumerate(digests)]
    return json.dumps({"apiVersion": "v1", "kind": "PodList", "items": items})


@pytest.fixture
def kubectl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    import sys

    bin_dir, state = tmp_path / "bin", tmp_path / "kube"
    bin_dir.mkdir()
    state.mkdir()
    script = bin_dir / "kubectl"
    script.write_text(FAKE_KUBECTL.format(python=sys.executable))
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_KUBE_DIR", str(state))
    return state


def _kube_target() -> KubeTarget:
    adapter = adapter_for("vllm")
    kube = KubernetesTarget(context="spark-k3s", namespace="inference", ready_timeout_s=60)
    cluster = ClusterSpec(nodes=[Node(name="a", address="10.0.0.1"),
                                 Node(name="b", address="10.0.0.2")], kubernetes=kube)  # fmt: skip
    plan = _plan(Parallel(nodes=2, tp=2), ["vllm", "serve"], ["/models/m"])
    return KubeTarget("pair", cluster, adapter, LwsPlan(**{**plan.__dict__, "kube": kube}))


def _calls(state: Path) -> list[list[str]]:
    return [json.loads(line) for line in (state / "calls.jsonl").read_text().splitlines()]


def _verbs(state: Path) -> list[str]:
    calls = _calls(state)
    assert all(call[:4] == ["--context", "spark-k3s", "--namespace", "inference"]
               for call in calls), calls  # fmt: skip
    return [call[4] for call in calls]


def test_the_kubernetes_target_applies_checks_every_pod_at_both_ends_and_deletes(
    kubectl: Path,
) -> None:
    (kubectl / "pods-1.json").write_text(_pod_list("sparkbuild-smoke-test", [DIGEST, DIGEST]))
    target = _kube_target()

    target.start()
    started = [(n.node, n.image_id) for n in target.node_images]
    deadline = time.monotonic() + 20  # each pod's log is followed by its own process
    while len(target.log.since(0)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    target.stop()

    applied = json.loads((kubectl / "applied.json").read_text())
    assert applied == render_lws(target.adapter, target.plan)
    assert started == [
        ("sparkbuild-smoke-test-0", DIGEST), ("sparkbuild-smoke-test-0-1", DIGEST)]  # fmt: skip
    assert target.image_id == DIGEST
    verbs = _verbs(kubectl)
    assert verbs[:3] == ["apply", "wait", "get"] and verbs[-2:] == ["get", "delete"], verbs
    assert verbs.count("logs") == 2 and "port-forward" in verbs
    assert sorted(target.log.since(0)) == [
        "[sparkbuild-smoke-test-0-1] INFO world_size=2 from pod/sparkbuild-smoke-test-0-1",
        "[sparkbuild-smoke-test-0] INFO world_size=2 from pod/sparkbuild-smoke-test-0",
    ]
    forward = next(c for c in _calls(kubectl) if "port-forward" in c)
    assert forward[5] == "pod/sparkbuild-smoke-test-0"  # the leader


def test_a_group_that_never_gets_ready_is_still_deleted(kubectl: Path) -> None:
    (kubectl / "wait-fails").touch()
    target = _kube_target()

    with pytest.raises(EngineContainerError, match=r"kubectl wait .*timed out"):
        target.start()
    target.stop()

    assert _verbs(kubectl) == ["apply", "wait", "delete"]
    assert target.image_id is None


def test_a_pod_rolled_to_another_image_during_the_run_is_named_and_the_group_deleted(
    kubectl: Path,
) -> None:
    other = "sha256:" + "cd" * 32
    (kubectl / "pods-1.json").write_text(_pod_list("sparkbuild-smoke-test", [DIGEST, DIGEST]))
    (kubectl / "pods-2.json").write_text(_pod_list("sparkbuild-smoke-test", [DIGEST, other]))
    target = _kube_target()
    target.start()

    with pytest.raises(
        ClusterImageError, match=r"end of the run.*sparkbuild-smoke-test-0-1: sha256:cdcd"
    ):
        target.stop()

    assert _verbs(kubectl)[-1] == "delete"


# `smoke --cluster K8S --record`: the stand-in kubectl above, whose port-forward serves a
# small engine in vLLM's formats (openai_stub) on the local port, so the whole command runs.
SERVING_KUBECTL = FAKE_KUBECTL.replace(
    """    print("INFO world_size=2 from " + args[-1])""",
    """    rank = 1 if args[-1].count("-0-") else 0  # LWS's pod names: NAME-0, NAME-0-1
    print(f"INFO world_size=2 rank={{rank}} local_rank=0 from " + args[-1], flush=True)""",
).replace(
    """elif verb == "port-forward":
    time.sleep(120)
""",
    """elif verb == "port-forward":
    import http.server
    sys.path.insert(0, {root!r})
    from tests.support.openai_stub import StubEngine, _handler
    local = int(args[-1].split(":")[0])
    server = http.server.ThreadingHTTPServer(("127.0.0.1", local), _handler(StubEngine(url="")))
    server.serve_forever()
""",
)
OTHER_DIGEST = "sha256:" + "cd" * 32
IMAGE_ID = "sha256:" + "ef" * 32  # the image's config digest: what `build` pins


def _kube_project(tmp_path: Path, repo_digest: str) -> Path:
    from sparkbuild import lockfile

    project = tmp_path / "project"
    (project / "smoke").mkdir(parents=True)
    (project / "clusters").mkdir()
    (project / "smoke" / "pair.yaml").write_text(
        "engine: vllm\nmodel: stub-model\nprompts: [prose]\nparallel: {nodes: 2, tp: 2}\n"
        "expect: {max_tokens: 4, speculation: false, finish: length, repetition: null}\n"
    )
    (project / "clusters" / "k8s-pair.yaml").write_text(
        "nodes:\n  - {name: a, address: 10.0.0.1}\n  - {name: b, address: 10.0.0.2}\n"
        "kubernetes: {namespace: inference, ready_timeout_s: 60}\n"
    )
    section = lockfile.ImageSection(mode="overlay", platform="linux/arm64", image_id=IMAGE_ID,
                                    repo_digest=f"registry.example/x@{repo_digest}")  # fmt: skip
    lockfile.set_section(project / "images.lock", "b", section)
    return project


@pytest.fixture
def serving_kubectl(kubectl: Path) -> Path:
    import sys

    script = Path(os.environ["PATH"].split(os.pathsep)[0]) / "kubectl"
    script.write_text(SERVING_KUBECTL.format(python=sys.executable, root=str(REPO)))
    return kubectl


def _smoke_record(project: Path) -> Any:
    return run_cli(
        "--project", str(project), "smoke", "--image", IMAGE, "--profile", "pair",
        "--cluster", "k8s-pair", "--record", "b", "--log", str(project / "engine.log"),
    )  # fmt: skip


def test_a_kubernetes_smoke_records_under_the_image_the_lock_pins_by_digest(
    tmp_path: Path, serving_kubectl: Path
) -> None:
    """Issue 34, What 5: `smoke --cluster K8S --record` pinned this host's image id before
    the run and the pods' manifest digest after it, so it could never record. The pin is now
    the digest the pods run, the lock's, checked before the run (against the lock) and at
    both ends (every pod); the verdict lands under the lock's image id."""
    from sparkbuild import lockfile

    (serving_kubectl / "pods-1.json").write_text(_pod_list("sparkbuild-smoke-x", [DIGEST] * 2))
    project = _kube_project(tmp_path, DIGEST)

    result = _smoke_record(project)

    assert result.exit_code == 0, result.output
    record = lockfile.load(project / "images.lock").builds["b"].smoke[IMAGE_ID]["pair"]  # type: ignore[index]
    assert record.verdict == "pass" and record.image_verified(IMAGE_ID)
    assert record.every_node_ran(IMAGE_ID) and record.launcher == "lws"
    assert record.target is not None and record.target.endswith(f" {IMAGE}")  # the digest ran
    assert [n.image_id for n in record.nodes] == [IMAGE_ID, IMAGE_ID]


def test_a_kubernetes_digest_the_lock_does_not_pin_is_refused_before_the_run(
    tmp_path: Path, serving_kubectl: Path
) -> None:
    project = _kube_project(tmp_path, OTHER_DIGEST)

    result = _smoke_record(project)

    assert result.exit_code == 1, result.output
    said = " ".join(result.stderr.split())
    assert f"the image under test ({DIGEST}) is not build 'b'" in said, said
    assert not (serving_kubectl / "calls.jsonl").exists()  # nothing applied


def test_a_kubernetes_bench_records_under_the_image_the_lock_pins_by_digest(
    tmp_path: Path, serving_kubectl: Path
) -> None:
    """The same for `bench --cluster K8S --record`: it asked this host's Docker for the
    image's id, then recorded under the pods' digest."""
    from sparkbuild import lockfile

    (serving_kubectl / "pods-1.json").write_text(_pod_list("sparkbuild-bench-x", [DIGEST] * 2))
    project = _kube_project(tmp_path, DIGEST)

    result = run_cli(
        "--project", str(project), "bench", "--image", IMAGE, "--profile", "pair",
        "--cluster", "k8s-pair", "--record", "b", "--pp", "8", "--tg", "4", "-c", "1",
        "--runs", "1", "--no-warmup", "--log", str(project / "engine.log"),
    )  # fmt: skip

    assert result.exit_code == 0, result.output
    record = lockfile.load(project / "images.lock").builds["b"].bench[IMAGE_ID]["pair"]  # type: ignore[index]
    assert [n.image_id for n in record.nodes] == [IMAGE_ID, IMAGE_ID]
