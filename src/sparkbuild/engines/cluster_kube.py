"""A multi-node engine on Kubernetes: one LeaderWorkerSet (kubernetes-sigs/lws).

:func:`render_lws` makes the manifest: a group of ``nodes`` pods (the leader and its workers),
the image by digest, the same engine arguments and environment a Docker-endpoint cluster
gets (the ranks' multi-node flags come from the adapter, with LWS's own variables
``$(LWS_LEADER_ADDRESS)``, ``$(LWS_WORKER_INDEX)`` and ``$(LWS_GROUP_SIZE)`` filled in by the
kubelet), host networking or the fabric by annotation, ``/dev/shm``, GPU resources, and one
rank per machine. ``--print-manifest`` writes it for GitOps.

:class:`KubeTarget` applies it with the user's kubeconfig (``kubectl``), waits for the
leader, reaches it through ``kubectl port-forward``, streams every pod's log prefixed with its
name, reads every pod's ``status.containerStatuses[].imageID`` at the start and at the end
(:func:`pod_image_digests`), and deletes the LeaderWorkerSet, whatever happens.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sparkbuild.adapters import EngineAdapter, RankPlace
from sparkbuild.engines.cluster import ClusterSpec, KubernetesTarget
from sparkbuild.engines.cluster_target import MultiNodeTarget, NodeImage
from sparkbuild.engines.logs import LogBuffer
from sparkbuild.engines.targets import STAGE_LABEL, Mount, free_port
from sparkbuild.errors import ClusterImageError, EngineContainerError, UsageError

if TYPE_CHECKING:
    from pathlib import Path

    from sparkbuild.engines.profiles import Parallel

LWS_API = "leaderworkerset.x-k8s.io/v1"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
DEFAULT_RENDEZVOUS_PORT = 29500
_LEADER = "$(LWS_LEADER_ADDRESS)"
_WORKER_INDEX = "$(LWS_WORKER_INDEX)"
_POD_IP = "$(POD_IP)"


@dataclass(frozen=True)
class LwsPlan:
    """Everything the manifest says, apart from Kubernetes' own defaults."""

    name: str
    image: str  # REPOSITORY@sha256:...: a pod pulls by digest, never by a tag that can move
    parallel: Parallel
    kube: KubernetesTarget
    launcher: Sequence[str]
    serve: Sequence[str]  # the engine's serve arguments (model, host, port, profile flags)
    port: int  # the engine's HTTP port in the leader
    health_path: str
    env: Mapping[str, str]
    mounts: Sequence[Mount]
    rendezvous_port: int = DEFAULT_RENDEZVOUS_PORT
    stage: str = "smoke"


def _rank_args(adapter: EngineAdapter, plan: LwsPlan, leader: bool) -> tuple[list[str], list[str]]:
    """(command, args) of the leader's or the workers' container. The workers share one
    template: the adapter renders rank 1 with its rank written as ``$(LWS_WORKER_INDEX)``."""
    nodes = plan.parallel.nodes
    place = RankPlace(
        0 if leader else 1,
        nodes,
        _LEADER,
        plan.rendezvous_port,
        _POD_IP,
        rank_word=None if leader else _WORKER_INDEX,
    )
    rank = adapter.rank_command(plan.launcher, plan.serve, plan.parallel, place)
    words = [*rank.entrypoint, *rank.args]
    return words[:1], words[1:]


def _container(adapter: EngineAdapter, plan: LwsPlan, leader: bool) -> dict[str, Any]:
    command, args = _rank_args(adapter, plan, leader)
    env: list[dict[str, object]] = [{"name": k, "value": v} for k, v in sorted(plan.env.items())]
    env.append({"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
    container: dict[str, object] = {
        "name": "engine",
        "image": plan.image,
        "imagePullPolicy": "IfNotPresent",
        "command": command,
        "args": args,
        "env": env,
        "volumeMounts": [
            {"name": "dshm", "mountPath": "/dev/shm"},
            *(
                {"name": f"mount-{i}", "mountPath": m.target, "readOnly": m.read_only}
                for i, m in enumerate(plan.mounts)
            ),
        ],
    }
    if plan.kube.gpus_per_node > 0:
        count = str(plan.kube.gpus_per_node)
        container["resources"] = {"limits": {plan.kube.gpu_resource: count}}
    if leader:
        container["ports"] = [{"containerPort": plan.port, "name": "http", "protocol": "TCP"}]
        container["readinessProbe"] = {
            "httpGet": {"path": plan.health_path, "port": plan.port},
            "periodSeconds": 10,
            "failureThreshold": 3,
        }
    return container


def _pod_spec(adapter: EngineAdapter, plan: LwsPlan, leader: bool) -> dict[str, object]:
    kube = plan.kube
    spec: dict[str, Any] = {
        "containers": [_container(adapter, plan, leader)],
        "volumes": [
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": kube.shm_size}},
            *(
                {"name": f"mount-{i}", "hostPath": {"path": str(m.source), "type": "Directory"}}
                for i, m in enumerate(plan.mounts)
            ),
        ],
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 30,
        # One rank per machine: a Spark has one GPU, and two ranks of a group must not share.
        "affinity": {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "labelSelector": {"matchLabels": {LWS_NAME_LABEL: plan.name}},
                        "topologyKey": "kubernetes.io/hostname",
                    },
                ]
            }
        },
    }
    if kube.host_network:
        spec["hostNetwork"] = True
        spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    selectors = kube.node_selectors
    if leader and selectors:
        spec["nodeSelector"] = dict(selectors[0])
    elif not leader and len(selectors) > 1:
        spec["affinity"]["nodeAffinity"] = _worker_affinity(selectors[1:])
    return spec


def _worker_affinity(selectors: Sequence[Mapping[str, str]]) -> dict[str, object]:
    """The workers share a template, so their node selectors become one requirement: the
    node matches any of them (each a term; terms are ORed)."""
    terms = [
        {"matchExpressions": [{"key": k, "operator": "In", "values": [v]} for k, v in s.items()]}
        for s in selectors
    ]
    return {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}


def render_lws(adapter: EngineAdapter, plan: LwsPlan) -> dict[str, Any]:
    """The LeaderWorkerSet that runs ``plan``: one group of ``parallel.nodes`` pods."""
    if "@sha256:" not in plan.image:
        raise UsageError(
            f"Kubernetes runs the image by digest; {plan.image} has none",
            "push it first (`sparkbuild publish BUILD`), then pass --image REPO@sha256:...",
        )
    labels = {STAGE_LABEL: plan.stage, "app.kubernetes.io/managed-by": "sparkbuild"}

    def template(leader: bool) -> dict[str, Any]:
        role = {"org.sparkbuild.role": "leader" if leader else "worker"}
        metadata: dict[str, object] = {"labels": {**labels, **role}}
        if plan.kube.annotations:
            metadata["annotations"] = dict(plan.kube.annotations)
        return {"metadata": metadata, "spec": _pod_spec(adapter, plan, leader)}

    return {
        "apiVersion": LWS_API,
        "kind": "LeaderWorkerSet",
        "metadata": {"name": plan.name, "namespace": plan.kube.namespace, "labels": labels},
        "spec": {
            "replicas": 1,
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {
                "size": plan.parallel.nodes,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": template(leader=True),
                "workerTemplate": template(leader=False),
            },
        },
    }


def pod_image_digests(pods: Mapping[str, Any]) -> dict[str, str | None]:
    """pod name -> the digest its engine container runs, from ``kubectl get pods -o json``
    (``status.containerStatuses[].imageID``, e.g. ``docker-pullable://REPO@sha256:...`` or
    ``REPO@sha256:...``); None for a pod whose container has not started."""
    found: dict[str, str | None] = {}
    for pod in pods.get("items") or []:
        name = str((pod.get("metadata") or {}).get("name") or "?")
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        image_id = next((s.get("imageID") for s in statuses if s.get("name") == "engine"), None)
        digest = str(image_id).rpartition("@")[2] if image_id and "@" in image_id else None
        found[name] = digest if digest and digest.startswith("sha256:") else None
    return found


class KubeTarget(MultiNodeTarget):
    """The LeaderWorkerSet of ``plan`` on the user's Kubernetes (through ``kubectl``)."""

    def __init__(
        self,
        cluster_name: str,
        cluster: ClusterSpec,
        adapter: EngineAdapter,
        plan: LwsPlan,
        *,
        log_path: Path | None = None,
        progress: Callable[[str], None] = lambda _message: None,
    ) -> None:
        self.cluster_name = cluster_name
        self.cluster = cluster
        self.adapter = adapter
        self.plan = plan
        self.parallel = plan.parallel
        self.nodes = list(cluster.nodes[: plan.parallel.nodes])
        self.log = LogBuffer(log_path)
        self.logs = self.log
        self.progress = progress
        self.pin = plan.image.rpartition("@")[2]
        self.image_id: str | None = None
        self.node_images: list[NodeImage] = []
        self.failed: str | None = None
        self._local_port = 0
        self._children: list[subprocess.Popen[bytes]] = []
        self._applied = False
        self.launcher_name = "lws"

    @property
    def description(self) -> str:
        return f"{self.cluster_name} lws/{self.plan.name} {self.plan.image}"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._local_port}"

    def _kubectl(self) -> list[str]:
        kubectl = shutil.which("kubectl")
        if kubectl is None:
            raise EngineContainerError(
                "kubectl is not on PATH; the Kubernetes target uses it with your kubeconfig",
                "install kubectl, or drop `kubernetes:` from the cluster file to use its "
                "Docker endpoints",
            )
        kube = self.plan.kube
        context = ["--context", kube.context] if kube.context else []
        return [kubectl, *context, "--namespace", kube.namespace]

    def _run(self, *args: str, stdin: str | None = None, timeout: float = 120) -> str:
        done = subprocess.run(
            [*self._kubectl(), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise EngineContainerError(
                f"kubectl {' '.join(args[:2])} failed: {done.stderr.strip()[:500]}",
                "check `kubectl get lws` and your kubeconfig context",
            )
        return done.stdout

    def start(self) -> None:
        manifest = render_lws(self.adapter, self.plan)
        self._kubectl()  # no kubectl: nothing is applied, so nothing is deleted either
        self.progress(f"applying lws/{self.plan.name} in {self.plan.kube.namespace}")
        self._applied = True  # from here on, stop() deletes it (an apply may half succeed)
        self._run("apply", "-f", "-", stdin=json.dumps(manifest))
        self.started_at = time.monotonic()
        deadline = f"{int(self.plan.kube.ready_timeout_s)}s"
        self.progress("waiting for every pod of the group to be created")
        self._run(
            "wait",
            "--for=condition=Available",
            f"lws/{self.plan.name}",
            f"--timeout={deadline}",
            timeout=self.plan.kube.ready_timeout_s + 30,
        )
        digests = self._check_digests("start")
        self.node_images = [NodeImage(pod, "kubernetes", d, d) for pod, d in digests.items()]
        for pod in digests:
            self._follow(pod)
        self._local_port = free_port()
        leader = f"pod/{self.plan.name}-0"
        self._children.append(
            subprocess.Popen(
                [*self._kubectl(), "port-forward", leader, f"{self._local_port}:{self.plan.port}"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        self.image_id = self.pin

    def _check_digests(self, when: str) -> dict[str, str | None]:
        pods = json.loads(
            self._run("get", "pods", "-l", f"{LWS_NAME_LABEL}={self.plan.name}", "-o", "json")
        )
        digests = pod_image_digests(pods)
        wrong = {pod: d for pod, d in digests.items() if d != self.pin}
        if len(digests) < self.parallel.nodes or wrong:
            listed = ", ".join(f"{pod}: {d or 'not running'}" for pod, d in wrong.items())
            raise ClusterImageError(
                f"at the {when} of the run, lws/{self.plan.name} has {len(digests)} of "
                f"{self.parallel.nodes} pods on {self.pin[:19]}"
                + (f" ({listed})" if listed else ""),
                "a rollout or another image is in the way; `kubectl get pods -o wide` shows it",
            )
        return digests

    def _follow(self, pod: str) -> None:
        proc = subprocess.Popen(
            [*self._kubectl(), "logs", "-f", f"pod/{pod}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self._children.append(proc)

        def pump() -> None:
            assert proc.stdout is not None
            for raw in proc.stdout:
                self.log.append(f"[{pod}] " + raw.decode("utf-8", errors="replace"))

        threading.Thread(target=pump, name=f"logs-{pod}", daemon=True).start()

    def exit_code(self) -> int | None:
        return None  # Kubernetes restarts pods; a broken group shows as failed requests

    def stop(self) -> None:
        try:
            if self.image_id is not None:  # the end-of-run check: a rollout in between
                self._check_digests("end")
        finally:
            for child in self._children:
                child.terminate()
            if self._applied:
                subprocess.run(
                    [
                        *self._kubectl(),
                        "delete",
                        f"lws/{self.plan.name}",
                        "--ignore-not-found",
                        "--wait=false",
                    ],
                    capture_output=True,
                    check=False,
                    timeout=120,
                )
            self.log.close()


__all__ = ["LWS_API", "KubeTarget", "LwsPlan", "pod_image_digests", "render_lws"]
