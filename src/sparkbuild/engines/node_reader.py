"""A cluster node's host facts and memory, through its Docker endpoint.

A node sparkbuild reaches only through Docker (``unix://``, ``tcp://``, ``ssh://``, a
context) is read in two ways:

* its daemon's ``/info`` (no container): kernel, OS, architecture, Docker, its runtimes;
* a short container of the image the run is about to start (on every node by then, and
  signed when ``--key`` asked; never another image, and never before that check), as
  unprivileged as Docker allows: user nobody, no network, no capabilities, no new
  privileges, a read-only root, a few MiB and processes. It reads what any process on the
  host may read (procfs, sysfs, ``nvidia-smi`` when the NVIDIA runtime gives it) and the
  host's ``/etc/os-release``, ``/etc/dgx-release`` and ``/proc/driver/nvidia`` mounted
  read-only where present; it prints them, framed, and sparkbuild parses what it printed
  (bounded) with the same parsers as a local read. Its output is read before the container
  is removed (docker-py's ``run(remove=True)`` loses it: issue 46).

While the engine runs, a second such container prints ``/proc/meminfo`` four times a
second: the memory guard's sampler on that node.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from sparkbuild.engines.host_facts import (
    SMI_BANNER_ARGV,
    SMI_QUERY_ARGV,
    FactUnreadable,
    Memory,
    NodeFacts,
    parse_meminfo,
    read_node,
)
from sparkbuild.engines.lifeline import Lifeline, owner_labels

if TYPE_CHECKING:
    from docker import DockerClient
    from docker.types import Mount

_T = TypeVar("_T")
#: Host paths the reader mounts read-only, each only where the node has it.
HOST_MOUNTS = ("/etc/os-release", "/etc/dgx-release", "/proc/driver/nvidia")
_INSIDE = "/host"
_FRAME = "@@sparkbuild@@"
_OUTPUT_LIMIT = 256 * 1024
READER_LABEL = "org.sparkbuild.reader"  # which reader a container is: facts or memory
_FILES = (
    "/proc/sys/kernel/osrelease",
    "/etc/os-release",
    "/etc/dgx-release",
    "/proc/driver/nvidia/version",
    "/proc/meminfo",
    "/sys/class/dmi/id/bios_version",
    "/sys/class/dmi/id/bios_date",
)


def _script(mounted: Sequence[str]) -> str:
    """The reader's shell: each file framed by its path, then the RDMA firmware and
    nvidia-smi. Only fixed paths and commands; nothing from the node is run."""

    def where(path: str) -> str:
        inside = any(path == m or path.startswith(m + "/") for m in mounted)
        return _INSIDE + path if inside else path

    lines = []
    for path in _FILES:
        lines.append(f"echo '{_FRAME} file {path}'; cat '{where(path)}' 2>/dev/null || true")
    lines.append(
        'for d in /sys/class/infiniband/*; do [ -r "$d/fw_ver" ] || continue; '
        f'echo "{_FRAME} file $d/fw_ver"; cat "$d/fw_ver"; done'
    )
    query = " ".join(SMI_QUERY_ARGV)
    lines.append(
        "if command -v nvidia-smi >/dev/null 2>&1; then "
        f"echo '{_FRAME} run query'; {query} 2>&1; "
        f"echo '{_FRAME} run banner'; {SMI_BANNER_ARGV[0]} 2>&1; fi"
    )
    lines.append(f"echo '{_FRAME} end'")
    return "\n".join(lines)


class DumpSource:
    """A node's files and commands as its reader printed them (``LocalSource``'s shape)."""

    def __init__(self, files: Mapping[str, str], runs: Mapping[str, str], complete: bool) -> None:
        self.files, self.runs, self.complete = files, runs, complete

    @classmethod
    def parse(cls, text: str) -> DumpSource:
        """The reader's output: each frame's lines under its file's path or command's name;
        ``complete`` when the reader got to its end."""
        files: dict[str, str] = {}
        runs: dict[str, str] = {}
        current: tuple[str, str] | None = None
        lines: list[str] = []
        complete = False
        for line in text[:_OUTPUT_LIMIT].splitlines():
            if not line.startswith(_FRAME + " "):
                lines.append(line)
                continue
            if current is not None:
                (files if current[0] == "file" else runs)[current[1]] = "\n".join(lines) + "\n"
            kind, _, name = line[len(_FRAME) + 1 :].partition(" ")
            current, lines = ((kind, name), []) if kind in ("file", "run") else (None, [])
            complete = complete or kind == "end"
        return cls(files, runs, complete)

    def read(self, path: str) -> str:
        text = self.files.get(path)
        if text is None or not text.strip():
            raise FileNotFoundError(2, "absent on the node", path)
        return text

    def exists(self, path: str) -> bool:
        return bool(self.files.get(path, "").strip()) or any(
            f.startswith(path.rstrip("/") + "/") for f in self.files
        )

    def listdir(self, path: str) -> list[str]:
        prefix = path.rstrip("/") + "/"
        names = {f[len(prefix) :].split("/", 1)[0] for f in self.files if f.startswith(prefix)}
        if not names:
            raise FileNotFoundError(2, "absent on the node", path)
        return sorted(names)

    def run(self, argv: Sequence[str]) -> str:
        said = self.runs.get("query" if len(argv) > 1 else "banner")
        if said is None:
            raise FactUnreadable(f"{argv[0]} is not in the node's containers (no NVIDIA runtime)")
        return said


#: A read-only mount the engine's own container has too (source on the node, target).
Extra = tuple[str, str]


def _mounts(paths: Sequence[str], extra: Sequence[Extra]) -> list[Mount]:
    import docker.types

    binds = [(path, _INSIDE + path) for path in paths] + list(extra)
    return [docker.types.Mount(to, source, type="bind", read_only=True) for source, to in binds]


def _reader(purpose: str, mounted: Sequence[str], extra: Sequence[Extra]) -> dict[str, Any]:
    """``containers.create``'s settings of a reader container (the module's docstring)."""
    return {
        "entrypoint": ["sh", "-c"],
        "user": "65534:65534",
        "network_mode": "none",
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "read_only": True,
        "mem_limit": "64m",
        "pids_limit": 32,
        "labels": {READER_LABEL: purpose, **owner_labels()},
        "name": f"sparkbuild-{purpose}-{uuid.uuid4().hex[:10]}",
        "mounts": _mounts(mounted, extra),
    }


def _with_mounts(attempt: Callable[[list[str]], _T]) -> _T:
    """``attempt`` with as many of :data:`HOST_MOUNTS` as the node has: Docker refuses a bind
    of a path the node lacks when the container is made, so that path is left out and it is
    tried again."""
    import docker.errors

    mounted = list(HOST_MOUNTS)
    while True:
        try:
            return attempt(mounted)
        except docker.errors.APIError as exc:
            said = str(exc.explanation or exc)
            missing = [m for m in mounted if m in said]
            if "does not exist" not in said or not missing:
                raise
            mounted.remove(missing[0])


def read_docker_node(
    client: DockerClient, node: str, image: str, extra: Sequence[Extra] = ()
) -> NodeFacts:
    """A node's facts through its daemon: ``/info``, then the reader container."""
    info = dict(client.info())
    try:
        dump = _run_reader(client, image, extra)
    except Exception as exc:
        facts = read_node(DumpSource({}, {}, False), node, info)
        why = f"the reader container of {image[:19]} failed: {str(exc)[:200]}"
        for name in ("driver", "dgx_os", "bios", "connectx_fw", "gpu", "cuda_driver"):
            facts = facts.with_fact(name, None, why)
        return facts
    facts = read_node(dump, node, info)
    return facts if facts.value("arch") else facts.with_fact("arch", str(info.get("Architecture")))


def _run_reader(client: DockerClient, image: str, extra: Sequence[Extra]) -> DumpSource:
    from sparkbuild import dockerhost

    finished = _with_mounts(
        lambda mounted: dockerhost.run_once(
            client,
            image,
            [_script(mounted)],
            wait_s=60,
            limit=_OUTPUT_LIMIT,
            **_reader("facts", mounted, extra),
        )
    )
    return DumpSource.parse(finished.stdout.decode("utf-8", errors="replace"))


class ContainerSampler:
    """A node's ``/proc/meminfo``, printed by a reader container every ``interval_s`` and
    kept as it streams in; ``sample()`` gives the latest (None before the first, or once it
    is older than a few intervals: a sampler that stopped is no sample)."""

    def __init__(
        self,
        client: DockerClient,
        node: str,
        image: str,
        endpoint: str | None,
        interval_s: float,
        extra: Sequence[Extra] = (),
    ) -> None:
        self.node = node
        self.interval_s = interval_s
        self._latest: tuple[float, Memory] | None = None
        self._lock = threading.Lock()
        loop = f"while :; do echo '{_FRAME}'; cat /proc/meminfo; sleep {interval_s:g}; done"
        self._container = _with_mounts(
            lambda mounted: client.containers.create(
                image, [loop], **_reader("memory", mounted, extra)
            )
        )
        self._lifeline = Lifeline.for_container(str(self._container.name), endpoint)
        try:
            self._container.start()
        except BaseException:
            self.close()
            raise
        self._reader = threading.Thread(target=self._pump, name=f"meminfo-{node}", daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        block: list[str] = []
        with contextlib.suppress(Exception):
            for line in _lines(self._container.logs(stream=True, follow=True)):
                if line.strip() != _FRAME:
                    block.append(line)
                    continue
                self._keep(block)
                block = []
            self._keep(block)

    def _keep(self, block: list[str]) -> None:
        if not block:
            return
        with contextlib.suppress(FactUnreadable):
            memory = parse_meminfo("\n".join(block))
            with self._lock:
                self._latest = (time.monotonic(), memory)

    def sample(self) -> Memory | None:
        with self._lock:
            latest = self._latest
        if latest is None or time.monotonic() - latest[0] > 4 * self.interval_s + 1:
            return None
        return latest[1]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._container.remove(force=True)
        self._lifeline.dismiss()


def _lines(chunks: Iterator[bytes]) -> Iterator[str]:
    pending = b""
    for chunk in chunks:
        pending += chunk
        *whole, pending = pending.split(b"\n")
        for line in whole:
            yield line.decode("utf-8", errors="replace")
        if len(pending) > _OUTPUT_LIMIT:
            pending = b""
    if pending:
        yield pending.decode("utf-8", errors="replace")


__all__ = ["HOST_MOUNTS", "ContainerSampler", "DumpSource", "read_docker_node"]
