"""Before an engine boots on a DGX Spark: the memory-fit estimate and the page cache.

Smoke and bench call :func:`prepare_boot` once the profile and the engine version are known
and before anything starts. On a Spark (an aarch64 host with NVIDIA's runtime; every node of
a cluster) it

* estimates whether the profile fits the node's memory (engines/memory_fit), prints it, and
  refuses a launch that cannot fit unless ``--force`` (the estimate goes into the run's JSON
  either way);
* drops the page cache on each node (``--drop-caches``; on by default for images on a
  Spark, off for ``--command``), with a clear error where that needs a privilege it lacks.

Off a Spark (the CPU engine in CI) neither happens unless asked: the estimate's numbers are
the GB10's.
"""

from __future__ import annotations

import json
import platform
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import docker.errors
from packaging.version import Version

from sparkbuild import console, dockerhost
from sparkbuild.adapters import adapter_type
from sparkbuild.adapters.versions import VERSION_LABEL, parse_version
from sparkbuild.engines.cluster import ClusterSpec
from sparkbuild.engines.launch import LaunchSettings, check_signed
from sparkbuild.engines.memory_fit import Fit, describe, profile_fit
from sparkbuild.engines.page_cache import DROP_COMMAND, HELPER_VARIABLE, drop_local, helper_image
from sparkbuild.engines.profiles import SmokeProfile
from sparkbuild.errors import UsageError
from sparkbuild.jsontext import JsonObject

if TYPE_CHECKING:
    from docker import DockerClient

PATCHES_LABEL = "io.sparkbuild.patches"


@dataclass(frozen=True)
class BootPrep:
    """What was checked and done before the boot, for the run's JSON."""

    spark: bool
    fit: Fit | None
    no_estimate: str | None
    forced: bool
    dropped: tuple[str, ...]

    def to_json(self) -> JsonObject:
        return {
            "spark": self.spark,
            "fit": self.fit.to_json() if self.fit else None,
            "no_estimate": self.no_estimate,
            "forced": self.forced,
            "page_cache_dropped": list(self.dropped),
        }


def spark_endpoint(endpoint: str | None) -> bool:
    """A Docker host that is a DGX Spark: aarch64 with NVIDIA's container runtime."""
    info = dockerhost.info(dockerhost.client(timeout=30, endpoint=endpoint))
    return info.architecture in ("aarch64", "arm64") and "nvidia" in info.runtimes


def spark_here() -> bool:
    """This host is a DGX Spark: aarch64 with an NVIDIA GPU device."""
    return platform.machine() == "aarch64" and Path("/dev/nvidiactl").exists()


def draft_patched(labels: dict[str, str], engine: str) -> bool:
    """The image carries the engine's draft-memory patch (its adapter's
    ``memory.draft_patch``), applied, by its patches label."""
    memory = adapter_type(engine).memory
    patch = memory.draft_patch if memory else None
    if patch is None:
        return False
    try:
        patches = json.loads(labels.get(PATCHES_LABEL) or "[]")
    except json.JSONDecodeError:
        return False
    return any(
        isinstance(p, dict)
        and str(p.get("file", "")).endswith(patch)
        and p.get("status") == "applied"
        for p in patches
    )


def _drop_on(endpoint: str | None, candidate: str, node: str) -> None:
    """Drop a node's page cache through the fixed privileged helper there (page_cache),
    never through ``candidate``, the image under test."""
    api = dockerhost.client(endpoint=endpoint)
    helper = _helper_on(api, node)
    if helper == _image_id(api, candidate):
        raise UsageError(
            f"--drop-caches: the helper image on {node} is the image under test ({candidate}); "
            "sparkbuild never runs an image under test privileged",
            f"point {HELPER_VARIABLE} at another image, or pass --no-drop-caches",
        )
    try:
        done = dockerhost.run_once(
            api,
            helper,
            DROP_COMMAND[1:],
            entrypoint=DROP_COMMAND[0],
            privileged=True,
            network_mode="none",
            read_only=True,
            user="0:0",
            wait_s=120,
        )
    except docker.errors.DockerException as exc:
        raise _drop_failed(node, helper, str(exc)) from None
    if done.status != 0:
        raise _drop_failed(node, helper, done.stderr.decode(errors="replace").strip()[-300:])


def _image_id(api: DockerClient, image: str) -> str | None:
    try:
        return str(api.images.get(image).id)
    except docker.errors.DockerException:
        return None


def _helper_on(api: DockerClient, node: str) -> str:
    """The helper's image id on the node, pulled there by its digest if it is missing."""
    helper = helper_image()
    found = _image_id(api, helper)
    if found is None and not helper.startswith("sha256:"):
        try:
            found = str(api.images.pull(helper).id)
        except docker.errors.DockerException as exc:
            raise UsageError(
                f"--drop-caches: cannot pull the helper image {helper} on {node} ({exc})",
                f"pull it there (`docker pull {helper}`), set {HELPER_VARIABLE} to an image "
                "the node holds, or pass --no-drop-caches",
            ) from None
    if found is None:
        raise UsageError(
            f"--drop-caches: {node} does not hold the helper image {helper}",
            f"set {HELPER_VARIABLE} to an image the node holds, or pass --no-drop-caches",
        )
    return found


def _drop_failed(node: str, helper: str, why: str) -> UsageError:
    return UsageError(
        f"--drop-caches: cannot drop the page cache on {node}: the privileged helper "
        f"container of {helper} failed ({why})",
        "the node's Docker daemon must allow --privileged (rootful Docker); or pass "
        "--no-drop-caches",
    )


def _check_fit(
    fit: Fit | str, force: bool, name: str, profile: SmokeProfile
) -> tuple[Fit | None, str | None]:
    if isinstance(fit, str):
        console.info(fit)
        return None, fit
    for line in describe(fit):
        console.info(line)
    if not fit.fits and not force:
        memory = adapter_type(profile.engine).memory
        budget = f"lower {memory.budget_flag} or the context" if memory else "lower the context"
        raise UsageError(
            f"profile {name} does not fit a DGX Spark's memory: " + "; ".join(fit.problems),
            f"{budget}, run a release that counts the draft, or pass --force to boot anyway "
            f"(`sparkbuild profile fit {name}` shows the estimate)",
        )
    return fit, None


def prepare_boot(  # noqa: PLR0913 - what a boot is about to run, from each part of the launch
    name: str,
    profile: SmokeProfile,
    *,
    kind: str,
    image: str | None,
    nodes: Sequence[tuple[str, str | None]],
    version: Version | None,
    labels: dict[str, str],
    force: bool,
    drop_caches: bool | None,
    concurrency: int = 1,
    context: int | None = None,
) -> BootPrep:
    """Check the fit and drop the page cache on ``nodes`` ((name, endpoint) pairs) before a
    boot of ``kind`` (``image``, ``command``, ``cluster``); see the module's docstring."""
    if kind == "url":
        return BootPrep(False, None, None, False, ())
    spark = spark_here() if kind == "command" else all(spark_endpoint(e) for _, e in nodes)
    fit: Fit | None = None
    no_estimate = None if spark else "not a DGX Spark: no memory estimate"
    if spark:
        estimate = profile_fit(
            profile,
            version=version,
            context=context,
            concurrency=concurrency,
            draft_patched=draft_patched(labels, profile.engine),
        )
        fit, no_estimate = _check_fit(estimate, force, name, profile)
    drop = drop_caches if drop_caches is not None else spark and kind != "command"
    dropped: list[str] = []
    if drop and kind == "command":
        drop_local()
        dropped.append(platform.node())
    elif drop and image is not None:
        for node, endpoint in nodes:
            _drop_on(endpoint, image, node)
            dropped.append(node)
    if dropped:
        console.info(f"dropped the page cache on {', '.join(dropped)}")
    forced = fit is not None and not fit.fits
    return BootPrep(spark, fit, no_estimate, forced, tuple(dropped))


def _labels(image: str | None, endpoint: str | None) -> dict[str, str]:
    """The image's labels where it will run (none readable: no labels)."""
    if image is None:
        return {}
    try:
        found = dockerhost.client(timeout=30, endpoint=endpoint).images.get(image).labels
    except docker.errors.DockerException:
        return {}
    return dict(found or {})


def before_boot(
    name: str,
    profile: SmokeProfile,
    launch: LaunchSettings,
    version: Version | None,
    cluster: tuple[str, ClusterSpec] | None,
    *,
    concurrency: int = 1,
    context: int | None = None,
) -> BootPrep:
    """:func:`prepare_boot` for a smoke or bench launch (its nodes, its image's labels)."""
    choice = launch.choice
    nodes: list[tuple[str, str | None]] = (
        [(n.name, n.endpoint) for n in cluster[1].nodes] if cluster else [("this host", None)]
    )
    kind = "cluster" if cluster else choice.kind()
    if choice.image is not None and choice.key is not None:  # before anything runs anywhere
        check_signed(
            choice,
            [("this host", dockerhost.client())]
            + [
                (node, dockerhost.client(endpoint=endpoint)) for node, endpoint in nodes if endpoint
            ],
        )
    labels = _labels(choice.image, nodes[0][1]) if choice.image else {}
    return prepare_boot(
        name,
        profile,
        kind=kind,
        image=choice.image,
        nodes=nodes,
        version=version or parse_version(labels.get(VERSION_LABEL)),
        labels=labels,
        force=launch.force,
        drop_caches=launch.drop_caches,
        concurrency=concurrency,
        context=context,
    )
