"""Cluster files (``clusters/<name>.yaml``): the machines a multi-node engine runs on.

A cluster names its nodes (each a Docker endpoint and the address the engines use between
nodes), the fabric settings every rank gets, and optionally a Kubernetes target. sparkbuild
does not distribute anything itself: the engines' own multi-node runtimes do (vLLM's mp
executor or Ray, SGLang's torch.distributed), and Docker endpoints or Kubernetes place the
ranks. The schema is documented in docs/cluster.md.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sparkbuild.settings import MAX_WAIT_S, Settings
from sparkbuild.yamlfile import load_model, named_file

MAX_NODES = 8
_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?\Z")  # a DNS label: also a pod suffix
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_HOST = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,252})\Z")
_CONTEXT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
LOCAL = "local"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def check_endpoint(value: str) -> str:
    """A Docker endpoint: ``local``, ``unix:///path``, ``ssh://[user@]host[:port]``,
    ``tcp://host:port``, or a docker context name. Nothing else reaches the docker SDK."""
    if value == LOCAL or _CONTEXT.match(value):
        return value
    scheme, sep, rest = value.partition("://")
    if not sep:
        raise ValueError(f"{value!r} is not local, a context name, or unix://, ssh://, tcp://")
    if scheme == "unix":
        if not rest.startswith("/") or any(c in rest for c in " \n\t;"):
            raise ValueError(f"{value!r}: unix:// needs an absolute socket path")
        return value
    if scheme not in ("ssh", "tcp"):
        raise ValueError(f"{value!r}: scheme {scheme!r} is not unix, ssh or tcp")
    user, at, hostport = rest.rpartition("@")
    if at and not re.match(r"^[A-Za-z0-9._-]+\Z", user):
        raise ValueError(f"{value!r}: the user name has characters ssh would not take")
    host, colon, port = hostport.partition(":")
    if not _HOST.match(host) or host.startswith("-"):
        raise ValueError(f"{value!r}: {host!r} is not a host name or address")
    if colon and not (port.isdigit() and 0 < int(port) < 65536):
        raise ValueError(f"{value!r}: port {port!r} is not 1-65535")
    if scheme == "tcp" and not colon:
        raise ValueError(f"{value!r}: tcp:// needs a port (e.g. tcp://spark-2:2376)")
    return value


def _env_names(value: dict[str, str]) -> dict[str, str]:
    for name in value:
        if not _ENV_NAME.match(name):
            raise ValueError(f"{name!r} is not an environment variable name")
    return value


class Node(_Strict):
    """One machine: where Docker answers, and where the other ranks reach it."""

    name: str
    endpoint: str = LOCAL
    address: str  # the address the engines use between nodes (NCCL/gloo rendezvous)
    # Where sparkbuild reaches the leader's HTTP API when the leader is this node (default:
    # 127.0.0.1 for a local endpoint, else the endpoint's host).
    api_host: str | None = None
    # This node's own environment, over the fabric's (an interface named otherwise here).
    env: dict[str, str] = {}

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(f"{value!r}: use lower-case letters, digits and '-' (a DNS label)")
        return value

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        return check_endpoint(value)

    @field_validator("address", "api_host")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        if value is None:
            return value
        try:
            ipaddress.ip_address(value)
        except ValueError:
            if not _HOST.match(value) or value.startswith("-"):
                raise ValueError(f"{value!r} is not an IP address or host name") from None
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        return _env_names(value)

    @property
    def local(self) -> bool:
        """The node is this machine (its daemon answers on a local socket)."""
        return self.endpoint == LOCAL or self.endpoint.startswith("unix://")

    @property
    def docker_endpoint(self) -> str | None:
        """The endpoint as the docker client takes it; None: this host's default daemon."""
        return None if self.endpoint == LOCAL else self.endpoint

    def http_host(self) -> str:
        if self.api_host:
            return self.api_host
        if self.local:
            return "127.0.0.1"
        if "://" not in self.endpoint:  # a docker context: its host is the node's address
            return self.address
        rest = self.endpoint.partition("://")[2]
        return rest.rpartition("@")[2].partition(":")[0]


class Fabric(_Strict):
    """What every rank gets to reach the others."""

    # Environment of every rank: NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME, NCCL_IB_HCA, ...
    env: dict[str, str] = {}
    # The Docker network of the ranks: `host` (what a Spark pair or ring uses: the QSFP link
    # is the host's interface), or a user-defined network whose subnet holds each node's
    # `address` (the rank's container gets that address on it).
    network: str = "host"
    # The rendezvous port on the leader (vLLM --master-port, SGLang --dist-init-addr); null: a
    # free one (chosen on the machine running sparkbuild, so name one for remote nodes).
    port: int | None = Field(default=None, gt=0, lt=65536)

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        return _env_names(value)

    @field_validator("network")
    @classmethod
    def _network(cls, value: str) -> str:
        if not _CONTEXT.match(value):
            raise ValueError(f"{value!r} is not a Docker network name")
        return value


class KubernetesTarget(_Strict):
    """Run the ranks as one LeaderWorkerSet instead of containers on Docker endpoints."""

    context: str | None = None  # kubeconfig context (default: the current one)
    namespace: str = "default"
    # One node selector per rank (leader first), e.g. {kubernetes.io/hostname: spark-1};
    # empty: the scheduler places the ranks.
    node_selectors: list[dict[str, str]] = []
    host_network: bool = True  # the ranks use the nodes' own interfaces (RoCE/QSFP)
    # Pod annotations, e.g. a Multus network for the fabric (k8s.v1.cni.cncf.io/networks).
    annotations: dict[str, str] = {}
    gpu_resource: str = "nvidia.com/gpu"
    gpus_per_node: int = Field(default=1, ge=0)
    shm_size: str = "16Gi"
    ready_timeout_s: float = Field(default=1800.0, gt=0, le=MAX_WAIT_S)

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(f"{value!r} is not a namespace name (a DNS label)")
        return value


class ClusterSpec(_Strict):
    description: str | None = None
    nodes: list[Node] = Field(min_length=1, max_length=MAX_NODES)
    fabric: Fabric = Fabric()
    kubernetes: KubernetesTarget | None = None

    @model_validator(mode="after")
    def _unique(self) -> ClusterSpec:
        names = [node.name for node in self.nodes]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"node names must be unique: {', '.join(twice)} named twice")
        if self.fabric.network != "host":
            addresses = [node.address for node in self.nodes]
            if len(set(addresses)) != len(addresses):
                raise ValueError(
                    f"on network {self.fabric.network!r} every node needs its own address"
                )
        return self

    @property
    def leader(self) -> Node:
        return self.nodes[0]


def cluster_path(settings: Settings, name_or_path: str) -> Path:
    """A cluster by name (``clusters/<name>.yaml``) or by path."""
    return named_file(
        settings.project_dir / "clusters",
        name_or_path,
        file_kind="cluster file",
        name_kind="cluster",
        known="known clusters",
        otherwise="write clusters/NAME.yaml (docs/cluster.md has the schema), or pass a file path",
    )


def load_cluster(settings: Settings, name_or_path: str) -> tuple[str, ClusterSpec]:
    """(cluster name, spec); a problem names the file, line and field (exit 2)."""
    path = cluster_path(settings, name_or_path)
    return path.stem, load_model(path, ClusterSpec)


__all__ = [
    "LOCAL",
    "MAX_NODES",
    "ClusterSpec",
    "Fabric",
    "KubernetesTarget",
    "Node",
    "check_endpoint",
    "cluster_path",
    "load_cluster",
]
