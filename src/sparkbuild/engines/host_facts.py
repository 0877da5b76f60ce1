"""The box a run happens on: one node's kernel, OS, DGX OS, driver, firmware, container
runtime and memory, read without privileges.

What changed a GB10's behaviour in the field is as often the box as the image: the driver
(580.95.05, 580.173.02, 595.84), the kernel (``6.17.0-1029-nvidia`` beside ``-1026-`` in one
pair), the DGX OS release, BIOS and ConnectX-7 firmware, swap. Every verdict records them per
node (docs/smoke.md, "Host facts").

Each fact is read from where the system publishes it to any user (the formats, and real
samples of them, are in ``tests/data/hosts/``):

============================  ===============================================================
kernel                        ``/proc/sys/kernel/osrelease``
os                            ``/etc/os-release`` (``PRETTY_NAME``)
dgx_os                        ``/etc/dgx-release``: ``DGX_NAME``, the last ``DGX_OTA_VERSION``
                              (an OTA appends one) else ``DGX_SWBUILD_VERSION``; never the
                              serial number beside them
driver                        ``/proc/driver/nvidia/version`` (``NVRM version: ... 580.126.09``)
gpu, vbios, persistence, mig  ``nvidia-smi --query-gpu=...`` (CSV without header)
cuda_driver                   ``nvidia-smi``'s banner (``CUDA Version: 13.0``)
bios                          ``/sys/class/dmi/id/bios_version`` and ``bios_date``
connectx_fw                   ``/sys/class/infiniband/*/fw_ver``
docker, nvidia_runtime        the Docker daemon's ``/info`` (version, default runtime)
memory                        ``/proc/meminfo``: MemTotal, MemAvailable, SwapTotal, SwapFree
============================  ===============================================================

A fact that is absent is ``none`` with why (no GPU, no DGX OS); one that cannot be read is
unknown, with why. Reading never fails a run.
"""

from __future__ import annotations

import platform
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from sparkbuild import fileio
from sparkbuild.jsontext import JsonObject

GIB = 1 << 30
#: Every fact a node has, in the order reports show them.
FACT_NAMES = (
    "kernel",
    "os",
    "dgx_os",
    "arch",
    "driver",
    "cuda_driver",
    "gpu",
    "vbios",
    "persistence",
    "mig",
    "bios",
    "connectx_fw",
    "docker",
    "nvidia_runtime",
    "nccl",
)
#: What each fact is called where people read it.
FACT_LABELS = {
    "kernel": "kernel",
    "os": "OS",
    "dgx_os": "DGX OS",
    "arch": "architecture",
    "driver": "NVIDIA driver",
    "cuda_driver": "CUDA driver",
    "gpu": "GPU",
    "vbios": "VBIOS",
    "persistence": "persistence mode",
    "mig": "MIG mode",
    "bios": "BIOS",
    "connectx_fw": "ConnectX firmware",
    "docker": "Docker",
    "nvidia_runtime": "NVIDIA runtime",
    "nccl": "NCCL (in the image)",
}
NONE = "none"
#: A fact file is a line or a few; the limit keeps a hostile node's answer small.
_FILE_LIMIT = 64 * 1024
_SMI_QUERY = "name,driver_version,vbios_version,persistence_mode,mig.mode.current"
SMI_QUERY_ARGV = ("nvidia-smi", f"--query-gpu={_SMI_QUERY}", "--format=csv,noheader")
SMI_BANNER_ARGV = ("nvidia-smi",)
_DGX_KEYS = ("DGX_NAME", "DGX_SWBUILD_VERSION", "DGX_OTA_VERSION")


class FactUnreadable(Exception):  # noqa: N818 - a reason, not an error any user sees
    """Why a fact could not be read (its message is what the record says)."""


@dataclass(frozen=True)
class Memory:
    """``/proc/meminfo``'s figures that matter on unified memory, in KiB as it gives them."""

    total_kib: int
    available_kib: int
    swap_total_kib: int = 0
    swap_free_kib: int = 0

    @property
    def available_gib(self) -> float:
        return self.available_kib / (1 << 20)

    @property
    def total_gib(self) -> float:
        return self.total_kib / (1 << 20)

    @property
    def swap_used_gib(self) -> float:
        return max(self.swap_total_kib - self.swap_free_kib, 0) / (1 << 20)

    def to_json(self) -> JsonObject:
        return {
            "total_gib": round(self.total_gib, 2),
            "available_gib": round(self.available_gib, 2),
            "swap_total_gib": round(self.swap_total_kib / (1 << 20), 2),
            "swap_used_gib": round(self.swap_used_gib, 2),
        }


@dataclass(frozen=True)
class NodeFacts:
    """One node's facts: ``facts`` what was read (``none`` where the thing is absent),
    ``why`` for each fact that is absent or unknown, ``memory`` at the start of the run."""

    node: str
    facts: Mapping[str, str]
    why: Mapping[str, str] = field(default_factory=dict)
    memory: Memory | None = None
    read_at: str = ""  # UTC, ISO 8601

    def value(self, name: str) -> str | None:
        """The fact, or None when it is unknown."""
        return self.facts.get(name)

    def unknown(self) -> dict[str, str]:
        return {name: why for name, why in self.why.items() if name not in self.facts}

    def with_fact(self, name: str, value: str | None, why: str = "") -> NodeFacts:
        facts, reasons = dict(self.facts), dict(self.why)
        facts.pop(name, None)
        reasons.pop(name, None)
        if value is not None:
            facts[name] = value
        if why:
            reasons[name] = why
        return NodeFacts(self.node, facts, reasons, self.memory, self.read_at)

    def to_json(self) -> JsonObject:
        return {
            "node": self.node,
            "read_at": self.read_at,
            "facts": {n: self.facts[n] for n in FACT_NAMES if n in self.facts},
            "unknown": {n: w for n, w in self.unknown().items()},
            "none": {n: self.why[n] for n in FACT_NAMES if self.facts.get(n) == NONE},
            "memory": self.memory.to_json() if self.memory else None,
        }


# --- the formats ---------------------------------------------------------------------------


def key_values(text: str) -> list[tuple[str, str]]:
    """``KEY="value"`` lines (os-release, dgx-release), in order, quotes removed; nothing in
    them is run or expanded."""
    pairs = []
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and re.fullmatch(r"[A-Z][A-Z0-9_]*", key):
            pairs.append((key, value.strip().strip("\"'")))
    return pairs


def parse_os_release(text: str) -> str:
    values = dict(key_values(text))
    name = values.get("PRETTY_NAME") or " ".join(
        v for v in (values.get("NAME"), values.get("VERSION_ID")) if v
    )
    if not name:
        raise FactUnreadable("/etc/os-release names no PRETTY_NAME or NAME")
    return name


def parse_dgx_release(text: str) -> str:
    """``DGX Spark 7.4.0``: the last OTA an update appended, else the build it shipped with."""
    pairs = [(k, v) for k, v in key_values(text) if k in _DGX_KEYS and v]
    latest = {key: value for key, value in pairs}  # the last of each key wins
    version = latest.get("DGX_OTA_VERSION") or latest.get("DGX_SWBUILD_VERSION")
    if version is None:
        raise FactUnreadable("/etc/dgx-release has no DGX_OTA_VERSION or DGX_SWBUILD_VERSION")
    return f"{latest.get('DGX_NAME', 'DGX OS')} {version}"


_NVRM = re.compile(r"^NVRM version:.*?\s(\d+\.\d+(?:\.\d+)?)(?:\s|$)", re.MULTILINE)


def parse_nvidia_version(text: str) -> str:
    """The kernel module's version from ``/proc/driver/nvidia/version``'s first line."""
    match = _NVRM.search(text)
    if match is None:
        raise FactUnreadable("/proc/driver/nvidia/version has no 'NVRM version' line")
    return match[1]


def _smi_value(value: str) -> str:
    value = value.strip()
    return NONE if value in ("[N/A]", "N/A", "[Not Supported]") else value


def parse_smi_query(text: str) -> dict[str, str]:
    """``nvidia-smi --query-gpu=name,driver_version,vbios_version,persistence_mode,
    mig.mode.current --format=csv,noheader``: one row per GPU (a Spark has one); a second
    GPU that differs is named after the first."""
    rows = [line for line in text.splitlines() if line.strip()]
    if not rows:
        raise FactUnreadable("nvidia-smi listed no GPU")
    parsed = []
    for row in rows:
        cells = [_smi_value(c) for c in row.split(",")]
        if len(cells) != 5:
            raise FactUnreadable(f"nvidia-smi answered {row[:80]!r}, not 5 columns")
        names = ("gpu", "smi_driver", "vbios", "persistence", "mig")
        parsed.append(dict(zip(names, cells, strict=True)))
    first = parsed[0]
    if len(parsed) > 1:
        first = {**first, "gpu": f"{first['gpu']} x{len(parsed)}"}
    return first


_CUDA_BANNER = re.compile(r"CUDA Version:\s*(\d+\.\d+)")


def parse_smi_banner(text: str) -> str:
    match = _CUDA_BANNER.search(text)
    if match is None:
        raise FactUnreadable("nvidia-smi's banner names no CUDA Version")
    return match[1]


def parse_meminfo(text: str) -> Memory:
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        words = rest.split()
        if words and words[0].isdigit() and len(words[0]) < 16:
            values[key.strip()] = int(words[0])
    if "MemTotal" not in values or "MemAvailable" not in values:
        raise FactUnreadable("/proc/meminfo has no MemTotal or MemAvailable")
    return Memory(
        values["MemTotal"],
        values["MemAvailable"],
        values.get("SwapTotal", 0),
        values.get("SwapFree", 0),
    )


def join_firmware(versions: Mapping[str, str]) -> str:
    """ConnectX firmware over a node's RDMA devices: one version when all agree (a Spark's
    four functions of one ConnectX-7), else each device's."""
    distinct = sorted(set(versions.values()))
    if len(distinct) == 1:
        return distinct[0]
    return ", ".join(f"{device} {version}" for device, version in sorted(versions.items()))


def docker_facts(info: Mapping[str, object]) -> dict[str, str]:
    """From a Docker daemon's ``/info``: its version, whether NVIDIA's runtime is the
    default (and whether it is there at all), and the host's kernel, OS and architecture as
    the daemon sees them."""
    runtimes = info.get("Runtimes")
    names = sorted(runtimes) if isinstance(runtimes, Mapping) else []
    default = str(info.get("DefaultRuntime") or "runc")
    if default == "nvidia":
        runtime = "default"
    elif "nvidia" in names:
        runtime = f"installed, not the default ({default} is)"
    else:
        runtime = f"{NONE} (runtimes: {', '.join(names) or 'none listed'})"
    found = {
        "docker": str(info.get("ServerVersion") or ""),
        "nvidia_runtime": runtime,
        "kernel": str(info.get("KernelVersion") or ""),
        "os": str(info.get("OperatingSystem") or ""),
        "arch": str(info.get("Architecture") or ""),
    }
    return {name: value for name, value in found.items() if value}


# --- reading one node -------------------------------------------------------------------------


class FactSource(Protocol):
    """Where a node's files and commands are read: this machine, or what a node's reader
    container printed (engines/node_reader)."""

    def read(self, path: str) -> str: ...

    def exists(self, path: str) -> bool: ...

    def listdir(self, path: str) -> list[str]: ...

    def run(self, argv: Sequence[str]) -> str: ...


class LocalSource:
    """This machine's files and commands; ``root`` and ``commands`` replay another's (the
    recorded GB10 formats in tests/data/hosts/: a tree of its files, and each command's
    output in ``commands/<name>.txt``)."""

    def __init__(self, root: Path = Path("/"), commands: Path | None = None) -> None:
        self.root = root
        self.commands = commands

    def read(self, path: str) -> str:
        return fileio.read_text(self.root / path.lstrip("/"), limit=_FILE_LIMIT)

    def exists(self, path: str) -> bool:
        return (self.root / path.lstrip("/")).exists()

    def listdir(self, path: str) -> list[str]:
        return sorted(p.name for p in (self.root / path.lstrip("/")).iterdir())

    def run(self, argv: Sequence[str]) -> str:
        if self.commands is not None:
            recorded = self.commands / (
                "nvidia-smi-query.txt" if len(argv) > 1 else "nvidia-smi.txt"
            )
            if not recorded.exists():
                raise FactUnreadable(f"{argv[0]} is not installed")
            return recorded.read_text(encoding="utf-8")
        if shutil.which(argv[0]) is None:
            raise FactUnreadable(f"{argv[0]} is not installed")
        try:
            done = subprocess.run(
                list(argv), capture_output=True, text=True, timeout=20, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise FactUnreadable(f"{argv[0]} did not answer: {exc}") from None
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip().splitlines()
            raise FactUnreadable(
                f"{argv[0]} exited with status {done.returncode}"
                + (f": {said[-1][:200]}" if said else "")
            )
        return done.stdout


def _reason(exc: BaseException) -> str:
    if isinstance(exc, FactUnreadable):
        return str(exc)
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        return f"{where}{fileio.reason(exc)}"
    return f"{type(exc).__name__}: {exc}"


class _Reading:
    """The facts of one node as they are read, each failure kept as the fact's why."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.facts: dict[str, str] = {}
        self.why: dict[str, str] = {}

    def fact(self, name: str, read: Callable[[], str], absent: str | None = None) -> None:
        try:
            self.facts[name] = read()
        except Exception as exc:
            self.why[name] = _reason(exc)
            if absent is not None and isinstance(exc, FileNotFoundError):
                self.facts[name] = NONE
                self.why[name] = absent

    def none(self, names: Sequence[str], why: str) -> None:
        for name in names:
            self.facts[name], self.why[name] = NONE, why

    def unknown(self, names: Sequence[str], why: str) -> None:
        for name in names:
            self.why.setdefault(name, why)


def read_node(
    source: FactSource,
    node: str,
    docker_info: Mapping[str, object] | None = None,
    docker_error: str = "",
) -> NodeFacts:
    """Every fact of one node that ``source`` reaches (see the module docstring); the
    Docker daemon's ``/info`` when there is one (``docker_error``: why there is none)."""
    reading = _Reading(node)
    reading.fact("kernel", lambda: source.read("/proc/sys/kernel/osrelease").strip())
    reading.fact("os", lambda: parse_os_release(source.read("/etc/os-release")))
    reading.fact(
        "dgx_os",
        lambda: parse_dgx_release(source.read("/etc/dgx-release")),
        absent="not DGX OS (no /etc/dgx-release)",
    )
    _gpu_facts(source, reading)
    reading.fact("bios", lambda: _bios(source), absent="no DMI tables (/sys/class/dmi/id)")
    reading.fact(
        "connectx_fw",
        lambda: _connectx(source),
        absent="no RDMA devices (/sys/class/infiniband)",
    )
    if docker_info is not None:
        for name, value in docker_facts(docker_info).items():
            if name not in reading.facts:  # the daemon's view where the node's own is unread
                reading.facts[name] = value
                reading.why.pop(name, None)
    else:
        reading.unknown(("docker", "nvidia_runtime"), docker_error or "no Docker daemon asked")
    reading.unknown(("nccl",), "read from the engine's container once it runs")
    memory = None
    try:
        memory = parse_meminfo(source.read("/proc/meminfo"))
    except Exception as exc:
        reading.why["memory"] = _reason(exc)
    return NodeFacts(node, reading.facts, reading.why, memory, utc_now())


def _gpu_facts(source: FactSource, reading: _Reading) -> None:
    names = ("driver", "cuda_driver", "gpu", "vbios", "persistence", "mig")
    if not source.exists("/proc/driver/nvidia/version"):
        reading.none(names, "no NVIDIA driver loaded (no /proc/driver/nvidia/version)")
        return
    reading.fact("driver", lambda: parse_nvidia_version(source.read("/proc/driver/nvidia/version")))
    try:
        smi = parse_smi_query(source.run(SMI_QUERY_ARGV))
    except Exception as exc:
        reading.unknown(("gpu", "vbios", "persistence", "mig"), _reason(exc))
    else:
        for name in ("gpu", "vbios", "persistence", "mig"):
            reading.facts[name] = smi[name]
            if smi[name] == NONE:
                reading.why[name] = "nvidia-smi: [N/A] (not supported on this GPU)"
    reading.fact("cuda_driver", lambda: parse_smi_banner(source.run(SMI_BANNER_ARGV)))


def _bios(source: FactSource) -> str:
    version = source.read("/sys/class/dmi/id/bios_version").strip()
    try:
        date = source.read("/sys/class/dmi/id/bios_date").strip()
    except OSError:
        date = ""
    return f"{version} ({date})" if date else version


def _connectx(source: FactSource) -> str:
    versions: dict[str, str] = {}
    for device in source.listdir("/sys/class/infiniband"):
        try:
            versions[device] = source.read(f"/sys/class/infiniband/{device}/fw_ver").strip()
        except OSError:
            continue
    if not versions:
        return NONE
    return join_firmware(versions)


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def this_host(name: str = "this host") -> NodeFacts:
    """This machine's facts, with its Docker daemon's (when one answers)."""
    info, error = local_docker_info()
    facts = read_node(LocalSource(), name, info, error)
    if "arch" not in facts.facts:
        facts = facts.with_fact("arch", platform.machine() or None)
    return facts


def local_docker_info() -> tuple[Mapping[str, object] | None, str]:
    """This host's Docker daemon's ``/info``, or why there is none (never an error)."""
    try:
        import docker.errors

        from sparkbuild import dockerhost

        return dict(dockerhost.client(timeout=10).info()), ""
    except (docker.errors.DockerException, OSError) as exc:
        return None, f"no Docker daemon answers here ({str(exc)[:160]})"
    except Exception as exc:
        return None, f"the Docker daemon did not answer ({type(exc).__name__})"


def memory_now(proc: Path = Path("/proc")) -> Memory | None:
    """This machine's ``/proc/meminfo`` now (None where there is none)."""
    try:
        return parse_meminfo((proc / "meminfo").read_text(encoding="ascii", errors="replace"))
    except (OSError, FactUnreadable):
        return None


__all__ = [
    "FACT_LABELS",
    "FACT_NAMES",
    "NONE",
    "FactSource",
    "FactUnreadable",
    "LocalSource",
    "Memory",
    "NodeFacts",
    "docker_facts",
    "join_firmware",
    "key_values",
    "memory_now",
    "parse_dgx_release",
    "parse_meminfo",
    "parse_nvidia_version",
    "parse_os_release",
    "parse_smi_banner",
    "parse_smi_query",
    "read_node",
    "this_host",
    "utc_now",
]
