"""Launching an engine from a profile: target choice, command line, mounts, settled counters.

Smoke and bench both start engines this way: ``TargetChoice`` is what the user asked for
(``--image``, ``--command`` or ``--url``) and ``make_target`` turns it and a profile into a
target that starts and stops the engine; ``cluster_target`` does the same across a cluster's
nodes (Docker endpoints, or one LeaderWorkerSet).
"""

from __future__ import annotations

import shlex
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sparkbuild import console, net, redact
from sparkbuild.adapters import Counters, EngineAdapter
from sparkbuild.engines.cluster import ClusterSpec, KubernetesTarget
from sparkbuild.engines.cluster_kube import DEFAULT_RENDEZVOUS_PORT, KubeTarget, LwsPlan
from sparkbuild.engines.compile_cache import (
    INSIDE,
    CompileCache,
    cache_key,
    compiler_env,
    open_cache,
    volume_name,
)
from sparkbuild.engines.profiles import SmokeProfile
from sparkbuild.engines.targets import (
    LOOPBACK,
    ContainerTarget,
    Mount,
    ProcessTarget,
    Target,
    UrlTarget,
    free_port,
    local_image_id,
)
from sparkbuild.errors import UsageError

if TYPE_CHECKING:
    from docker import DockerClient


def command_argv(
    command: str, adapter: EngineAdapter, model: str, port: int, args: Sequence[str]
) -> list[str]:
    """The local engine command line.

    ``command`` is the launcher (``python -m vllm.entrypoints.openai.api_server``); model,
    host, port and the profile's flags are appended. A command that contains ``{port}`` is
    taken as complete and only has ``{port}``, ``{host}`` and ``{model}`` filled in (by plain
    replacement: any other brace, ``{}`` or ``{0}``, is the command's own text).
    """
    try:
        words = shlex.split(command)
    except ValueError as exc:
        raise UsageError(f"--command {command!r}: {exc}") from exc
    if not words:
        raise UsageError("--command is empty")
    if "{port}" in command:
        # Plain replacement of our three fields: any other braces are the command's own (a
        # JSON --speculative-config, a shell's ${VAR}), and nothing is formatted over objects.
        fields = {"{port}": str(port), "{host}": LOOPBACK, "{model}": model}
        return [_fill(word, fields) for word in words]
    return [*words, *adapter.serve_args(model, LOOPBACK, port, args)]


def _fill(word: str, fields: dict[str, str]) -> str:
    for placeholder, value in fields.items():
        word = word.replace(placeholder, value)
    return word


def container_mounts(profile: SmokeProfile) -> tuple[list[Mount], str, dict[str, str]]:
    """Mounts, the model as the engine inside sees it, and extra environment.

    A local model directory is mounted read-only at ``model_mount`` (or the directory given as
    ``model_dir`` holding it); a hub id gets ``model_dir`` (default: the HF cache) mounted
    read-only and offline mode, because a read-only cache cannot take downloads.
    """
    settings = profile.container
    mounts = [_parse_mount(m) for m in settings.mounts]
    env: dict[str, str] = {}
    local = Path(profile.model)
    if local.is_absolute() and local.exists():
        root = (settings.model_dir or local).resolve()
        try:
            inside = Path(settings.model_mount) / local.resolve().relative_to(root)
        except ValueError as exc:
            raise UsageError(f"model {local} is not inside container.model_dir {root}") from exc
        mounts.append(Mount(root, settings.model_mount))
        return mounts, inside.as_posix(), env
    cache = settings.model_dir or _hf_cache()
    if cache is not None and cache.exists():
        target = settings.model_mount if settings.model_dir else "/root/.cache/huggingface"
        mounts.append(Mount(cache.resolve(), target))
        env.update({"HF_HOME": target, "HF_HUB_OFFLINE": "1"})
    return mounts, profile.model, env


def _hf_cache() -> Path | None:
    import os

    home = os.environ.get("HF_HOME")
    return Path(home) if home else Path.home() / ".cache" / "huggingface"


def _parse_mount(value: str) -> Mount:
    parts = value.split(":")
    mode = parts[2] if len(parts) == 3 else "ro"
    return Mount(Path(parts[0]).expanduser().resolve(), parts[1], read_only=mode == "ro")


@dataclass(frozen=True)
class TargetChoice:
    """What the user asked to run: exactly one of image, command, url."""

    image: str | None = None
    command: str | None = None
    url: str | None = None
    gpus: str | None = None  # overrides the profile's container.gpus
    cluster: str | None = None  # a cluster name or file: --image runs on its nodes
    key: Path | None = None  # --key: every node's image must be signed by this public key

    def kind(self, command: str = "smoke") -> str:
        """``image``, ``command``, ``url`` or ``cluster`` (``--image`` with ``--cluster``); a
        UsageError unless exactly one target was given and ``--gpus`` comes with ``--image``."""
        given = [k for k in ("image", "command", "url") if getattr(self, k)]
        if len(given) != 1:
            raise UsageError(
                "give exactly one of --image, --command, --url",
                f"e.g. sparkbuild {command} --image sparkbuild/sglang:0.5.12-sm121-TREE12 "
                "--profile qwen3.6-27b-fp8-nextn-sglang",
            )
        if self.gpus is not None and self.image is None:
            raise UsageError("--gpus only applies to --image")
        if self.key is not None and self.image is None:
            raise UsageError("--key checks an image's signature: it only applies to --image")
        if self.cluster is not None:
            if self.image is None:
                raise UsageError(
                    "--cluster runs an image on the cluster's nodes: give --image with it",
                    f"e.g. sparkbuild {command} --image IMAGE --profile P --cluster NAME",
                )
            return "cluster"
        return given[0]


@dataclass(frozen=True)
class LaunchSettings:
    """How the engine is started or reached, as the command line asked: where it runs, what
    it serves, and how long booting and each request may take."""

    choice: TargetChoice
    profile: str | None = None  # a profile name or file; bench with --url may go without
    model: str | None = None  # serve this instead of the profile's model
    engine: str | None = None  # --url without a profile: the engine answering there
    boot_timeout_s: float | None = None  # None: the profile's expect.boot_timeout_s
    request_timeout_s: float | None = None  # None: the command's own default
    log_path: Path | None = None  # None: the command's default log directory
    force: bool = False  # boot even when the memory estimate says it does not fit
    drop_caches: bool | None = None  # None: on for images on a DGX Spark, off for commands
    fresh_compile_cache: bool = False  # start the image's compile cache empty
    memory_floor: str | None = None  # --memory-floor (engines/memory_floor); None: the default
    allow_host_drift: bool = False  # run a cluster whose nodes' driver or kernel differ


def compile_cache_for(launch: LaunchSettings, cache_dir: Path) -> CompileCache | None:
    """The run's compile cache on this host: the image's (by id) or the command's; none for
    a URL (whoever started that engine has its caches) or a cluster (each node's own)."""
    choice = launch.choice
    if choice.url is not None or choice.cluster is not None:
        if launch.fresh_compile_cache:
            raise UsageError(
                "--fresh-compile-cache empties this host's cache of an image or command it "
                "starts; an engine at --url, or a cluster's nodes (a volume on each), keep "
                "their own",
                "on a cluster: `docker volume rm sparkbuild-compile-ID` on each node",
            )
        return None
    image_id = local_image_id(choice.image) if choice.image else None
    key = cache_key(image_id, choice.command)
    return open_cache(cache_dir, key, fresh=launch.fresh_compile_cache)


def with_nan_switch(profile: SmokeProfile, adapter: EngineAdapter) -> SmokeProfile:
    """The profile with the engine version's own NaN switch added (``expect.nan_switch``).

    A profile that sets a NaN variable the version does not read is refused: the run would
    claim a detection that is not there.
    """
    ignored = adapter.ignored_variables({**profile.env, **profile.container.env})
    if ignored:
        raise UsageError(
            f"profile sets {', '.join(ignored)}, which {adapter.name} {adapter.version} "
            "does not read",
            "remove it from the profile's env; expect.nan_switch sets what this version reads",
        )
    switch = adapter.nan_switch()
    if not profile.expect.nan_switch or not switch.active:
        return profile
    args = [*profile.args, *(a for a in switch.args if a not in profile.args)]
    return profile.model_copy(update={"env": {**profile.env, **switch.env}, "args": args})


def remember_secrets(profile: SmokeProfile) -> None:
    """Mask, for the rest of the run, the values the profile gives secret flags and names
    (an engine's --api-key, a container's NGC_API_KEY), wherever an engine echoes them."""
    redact.remember_secrets(profile.args, {**profile.env, **profile.container.env})


def make_target(
    choice: TargetChoice,
    profile: SmokeProfile,
    adapter: EngineAdapter,
    log_path: Path | None,
    *,
    stage: str,
    compile_cache: CompileCache | None = None,
) -> Target:
    """The target ``choice`` asks for, running ``profile``; ``stage`` (``smoke``, ``bench``)
    names and labels a container, so ``docker ps`` tells whose engine it is;
    ``compile_cache`` is mounted (or given to the process) for the compilers to keep."""
    kind = choice.kind()
    if kind == "cluster":
        raise UsageError("a cluster run is made by make_cluster_target")
    remember_secrets(profile)
    if kind == "url":
        assert choice.url is not None
        return UrlTarget(choice.url)
    profile = with_nan_switch(profile, adapter)
    if kind == "command":
        assert choice.command is not None
        port = free_port()
        argv = command_argv(choice.command, adapter, profile.model, port, profile.args)
        engine_vars = adapter.compile_cache_vars
        compiled = compile_cache.env(str(compile_cache.root), engine_vars) if compile_cache else {}
        return ProcessTarget(argv, port=port, env={**compiled, **profile.env}, log_path=log_path)
    assert choice.image is not None
    if choice.key is not None:
        from sparkbuild import dockerhost

        check_signed(choice, [("this host", dockerhost.client())])
    settings = profile.container
    mounts, model, mount_env = container_mounts(profile)
    if compile_cache is not None:
        mounts.append(compile_cache.mount())
        mount_env = {**compile_cache.env(INSIDE, adapter.compile_cache_vars), **mount_env}
    port = settings.port or adapter.default_port
    gpus = choice.gpus if choice.gpus is not None else settings.gpus
    return ContainerTarget(
        choice.image,
        entrypoint=settings.launcher or list(adapter.default_launcher),
        args=adapter.serve_args(model, "0.0.0.0", port, profile.args),
        container_port=port,
        env={**mount_env, **profile.env, **settings.env},
        mounts=mounts,
        gpus=gpus,
        ipc=settings.ipc,
        shm_size=settings.shm_size,
        log_path=log_path,
        stage=stage,
    )


def check_signed(choice: TargetChoice, nodes: list[tuple[str, DockerClient]]) -> None:
    """``--key``: refuse, naming the node, an image the key did not sign (engines.signed)."""
    from sparkbuild.attest.keys import load_public
    from sparkbuild.engines.signed import require_signed

    assert choice.image is not None and choice.key is not None
    require_signed(choice.image, nodes, load_public(choice.key))


def make_cluster_target(
    choice: TargetChoice,
    profile: SmokeProfile,
    adapter: EngineAdapter,
    log_path: Path | None,
    *,
    stage: str,
    cluster: tuple[str, ClusterSpec],
    pin: str,
    progress: Callable[[str], None] = lambda _message: None,
) -> Target:
    """The profile's engine across ``cluster``'s nodes, each rank a container of the image
    ``pin`` (its id), placed by the cluster's Docker endpoints or by Kubernetes."""
    from sparkbuild.engines.cluster_target import ClusterTarget

    assert choice.image is not None
    name, spec = cluster
    remember_secrets(profile)
    profile = with_nan_switch(profile, adapter)
    check_cluster_profile(profile, adapter, len(spec.nodes), name)
    if choice.key is not None:
        from sparkbuild import dockerhost

        check_signed(
            choice,
            [("this host", dockerhost.client())]
            + [(n.name, dockerhost.client(endpoint=n.docker_endpoint)) for n in spec.nodes],
        )
    settings = profile.container
    mounts, model, mount_env = container_mounts(profile)
    # Each node keeps its own compile cache: a Docker volume on that node, per image id.
    mounts.append(Mount(Path(volume_name(pin)), INSIDE, read_only=False))
    mount_env = {**compiler_env(INSIDE, adapter.compile_cache_vars), **mount_env}
    port = settings.port or adapter.default_port
    launcher = settings.launcher or list(adapter.cluster_launcher or adapter.default_launcher)
    return ClusterTarget(
        name,
        spec,
        choice.image,
        pin,
        adapter,
        profile.parallel,
        launcher=launcher,
        serve=lambda host, serve_port: adapter.serve_args(model, host, serve_port, profile.args),
        container_port=port,
        env={**mount_env, **profile.env, **settings.env},
        mounts=mounts,
        gpus=choice.gpus if choice.gpus is not None else settings.gpus,
        ipc=settings.ipc,
        shm_size=settings.shm_size,
        stage=stage,
        log_path=log_path,
        progress=progress,
    )


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
            choice,
            profile,
            adapter,
            logs,
            stage=stage,
            cluster=cluster,
            pin=pin,
            progress=console.info,
        )
    assert choice.image is not None
    if choice.key is not None:
        raise UsageError(
            f"--key with cluster {name}: its Kubernetes nodes pull the image themselves",
            "enforce signatures at admission with the policy `sparkbuild keys policy` prints",
        )
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
        health_path=adapter.endpoints.health,
        env={**mount_env, **profile.env, **settings.env, **spec.fabric.env},
        mounts=mounts,
        rendezvous_port=spec.fabric.port or DEFAULT_RENDEZVOUS_PORT,
        stage=stage,
    )


def check_cluster_size(profile: SmokeProfile, nodes: int, cluster: str) -> None:
    """A profile that needs N nodes refuses a cluster with fewer, naming both numbers."""
    parallel = profile.parallel
    if nodes < parallel.nodes:
        raise UsageError(
            f"the profile needs {parallel.nodes} nodes ({parallel.label()}); cluster {cluster} "
            f"has {nodes}",
            f"add nodes to {cluster}, or use a profile for {nodes} nodes",
        )


def check_cluster_profile(
    profile: SmokeProfile, adapter: EngineAdapter, nodes: int, cluster: str
) -> None:
    """Before anything starts: the cluster is big enough, and the profile leaves the
    multi-node flags to the launch (they differ per rank)."""
    check_cluster_size(profile, nodes, cluster)
    parallel = profile.parallel
    if parallel.nodes < 2:
        raise UsageError(
            f"the profile runs on one node (parallel.nodes {parallel.nodes}); --cluster is for "
            "profiles that declare `parallel: {nodes: N}` with N > 1",
            "drop --cluster to run it on one box",
        )
    taken = [a for a in profile.args if a.split("=", 1)[0] in adapter.parallel_flags]
    if taken:
        raise UsageError(
            f"the profile's args set {', '.join(taken)}, which the multi-node launch sets "
            "per rank from `parallel:`",
            "remove them from args; parallel: {nodes, tp, ep, pp} says the layout",
        )


def settled_counters(
    adapter: EngineAdapter, session: net.Session, base_url: str, limit_s: float = 5.0
) -> Counters:
    """Counters once two reads agree: engines publish the last step's stats a moment late."""
    previous = adapter.snapshot_counters(session, base_url)
    deadline = time.monotonic() + limit_s
    while previous.available and time.monotonic() < deadline:
        time.sleep(0.3)
        current = adapter.snapshot_counters(session, base_url)
        if current.values == previous.values:
            return current
        previous = current
    return previous


def where_to_look(kind: str, log: str | Path | None) -> str:
    """Where the rest of an engine failure is, for the target kind that ran it: a URL's
    engine was started by someone else, a command's and a container's log is kept."""
    if kind == "url":
        return (
            "check that the URL points at a running engine of the profile's kind, and its own log"
        )
    what = "the container's log" if kind == "image" else "the engine's log"
    return f"{what} is at {log}" if log else f"see {what}"
