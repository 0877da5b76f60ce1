"""What a bench run records about the machine it ran on: enough for ``bench compare`` to say
when two runs came from different hosts, or from the same host under a different load.

The CPU model and the memory are read from ``/proc`` (Linux; elsewhere they are unknown),
the load average with ``os.getloadavg`` when the run starts and when it ends.
"""

from __future__ import annotations

import os
import platform
import socket
import sys
from pathlib import Path

from sparkbuild.bench.results import HostInfo

PROC = Path("/proc")


def load_average() -> list[float] | None:
    """The 1-, 5- and 15-minute load averages, or None where the system has none."""
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except OSError:
        return None


def cpu_model(proc: Path = PROC) -> str | None:
    """The CPU's model name (``/proc/cpuinfo``; an Arm core gives none there: lscpu's
    ``Model name`` comes from tables sparkbuild does not carry), else the platform's word."""
    try:
        text = (proc / "cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model", "cpu model") and value.strip():
            return " ".join(value.split())
    return platform.processor() or None


def memory_gib(proc: Path = PROC) -> float | None:
    """Total memory in GiB (``MemTotal`` of ``/proc/meminfo``)."""
    try:
        text = (proc / "meminfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("MemTotal:"):
            words = line.split()
            if len(words) >= 2 and words[1].isdigit():
                return round(int(words[1]) / (1024 * 1024), 1)
    return None


def host_info(load_start: list[float] | None = None) -> HostInfo:
    """This host, with the load average at the run's start (taken by the caller) and now."""
    return HostInfo(
        hostname=socket.gethostname(),
        platform=platform.platform(),
        machine=platform.machine(),
        cpus=os.cpu_count(),
        python=sys.version.split()[0],
        cpu_model=cpu_model(),
        memory_gib=memory_gib(),
        load_start=load_start,
        load_end=load_average(),
    )


__all__ = ["cpu_model", "host_info", "load_average", "memory_gib"]
