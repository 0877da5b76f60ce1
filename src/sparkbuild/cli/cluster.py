"""``--print-manifest`` for smoke's ``--cluster`` runs: the LeaderWorkerSet the run would
apply, for GitOps (the cluster target itself is made in ``engines.launch``)."""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

from sparkbuild import console, fileio
from sparkbuild.adapters import adapter_for
from sparkbuild.engines.cluster import KubernetesTarget, load_cluster
from sparkbuild.engines.cluster_kube import render_lws
from sparkbuild.engines.launch import LaunchSettings, lws_plan
from sparkbuild.engines.profiles import load_profile
from sparkbuild.errors import UsageError
from sparkbuild.settings import Settings
from sparkbuild.yamlfile import dump_yaml


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
    from sparkbuild.adapters.versions import parse_version

    adapter = adapter_for(profile.engine, version=parse_version(engine_version or ""))
    plan = lws_plan(
        profile, adapter, spec, spec.kubernetes or KubernetesTarget(), choice.image, "smoke"
    )
    # The LWS names its pods and headless Service after itself: a DNS-1035 label, short
    # enough for the pod suffixes (`-0-3`).
    label = re.sub(r"[^a-z0-9-]+", "-", f"sparkbuild-{name}".lower())[:52].strip("-")
    plan = dataclasses.replace(plan, name=label)
    text = dump_yaml(render_lws(adapter, plan), width=80)
    if path == "-":
        sys.stdout.write(text)
    else:
        fileio.write_output(Path(path), text, "--print-manifest")
        console.info(f"wrote the LeaderWorkerSet for {name} on {choice.cluster} to {path}")
