"""A run's hosts: each node's facts before the boot, the nodes compared, the memory guarded
while the engine runs, and what the verdict keeps of it all (docs/smoke.md, "Host facts";
docs/cluster.md, "Drift between nodes").

* **Facts**: this host read directly; a cluster node through its Docker endpoint
  (engines/node_reader), once the image is on every node and its signature checked; the
  NCCL version from inside the engine's own container once it runs.
* **Drift**: a cluster's nodes compared before any rank starts. A driver or kernel that
  differs refuses the run, naming the node and the fact; DGX OS, firmware (BIOS, ConnectX)
  and NCCL that differ are warned about. ``--allow-host-drift`` runs anyway, and the verdict
  says so.
* **The guard** (engines/memory_guard) on every node, with the floor ``--memory-floor``, the
  profile's ``expect.memory_floor`` or, on a DGX Spark, the default gives.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

from sparkbuild import console
from sparkbuild.checks import CheckResult
from sparkbuild.engines.boot_phases import Phase
from sparkbuild.engines.boot_phases import describe as describe_phases
from sparkbuild.engines.host_facts import FACT_LABELS, NONE, NodeFacts, this_host
from sparkbuild.engines.memory_floor import OFF, SPARK_DEFAULT, MemoryFloor, parse_floor
from sparkbuild.engines.memory_guard import (
    CHECK,
    INTERVAL_S,
    GuardReport,
    LocalSampler,
    MemoryGuard,
    Sampler,
    run_phases,
)
from sparkbuild.engines.targets import ContainerTarget, ProcessTarget, Target
from sparkbuild.errors import EngineBootError, SparkbuildError, UsageError
from sparkbuild.jsontext import JsonObject

if TYPE_CHECKING:
    from sparkbuild.adapters import EngineAdapter
    from sparkbuild.engines.cluster_target import ClusterTarget

_T = TypeVar("_T")
#: Facts whose difference between a cluster's nodes refuses the run (unless allowed).
REFUSE = ("driver", "kernel")
#: Facts whose difference is named as a warning.
WARN = ("dgx_os", "bios", "connectx_fw", "nccl")

_NCCL = (
    "import glob, importlib.metadata as m\n"
    "found = sorted({f\"{d.metadata['Name']} {d.version}\" for d in m.distributions()"
    " if str(d.metadata['Name'] or '').lower().startswith('nvidia-nccl')})\n"
    "if not found:\n"
    "    found = sorted({p.rsplit('/', 1)[1] for pattern in ('/usr/lib/*/libnccl.so.*',"
    " '/usr/local/lib/python3*/*-packages/nvidia/nccl/lib/libnccl.so.*')"
    " for p in glob.glob(pattern)})\n"
    "print('; '.join(found) or 'none')\n"
)


@dataclass(frozen=True)
class Difference:
    """One fact that differs between nodes: each node's value (None: unknown there)."""

    fact: str
    values: Mapping[str, str | None]

    @property
    def refuses(self) -> bool:
        return self.fact in REFUSE

    def describe(self) -> str:
        label = FACT_LABELS.get(self.fact, self.fact)
        shown = ", ".join(f"{node} {value or 'unknown'}" for node, value in self.values.items())
        return f"{label} differs between the nodes: {shown}"


def differences(
    nodes: Sequence[NodeFacts], facts: Sequence[str] = REFUSE + WARN
) -> list[Difference]:
    """The facts that differ between ``nodes`` (an unknown on one node is no difference:
    it is said where the facts are shown)."""
    found = []
    for fact in facts:
        values = {n.node: n.value(fact) for n in nodes}
        known = {v for v in values.values() if v is not None}
        if len(known) > 1:
            found.append(Difference(fact, values))
    return found


@dataclass(frozen=True)
class HostRun:
    """What a verdict keeps of its hosts: each node's facts, the drift named before the
    boot (and whether it was allowed), the guard's report and the boot's phases."""

    nodes: tuple[NodeFacts, ...]
    drift: tuple[str, ...] = ()
    drift_allowed: bool = False
    guard: GuardReport | None = None
    phases: tuple[Phase, ...] = ()

    def check(self) -> CheckResult | None:
        return self.guard.check() if self.guard is not None else None

    def checks(self) -> list[CheckResult]:
        """The guard's check, when the run had a guard."""
        return [self.guard.check()] if self.guard is not None else []

    def lines(self) -> list[str]:
        """The hosts in a few lines for the terminal: facts, memory, drift, phases."""
        memory = {n.node: n for n in self.guard.nodes} if self.guard else {}
        out = []
        for node in self.nodes:
            facts = " · ".join(
                f"{FACT_LABELS[name]} {node.value(name) or 'unknown'}"
                for name in ("kernel", "driver", "dgx_os", "nccl")
            )
            out.append(f"host {node.node}: {facts}")
            seen = memory.get(node.node)
            if seen is not None and seen.start is not None and seen.lowest_gib is not None:
                out.append(
                    f"  MemAvailable {seen.start.available_gib:.2f} GiB at the start, lowest "
                    f"{seen.lowest_gib:.2f} GiB ({seen.lowest_phase}); took at most "
                    f"{seen.peak_taken_gib or 0:.2f} GiB"
                )
        out += [f"drift: {d}" for d in self.drift]
        if self.drift_allowed:
            out.append("drift: allowed with --allow-host-drift")
        if self.phases:
            out.append(f"boot phases: {describe_phases(self.phases)}")
        return out

    def to_json(self) -> JsonObject:
        return {
            "nodes": [n.to_json() for n in self.nodes],
            "drift": list(self.drift),
            "drift_allowed": self.drift_allowed,
            "memory": self.guard.to_json() if self.guard else None,
            "boot_phases": [p.to_json() for p in self.phases],
        }


@dataclass
class HostWatch:
    """A launch's hosts, read before the boot, and how the run guards them."""

    nodes: list[NodeFacts]
    floor: MemoryFloor
    #: Each node's sampler, made when the run starts (a node's may be a container).
    samplers: list[tuple[str, Callable[[], Sampler]]] = field(default_factory=list)
    drift: list[Difference] = field(default_factory=list)
    drift_allowed: bool = False
    interval_s: float = INTERVAL_S

    def watching(self, target: Target, adapter: EngineAdapter) -> Watch:
        return Watch(self, target, adapter)


class Watch:
    """The guard around one run of ``target``: entered before the target starts (``with
    watch, target:``), so the memory at the start is read first and a node already under its
    floor is refused before anything runs; ``finish()`` while the engine still exists gives
    the run's :class:`HostRun` (the NCCL version read from the engine's container then)."""

    def __init__(self, host: HostWatch | None, target: Target, adapter: EngineAdapter) -> None:
        self.host = host
        self.target = target
        self.adapter = adapter
        self.guard: MemoryGuard | None = None

    def __enter__(self) -> Watch:
        if self.host is not None and self.host.samplers:
            self.guard = MemoryGuard(
                self.target,
                [_sampler(node, make) for node, make in self.host.samplers],
                self.host.floor,
                self.adapter,
                interval_s=self.host.interval_s,
                on_stop=lambda stop: console.warn(f"memory guard: {stop.describe()}"),
            )
            self.guard.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self.guard is not None:
            self.guard.close()

    def step(self, run: Callable[[], _T]) -> _T:
        """``run``, whose failure is the guard's when the guard stopped the engine under it."""
        try:
            return run()
        except SparkbuildError as exc:
            stopped = self.guard.stopped if self.guard is not None else None
            if stopped is None:
                raise
            raise EngineBootError(
                f"{CHECK}: {stopped.describe()}",
                "lower the engine's memory budget or context, or free memory on that node; "
                "--memory-floor sets the floor (docs/smoke.md, 'Memory guard')",
            ) from exc

    def why(self, error: str | None) -> str | None:
        """A run's error, or the guard's stop when there was one (the requests failed
        because the guard stopped the engine)."""
        stopped = self.guard.stopped if self.guard is not None else None
        return f"{CHECK}: {stopped.describe()}" if stopped is not None else error

    def finish(self, ready_after_s: float | None) -> HostRun | None:
        """The run's record of its hosts (None for an engine started elsewhere)."""
        if self.host is None:
            return None
        container = _engine_container(self.target)
        value, why = nccl_in(container) if container is not None else (None, _no_image(self.target))
        known = value is not None and value != NONE
        nodes = tuple(n.with_fact("nccl", value, "" if known else why) for n in self.host.nodes)
        report = self.guard.report(ready_after_s) if self.guard is not None else None
        phases = (
            report.phases
            if report is not None
            else tuple(run_phases(self.target, self.adapter, ready_after_s))
        )
        return HostRun(
            nodes,
            tuple(d.describe() for d in self.host.drift),
            self.host.drift_allowed and bool(self.host.drift),
            report,
            phases,
        )


@dataclass
class _Unsampled:
    """A node whose sampler could not start: no sample, and why (the check says so)."""

    node: str
    why: str

    def sample(self) -> None:
        return None

    def close(self) -> None:
        return None


def _sampler(node: str, make: Callable[[], Sampler]) -> Sampler:
    try:
        return make()
    except Exception as exc:
        console.warn(f"memory guard: {node} cannot be sampled ({str(exc)[:200]})")
        return _Unsampled(node, str(exc)[:300])


def _no_image(target: Target) -> str:
    if target.kind == "command":
        return "a --command run has no image to read it from"
    if target.kind == "url":
        return "the engine runs elsewhere (--url)"
    return "not read: the engine's container never ran"


def _engine_container(target: Target) -> ContainerTarget | None:
    """The container NCCL is read in: the engine's, or a cluster's leader's."""
    if isinstance(target, ContainerTarget):
        return target
    ranks = getattr(target, "ranks", None)
    return ranks[-1] if ranks and isinstance(ranks[-1], ContainerTarget) else None


def nccl_in(container: ContainerTarget, wait_s: float = 120.0) -> tuple[str | None, str]:
    """The NCCL the image carries, read by the image's own Python in the engine's own
    container (unprivileged; it exists only once the signature check let it start)."""
    import docker.errors

    from sparkbuild import dockerhost

    try:
        client = dockerhost.client(timeout=int(wait_s), endpoint=container.endpoint)
        found = client.containers.get(container.name)
        for python in ("python3", "python"):
            code, out = found.exec_run([python, "-c", _NCCL], privileged=False)
            said = out if isinstance(out, bytes) else b""
            text = said.decode("utf-8", errors="replace").strip()
            if code == 0:
                value = text.splitlines()[-1][:200] if text else NONE
                why = "no nvidia-nccl distribution or libnccl in the image" if value == NONE else ""
                return value, why
        return None, f"the image's Python could not say: {text[-200:]}"
    except (docker.errors.DockerException, OSError) as exc:
        return None, f"not read from the engine's container: {str(exc)[:200]}"


# --- before the boot ----------------------------------------------------------------------


def choose_floor(given: str | None, profile_floor: str | None, spark: bool) -> MemoryFloor:
    """``--memory-floor``, else the profile's, else the DGX Spark default (none elsewhere)."""
    for text, where in ((given, "--memory-floor"), (profile_floor, "expect.memory_floor")):
        if text is not None:
            try:
                return parse_floor(text)
            except ValueError as exc:
                raise UsageError(
                    f"{where}: {exc}", "e.g. --memory-floor 8, 512MiB, 5% or off"
                ) from None
    return SPARK_DEFAULT if spark else OFF


def prepare(
    target: Target,
    floor: MemoryFloor,
    *,
    allow_drift: bool = False,
    progress: Callable[[str], None] = console.info,
) -> HostWatch | None:
    """The hosts of ``target`` before it starts (see the module's docstring); None for an
    engine someone else runs. A cluster whose nodes differ in driver or kernel is refused
    here, before any rank starts, unless ``allow_drift``."""
    if target.kind == "url":
        return None
    if target.kind in ("command", "image") and (
        isinstance(target, ProcessTarget) or getattr(target, "endpoint", None) is None
    ):
        return HostWatch([this_host()], floor, [("this host", LocalSampler)])
    cluster = _docker_cluster(target)
    if cluster is None:  # Kubernetes: its pods are placed by the scheduler, read once they run
        return HostWatch([], floor)
    return _cluster_watch(cluster, floor, allow_drift, progress)


def _docker_cluster(target: Target) -> ClusterTarget | None:
    from sparkbuild.engines.cluster_target import ClusterTarget

    return target if isinstance(target, ClusterTarget) else None


def _cluster_watch(
    cluster: ClusterTarget, floor: MemoryFloor, allow_drift: bool, progress: Callable[[str], None]
) -> HostWatch:
    from sparkbuild import dockerhost
    from sparkbuild.engines.cluster_target import sync_image
    from sparkbuild.engines.node_reader import ContainerSampler, read_docker_node

    # The reader runs the image under test: on every node first, as the cluster's start
    # would put it there (its start finds it in place).
    cluster.node_images = sync_image(cluster.nodes, cluster.image, cluster.pin, progress=progress)
    extra = [(str(m.source), m.target) for m in cluster.mounts if m.read_only]
    nodes: list[NodeFacts] = []
    samplers: list[tuple[str, Callable[[], Sampler]]] = []
    for node in cluster.nodes:
        if node.endpoint == "local":
            nodes.append(this_host(node.name))
            samplers.append((node.name, functools.partial(LocalSampler, node.name)))
            continue
        progress(f"{node.name}: reading its host facts")
        client = dockerhost.client(endpoint=node.docker_endpoint)
        nodes.append(read_docker_node(client, node.name, cluster.pin, extra))
        sampler = functools.partial(
            ContainerSampler,
            client,
            node.name,
            cluster.pin,
            node.docker_endpoint,
            INTERVAL_S,
            extra,
        )
        samplers.append((node.name, sampler))
    found = differences(nodes)
    _judge(found, allow_drift, cluster.cluster_name)
    return HostWatch(nodes, floor, samplers, found, allow_drift)


def _judge(found: Sequence[Difference], allow_drift: bool, cluster: str) -> None:
    """Refuse a driver or kernel that differs (unless allowed); warn about the rest."""
    refusing = [d for d in found if d.refuses]
    if refusing and not allow_drift:
        raise UsageError(
            f"cluster {cluster}: "
            + "; ".join(d.describe() for d in refusing)
            + ": nothing was started",
            "bring the nodes to the same driver and kernel (docs/cluster.md, 'Drift between "
            "nodes'), or pass --allow-host-drift to run anyway (the verdict says so)",
        )
    for difference in found:
        allowed = " (--allow-host-drift: running anyway)" if difference.refuses else ""
        console.warn(difference.describe() + allowed)


__all__ = [
    "REFUSE",
    "WARN",
    "Difference",
    "HostRun",
    "HostWatch",
    "Watch",
    "choose_floor",
    "differences",
    "nccl_in",
    "prepare",
]
