"""A multi-node engine on Docker endpoints: one container per node, the engine's own runtime
between them.

``ClusterTarget`` is a :class:`~sparkbuild.engines.targets.Target` like the others, so smoke
and bench run their checks against its leader unchanged. What it adds:

* **One image everywhere, by id** (:func:`sync_image`): before any rank starts, every node
  must hold the image under test with the same id as here (the pin). A node that lacks it
  gets it (pulled by digest when the image has a registry digest, else streamed over the
  Docker API from this host, with progress per node); a node whose copy of the reference is
  another image is refused, naming the node. After the start, the id each rank's container
  runs is read back from the container, for the record.
* **Launch**: workers first, then the leader; every node's log streams into one log, each line
  prefixed ``[node]``. The adapter renders each rank's multi-node flags.
* **Teardown, always**: a rank that exits takes the cluster down (a headless vLLM worker does
  not exit when its leader dies, and a leader waits on a dead worker), ``stop()`` removes every
  container on every node, and each container has a lifeline on its own node's daemon plus
  the owner labels the orphan sweep goes by (each rank's start sweeps its own node).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkbuild.adapters import EngineAdapter, RankPlace
from sparkbuild.engines.cluster import ClusterSpec, Node
from sparkbuild.engines.logs import LogBuffer
from sparkbuild.engines.targets import STAGE_LABEL, ContainerTarget, Mount, Target, TargetKind
from sparkbuild.errors import ClusterImageError, EngineContainerError, LocalImageError, UsageError

if TYPE_CHECKING:
    from docker import DockerClient

    from sparkbuild.engines.profiles import Parallel

CLUSTER_LABEL = "org.sparkbuild.cluster"  # the cluster file's name
NODE_LABEL = "org.sparkbuild.node"  # the node a rank runs on
_CHUNK = 4 << 20


@dataclass(frozen=True)
class NodeImage:
    """What one node holds and ran: the id under the image reference, and (after the start)
    the id its rank's container runs."""

    node: str
    endpoint: str
    image_id: str | None
    ran_image_id: str | None = None
    rank: int | None = None


class _PrefixedLog(LogBuffer):
    """One rank's view of the cluster log: its lines go in with ``[node] `` in front."""

    def __init__(self, cluster: LogBuffer, node: str) -> None:
        super().__init__()
        self._cluster, self._prefix = cluster, f"[{node}] "

    def append(self, line: str) -> None:
        self._cluster.append(self._prefix + line.rstrip("\r\n"))


class RankContainer(ContainerTarget):
    """One rank's container on its node: on the fabric's network (``host``, or a
    user-defined network with the node's address), labelled with the cluster and node."""

    def __init__(
        self, *, node: Node, network: str, cluster: str, http_port: int | None, **kwargs: Any
    ) -> None:
        super().__init__(endpoint=node.docker_endpoint, **kwargs)
        self.node = node
        self.network = network
        self.cluster = cluster
        self.http_port = http_port  # the container port to publish (leader, bridge network)
        self.name = f"{self.name}-{node.name}"

    def _run_kwargs(self) -> dict[str, Any]:
        kwargs = super()._run_kwargs()
        kwargs["labels"] = {
            **kwargs["labels"],
            CLUSTER_LABEL: self.cluster,
            NODE_LABEL: self.node.name,
        }
        kwargs.pop("ports", None)
        if self.network == "host":
            kwargs["network_mode"] = "host"
            return kwargs
        assert self._client is not None  # made by start() before the container is
        kwargs["network"] = self.network
        # The node's address on the network, fixed when the container is made.
        endpoint = self._client.api.create_endpoint_config(ipv4_address=self.node.address)
        kwargs["networking_config"] = {self.network: endpoint}
        if self.http_port is not None:  # only the leader serves HTTP
            bind = "127.0.0.1" if self.node.local else "0.0.0.0"
            kwargs["ports"] = {f"{self.http_port}/tcp": (bind, None)}
        return kwargs

    def host_port(self) -> int | None:
        return self._host_port


def _endpoint_client(node: Node) -> DockerClient:
    from sparkbuild import dockerhost

    return dockerhost.client(endpoint=node.docker_endpoint)


def _image_id_on(client: DockerClient, reference: str) -> str | None:
    import docker.errors

    try:
        return str(client.images.get(reference).id)
    except docker.errors.ImageNotFound:
        return None


def sync_image(
    nodes: Sequence[Node],
    image: str,
    pin: str,
    *,
    progress: Callable[[str], None],
    clients: Mapping[str, DockerClient] | None = None,
) -> list[NodeImage]:
    """Make every node hold ``image`` as id ``pin``, or refuse naming the node that holds
    another image under that reference. Nothing is started here."""
    clients = clients or {}
    found: list[NodeImage] = []
    for node in nodes:
        client = clients.get(node.name) or _endpoint_client(node)
        held = _image_id_on(client, image)
        if held is None:
            held = _fetch(client, node, image, pin, progress)
        if held != pin:
            raise ClusterImageError(
                f"node {node.name} ({node.endpoint}) holds another image as {image}: "
                f"{(held or 'none')[:19]}, not {pin[:19]} (the image under test)",
                f"give {node.name} the same image: `docker --host {node.endpoint} rmi {image}` "
                "and run again (sparkbuild copies it over), or push it to a registry and "
                "pull it there by digest",
            )
        progress(f"{node.name}: {image} is {pin[:19]}")
        found.append(NodeImage(node.name, node.endpoint, held))
    return found


def _fetch(
    client: DockerClient, node: Node, image: str, pin: str, progress: Callable[[str], None]
) -> str | None:
    """Bring ``pin`` to a node that lacks ``image``: it may hold the id already (tag it), or
    pull it by digest, or receive it streamed from this host's daemon."""
    from sparkbuild import dockerhost

    if _image_id_on(client, pin) is None:
        local = dockerhost.client()
        digests = list(local.images.get(pin).attrs.get("RepoDigests") or [])
        pulled = _pull_by_digest(client, node, digests, progress)
        if not pulled:
            _stream(local, client, node, pin, progress)
    repository, _, tag = (
        image.rpartition(":") if ":" in image.rsplit("/", 1)[-1] else (image, "", "latest")
    )
    client.images.get(pin).tag(repository, tag or "latest")
    return _image_id_on(client, image)


def _pull_by_digest(
    client: DockerClient, node: Node, digests: Sequence[str], progress: Callable[[str], None]
) -> bool:
    import docker.errors

    for reference in digests:
        progress(f"{node.name}: pulling {reference}")
        try:
            for event in client.api.pull(reference, stream=True, decode=True):
                status = event.get("status", "") if isinstance(event, dict) else ""
                if status.startswith(("Downloading", "Extracting")):
                    progress(f"{node.name}: {status} {event.get('progress', '')}".rstrip())
            return True
        except docker.errors.APIError as exc:
            progress(f"{node.name}: pull of {reference} failed ({exc.explanation or exc})")
    return False


def _stream(
    local: DockerClient,
    client: DockerClient,
    node: Node,
    pin: str,
    progress: Callable[[str], None],
) -> None:
    """``docker save`` here into ``docker load`` there, chunk by chunk, with progress."""
    size = int(local.images.get(pin).attrs.get("Size") or 0)
    sent = 0
    last = 0.0

    def chunks() -> Iterator[bytes]:
        nonlocal sent, last
        for chunk in local.api.get_image(pin, chunk_size=_CHUNK):
            sent += len(chunk)
            if time.monotonic() - last > 2:
                last = time.monotonic()
                share = f" of ~{size >> 20} MiB" if size else ""
                progress(f"{node.name}: sending the image, {sent >> 20} MiB{share}")
            yield chunk

    progress(f"{node.name}: no copy of {pin[:19]} there; sending it over the Docker API")
    for _ in client.api.load_image(chunks()):  # type: ignore[no-untyped-call]
        pass
    progress(f"{node.name}: received {sent >> 20} MiB")


class MultiNodeTarget(Target):
    """An engine across nodes (Docker endpoints or Kubernetes): what a cluster verdict
    records, and the ranks its logs say joined."""

    kind: TargetKind = "cluster"
    cluster_name: str
    parallel: Parallel
    nodes: list[Node]
    node_images: list[NodeImage]
    failed: str | None = None  # which rank ended the cluster, and how
    image_id: str | None = None  # the pin, once every node ran it
    adapter: EngineAdapter
    log: LogBuffer
    launcher_name: str

    def joined(self) -> tuple[int, int | None, set[int]]:
        """(expected world size, logged world size, ranks logged as joined)."""
        world, ranks = self.adapter.joined_ranks(self.log.since(0))
        return self.parallel.tp * self.parallel.pp, world, ranks


class ClusterTarget(MultiNodeTarget):
    """The engine across the cluster's nodes: rank ``i`` on node ``i``, rank 0 the leader."""

    def __init__(  # noqa: PLR0913 - ContainerTarget's settings, passed to each rank
        self,
        cluster_name: str,
        cluster: ClusterSpec,
        image: str,
        pin: str,
        adapter: EngineAdapter,
        parallel: Parallel,
        *,
        launcher: Sequence[str],
        serve: Callable[[str, int], list[str]],
        container_port: int,
        env: Mapping[str, str],
        mounts: Sequence[Mount],
        gpus: str | None,
        ipc: str,
        shm_size: str | None,
        stage: str,
        log_path: Path | None = None,
        progress: Callable[[str], None] = lambda _message: None,
    ) -> None:
        self.cluster_name = cluster_name
        self.cluster = cluster
        self.nodes = list(cluster.nodes[: parallel.nodes])
        self.image = image
        self.pin = pin
        self.adapter = adapter
        self.parallel = parallel
        self.launcher = list(launcher)
        self.serve = serve
        self.container_port = container_port
        self.env = dict(env)
        self.mounts = list(mounts)
        self.gpus, self.ipc, self.shm_size, self.stage = gpus, ipc, shm_size, stage
        self.log = LogBuffer(log_path)
        self.logs = self.log
        self.launcher_name = parallel.launcher or adapter.parallel_launchers[0]
        self.progress = progress
        self.node_images: list[NodeImage] = []
        self.image_id: str | None = None  # the pin, once every node ran it
        self.failed: str | None = None  # which rank ended the cluster, and how
        self.ranks: list[RankContainer] = []
        self._exit: int | None = None
        self._monitor: threading.Thread | None = None
        self._stopping = threading.Event()
        self._scan_lock = threading.Lock()

    @property
    def description(self) -> str:
        names = ",".join(node.name for node in self.nodes)
        return f"{self.cluster_name}[{names}] {self.image}"

    @property
    def leader(self) -> RankContainer:
        return self.ranks[-1]  # started last

    @property
    def base_url(self) -> str:
        if not self.ranks:
            raise EngineContainerError(f"cluster {self.cluster_name} has not started")
        node = self.nodes[0]
        port = (
            self.container_port
            if self.cluster.fabric.network == "host"
            else self.leader.host_port()
        )
        if port is None:
            raise EngineContainerError(f"the leader on {node.name} has no published port")
        return f"http://{node.http_host()}:{port}"

    def start(self) -> None:
        from sparkbuild.engines.targets import free_port

        self.progress(f"checking the image on {len(self.nodes)} nodes")
        self.node_images = sync_image(self.nodes, self.image, self.pin, progress=self.progress)
        port = self.cluster.fabric.port or free_port()
        leader = self.nodes[0]
        self.started_at = time.monotonic()
        for rank in reversed(range(len(self.nodes))):  # workers first, the leader last
            node = self.nodes[rank]
            place = RankPlace(rank, len(self.nodes), leader.address, port, node.address)
            http = self.container_port if rank == 0 else None
            bind = (
                "0.0.0.0"
                if self.cluster.fabric.network != "host" or not node.local
                else "127.0.0.1"
            )
            command = self.adapter.rank_command(
                self.launcher, self.serve(bind, self.container_port), self.parallel, place
            )
            container = RankContainer(
                node=node,
                network=self.cluster.fabric.network,
                cluster=self.cluster_name,
                http_port=http,
                image=self.pin,
                entrypoint=command.entrypoint,
                args=command.args,
                container_port=self.container_port,
                env={**self.env, **self.cluster.fabric.env, **node.env},
                mounts=self.mounts,
                gpus=self.gpus,
                ipc=self.ipc,
                shm_size=self.shm_size,
                stage=self.stage,
                logs=_PrefixedLog(self.log, node.name),
            )
            self.ranks.append(container)
            self.progress(f"starting rank {rank} on {node.name}")
            container.start()
        self.image_id = self.pin
        self._record_ran_images()
        self._monitor = threading.Thread(target=self._watch, name="cluster-watch", daemon=True)
        self._monitor.start()

    def _record_ran_images(self) -> None:
        ran = {c.node.name: (c.image_id, self.nodes.index(c.node)) for c in self.ranks}
        self.node_images = [
            NodeImage(n.node, n.endpoint, n.image_id, *ran.get(n.node, (None, None)))
            for n in self.node_images
        ]

    def _watch(self) -> None:
        """A rank that exits ends the cluster: the others are stopped at once, so the
        leader's requests fail now instead of hanging on a dead worker."""
        while not self._stopping.wait(1.0):
            if self._scan():
                return

    def _scan(self, now: bool = False) -> bool:
        """Whether a rank has exited; the first one found is named and ends the cluster.
        ``now``: ask every daemon afresh (the answers are otherwise kept for half a second)."""
        with self._scan_lock:
            if self._exit is not None:
                return True
            for rank, container in enumerate(reversed(self.ranks)):
                code = container.exit_code_now() if now else container.exit_code()
                if code is None:
                    continue
                role = "the leader" if rank == 0 else f"worker rank {rank}"
                self.failed = f"{role} on node {container.node.name} exited with status {code}"
                self._exit = code
                self.log.append(f"[sparkbuild] {self.failed}; stopping the other ranks")
                for other in self.ranks:
                    if other is not container:
                        other.kill()
                return True
            return False

    def _name_a_rank_that_went(self) -> None:
        """A killed leader fails the requests before its daemon reports the exit: while the
        leader does not answer, give the daemons a few seconds to say which rank went."""
        import requests

        deadline = time.monotonic() + 5.0
        while not self._scan(now=True) and time.monotonic() < deadline:
            try:
                requests.get(
                    self.base_url + self.adapter.endpoints.health, timeout=1
                ).raise_for_status()
                return  # the leader answers: nothing went
            except (requests.RequestException, EngineContainerError):
                time.sleep(0.2)

    def exit_code(self) -> int | None:
        # Asked directly too: a killed leader fails the requests at once, before the
        # watcher's next look, and the run must still name the node that went.
        if self._exit is None and self.ranks and not self._stopping.is_set():
            self._scan(now=True)
        return self._exit

    def describe_exit(self, code: int) -> str:
        return self.failed or super().describe_exit(code)

    def stop(self) -> None:
        if self.ranks and not self._stopping.is_set():
            self._name_a_rank_that_went()
        self._stopping.set()
        threads = [threading.Thread(target=rank.stop) for rank in self.ranks]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if self._monitor is not None:
            self._monitor.join(timeout=5)
        self.log.close()


def node_pin(cluster: ClusterSpec, image: str) -> str:
    """What every node must run: on Kubernetes the digest the pods pull (``image``'s), which
    they are checked against at both ends of the run; else the image's id (:func:`cluster_pin`)."""
    if cluster.kubernetes is None:
        return cluster_pin(cluster, image)
    if "@sha256:" not in image:
        raise UsageError(
            f"Kubernetes runs the image by digest; {image} has none",
            "push it first (`sparkbuild publish BUILD`), then pass --image REPO@sha256:...",
        )
    return image.rpartition("@")[2]


def cluster_pin(cluster: ClusterSpec, image: str) -> str:
    """The id ``image`` must have on every node: this host's copy when it has one (what
    sparkbuild built or pulled), else the first node's that holds it."""
    from sparkbuild import dockerhost

    here = _image_id_on(dockerhost.client(), image)
    if here is not None:
        return here
    for node in cluster.nodes:
        there = _image_id_on(_endpoint_client(node), image)
        if there is not None:
            return there
    raise LocalImageError(
        f"no node of the cluster, and not this host, holds {image}",
        "build it with `sparkbuild build BUILD`, or pull it on one node",
    )


__all__ = [
    "CLUSTER_LABEL",
    "NODE_LABEL",
    "STAGE_LABEL",
    "ClusterTarget",
    "MultiNodeTarget",
    "NodeImage",
    "RankContainer",
    "cluster_pin",
    "node_pin",
    "sync_image",
]
