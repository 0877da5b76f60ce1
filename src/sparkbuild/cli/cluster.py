"""``--cluster`` for smoke and bench: the target on a cluster's Docker endpoints or its
Kubernetes, and ``--print-manifest`` (the LeaderWorkerSet, for GitOps)."""

from __future__ import annotations

import dataclasses
import re
import sys
import uuid
from pathlib import Path

import yaml

from sparkbuild import console
from sparkbuild.engines.adapters import EngineAdapter, adapter_for
from sparkbuild.engines.cluster import ClusterSpec, KubernetesTarget, load_cluster
from sparkbuild.engines.cluster_kube import DEFAULT_RENDEZVOUS_PORT, KubeTarget, LwsPlan, render_lws
from sparkbuild.engines.launch import (
    LaunchSettings,
    TargetChoice,
    check_cluster_profile,
    container_mounts,
    make_cluster_target,
    with_nan_switch,
)
from sparkbuild.engines.profiles import SmokeProfile, load_profile
from sparkbuild.engines.targets import Target
from sparkbuild.errors import UsageError
from sparkbuild.settings import Settings


def check_single_box(profile: SmokeProfile, name: str) -> None:
    """A profile for N > 1 nodes does not run on one box (its figures are not one box's)."""
    nodes = profile.parallel.nodes
    if nodes > 1:
        raise UsageError(
            f"profile {name} needs {nodes} nodes ({profile.parallel.label()}); this run has one",
            f"pass --cluster NAME with at least {nodes} nodes (docs/cluster.md)",
        )


def cluster_target(
    choice: TargetChoice,
    profile: SmokeProfile,
    adapter: EngineAdapter,
    logs: Path | None,
    stage: str,
    cluster: tuple[str, ClusterSpec],
    pin: str,
) -> Target:
    """The run's target: containers on the nodes' Docker endpoints, or a LeaderWorkerSet."""
    name, spec = cluster
    if spec.kubernetes is None:
        return make_cluster_target(
            choice, profile, adapter, logs, stage=stage, cluster=cluster, pin=pin,
            progress=console.info,
        )  # fmt: skip
    assert choice.image is not None
    plan = lws_plan(profile, adapter, spec, spec.kubernetes, choice.image, stage)
    return KubeTarget(name, spec, adapter, plan, log_path=logs, progress=console.info)


def lws_plan(
    profile: SmokeProfile,
    adapter: EngineAdapter,
    spec: ClusterSpec,
    kube: KubernetesTarget,
    image: str,
    stage: str,
) -> LwsPlan:
    profile = with_nan_switch(profile, adapter)
    check_cluster_profile(profile, adapter, len(spec.nodes), "the cluster")
    settings = profile.container
    mounts, model, mount_env = container_mounts(profile)
    port = settings.port or adapter.default_port
    return LwsPlan(
        name=f"sparkbuild-{stage}-{uuid.uuid4().hex[:8]}",
        image=image,
        parallel=profile.parallel,
        kube=kube,
        launcher=settings.launcher or list(adapter.cluster_launcher or adapter.default_launcher),
        serve=adapter.serve_args(model, "0.0.0.0", port, profile.args),
        port=port,
        health_path=adapter.health_path,
        env={**mount_env, **profile.env, **settings.env, **spec.fabric.env},
        mounts=mounts,
        rendezvous_port=spec.fabric.port or DEFAULT_RENDEZVOUS_PORT,
        stage=stage,
    )


def write_manifest(
    settings: Settings, launch: LaunchSettings, path: str, engine_version: str | None
) -> None:
    """``--print-manifest FILE`` (``-``: stdout): the LeaderWorkerSet this run would apply."""
    choice = launch.choice
    if choice.cluster is None or choice.image is None or launch.profile is None:
        raise UsageError(
            "--print-manifest renders a cluster run: give --image, --profile and --cluster",
            "e.g. sparkbuild smoke --image REPO@sha256:... --profile P --cluster NAME "
            "--print-manifest lws.yaml",
        )
    name, profile = load_profile(settings, launch.profile, model=launch.model)
    _, spec = load_cluster(settings, choice.cluster)
    from sparkbuild.engines.versions import parse_version

    adapter = adapter_for(profile.engine, version=parse_version(engine_version or ""))
    plan = lws_plan(profile, adapter, spec, spec.kubernetes or KubernetesTarget(),
                    choice.image, "smoke")  # fmt: skip
    # The LWS names its pods and headless Service after itself: a DNS-1035 label, short
    # enough for the pod suffixes (`-0-3`).
    label = re.sub(r"[^a-z0-9-]+", "-", f"sparkbuild-{name}".lower())[:52].strip("-")
    plan = dataclasses.replace(plan, name=label)
    text = yaml.safe_dump(render_lws(adapter, plan), sort_keys=False)
    if path == "-":
        sys.stdout.write(text)
    else:
        Path(path).write_text(text, encoding="utf-8")
        console.info(f"wrote the LeaderWorkerSet for {name} on {choice.cluster} to {path}")
