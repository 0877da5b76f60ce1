"""Engines die with sparkbuild, also when sparkbuild is SIGKILLed.

A target's ``stop()`` runs on every normal exit, exception, Ctrl-C, SIGTERM and SIGHUP; a
SIGKILL (or the OOM killer) runs nothing. Three guards cover that case:

* **Parent-death signal** (Linux ``prctl(PR_SET_PDEATHSIG)``): an engine process gets SIGTERM
  from the kernel the moment the thread that started it dies.
* **Lifeline watchdog**: a small process in its own session, holding the read end of a pipe
  whose write end only sparkbuild holds. When sparkbuild dies, the kernel closes that end; the
  watchdog sees end-of-file and stops what it guards (the engine's whole process group, or
  the container). A normal ``stop()`` first writes a byte that dismisses it.
* **Owner labels** on containers (pid, process start time, host and boot id): a container
  whose owner is gone (or whose pid now belongs to another process) is removed by the next
  sparkbuild run that starts a container on the same host (:func:`remove_orphans`).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from docker import DockerClient

PR_SET_PDEATHSIG = 1
LABEL_PID = "org.sparkbuild.owner.pid"
LABEL_START = "org.sparkbuild.owner.start"
LABEL_HOST = "org.sparkbuild.owner.host"
_DISMISS = b"x"
# `-c`, not `-m`: the package imports this module first, and runpy would run it twice.
_WATCHDOG = "import sys; from sparkbuild.engines.lifeline import watch; sys.exit(watch())"


def process_start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22):
    with the pid, it names one process even after the pid is reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[19]) if len(fields) > 19 and fields[19].isdigit() else None


def host_key() -> str:
    """This host and this boot: a pid means something only within both."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
    except OSError:
        boot = "unknown-boot"
    return f"{socket.gethostname()}/{boot}"


def owner_labels() -> dict[str, str]:
    """Container labels naming this sparkbuild process as the owner."""
    return {
        LABEL_PID: str(os.getpid()),
        LABEL_START: str(process_start_ticks(os.getpid()) or 0),
        LABEL_HOST: host_key(),
    }


def owner_alive(labels: Mapping[str, str]) -> bool | None:
    """Whether the owning process still runs; None when it is not ours to judge (another
    host, or a container without owner labels)."""
    host = labels.get(LABEL_HOST, "")
    pid_text, start_text = labels.get(LABEL_PID, ""), labels.get(LABEL_START, "")
    if not host or not pid_text.isdigit():
        return None
    hostname = host.split("/", 1)[0]
    if host != host_key():
        # Same host name, other boot id: the host rebooted and the owner is gone.
        return None if hostname != socket.gethostname() else False
    started = process_start_ticks(int(pid_text))
    return started is not None and str(started) == start_text


def remove_orphans(client: DockerClient) -> list[str]:
    """Remove containers started by a sparkbuild process that no longer runs; their names."""
    import docker.errors

    removed: list[str] = []
    try:  # docker-py inspects each listed container: one removed meanwhile is passed over
        found = client.containers.list(all=True, filters={"label": LABEL_PID}, ignore_removed=True)
    except docker.errors.APIError:
        return removed
    for container in found:  # each on its own: one that fails leaves the others to remove
        labels = container.labels or {}
        if owner_alive(labels) is False:
            with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                container.remove(force=True)
                removed.append(str(container.name))
    return removed


def _libc_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    prctl: Callable[..., int] = libc.prctl
    return prctl


def parent_death_signal(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child receive ``sig`` when its parent dies (Linux);
    None where the platform has no such thing."""
    prctl = _libc_prctl()
    if prctl is None:
        return None
    parent = os.getpid()

    def arm() -> None:  # runs in the child, between fork and exec
        prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os.kill(os.getpid(), int(sig))

    return arm


class Lifeline:
    """A watchdog that stops an engine if this process dies without stopping it.

    ``Lifeline.for_process_group(pgid)`` or ``Lifeline.for_container(name)``; call
    ``dismiss()`` after stopping the engine normally.
    """

    def __init__(self, guard: list[str]) -> None:
        read_end, self._write_end = os.pipe()  # both non-inheritable: no engine holds them
        try:
            self._proc: subprocess.Popen[bytes] | None = subprocess.Popen(
                [sys.executable, "-c", _WATCHDOG, "--fd", str(read_end), *guard],
                pass_fds=(read_end,),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C or a kill of our group does not reach it
            )
        finally:
            os.close(read_end)

    @classmethod
    def for_process_group(cls, pgid: int) -> Lifeline:
        return cls(["--pgid", str(pgid)])

    @classmethod
    def for_container(cls, name: str, endpoint: str | None = None) -> Lifeline:
        """Removes container ``name`` from this host's daemon, or from ``endpoint``'s (a
        cluster node's) when given."""
        return cls(["--container", name, *(["--endpoint", endpoint] if endpoint else [])])

    def dismiss(self) -> None:
        """The engine was stopped normally: the watchdog exits without doing anything."""
        if self._write_end < 0:
            return
        with contextlib.suppress(OSError):
            os.write(self._write_end, _DISMISS)
        os.close(self._write_end)
        self._write_end = -1
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=5)
            self._proc = None


def group_running(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs. Its exited children whose parent we
    reaped wait as zombies for init to reap them (1.3 s of each 1.7 s engine stop here),
    and hold nothing; without /proc, any member counts."""
    stats = [_read_or_none(path) for path in Path("/proc").glob("[0-9]*/stat")]
    if not any(stats):
        return True
    for stat in filter(None, stats):
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses
        fields = stat.rpartition(")")[2].split()
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            return True
    return False


def _read_or_none(path: Path) -> str | None:
    """A /proc file's text, or None for a process that exited while it was listed."""
    try:
        return path.read_text()
    except OSError:
        return None


def _stop_group(pgid: int, grace_s: float) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            os.killpg(pgid, 0)  # raises ProcessLookupError once the group is gone
            if not group_running(pgid):
                return
            time.sleep(0.1)
        os.killpg(pgid, signal.SIGKILL)


def _remove_container(name: str, settle_s: float = 5.0, endpoint: str | None = None) -> None:
    """Remove ``name``; keep looking for ``settle_s``, since a create request that was under
    way when the owner died still completes in the daemon."""
    import docker.errors

    from sparkbuild import dockerhost
    from sparkbuild.errors import SparkbuildError

    deadline = time.monotonic() + settle_s
    with contextlib.suppress(docker.errors.DockerException, SparkbuildError):
        client = dockerhost.client(endpoint=endpoint)
        while True:
            with contextlib.suppress(docker.errors.NotFound):
                client.containers.get(name).remove(force=True)
            if time.monotonic() >= deadline:
                return
            time.sleep(0.5)


def watch(argv: list[str] | None = None) -> int:
    """The watchdog's main: wait for a dismissal or the owner's death, then clean up."""
    parser = argparse.ArgumentParser(prog="sparkbuild.engines.lifeline")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--pgid", type=int)
    parser.add_argument("--container")
    parser.add_argument("--endpoint")
    parser.add_argument("--grace", type=float, default=10.0)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        message = os.read(args.fd, 1)  # blocks until a dismissal or the owner's death
    except OSError:
        message = b""
    if message == _DISMISS:
        return 0
    if args.pgid:
        _stop_group(args.pgid, args.grace)
    if args.container:
        _remove_container(args.container, endpoint=args.endpoint)
    return 0


if __name__ == "__main__":
    sys.exit(watch())
