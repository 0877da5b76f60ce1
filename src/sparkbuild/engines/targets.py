"""Where an engine runs: a container from an image, a local process, or an external URL.

One lifecycle for all three, shared by the smoke and bench stages::

    with ProcessTarget(argv, env=env, port=port) as target:   # start() ... stop()
        readiness = wait_ready(target, adapter, timeout_s=600)
        ... talk to target.base_url ...

A target that owns its engine (container, process) always stops it on exit, also on errors
and Ctrl-C: processes by their process group (no orphans), containers by removal. If
sparkbuild itself is killed (SIGKILL, OOM), :mod:`sparkbuild.engines.lifeline` stops the engine:
a parent-death signal and a watchdog for processes, a watchdog and owner labels for containers.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

import requests

from sparkbuild import interrupts, net
from sparkbuild.engines.lifeline import (
    Lifeline,
    group_running,
    owner_labels,
    parent_death_signal,
    remove_orphans,
)
from sparkbuild.engines.logs import LineSplitter, LogBuffer, engine_lines
from sparkbuild.errors import EngineContainerError, LocalImageError, UsageError
from sparkbuild.redact import redact

if TYPE_CHECKING:
    from docker import DockerClient
    from docker.models.containers import Container
    from docker.types import DeviceRequest

    from sparkbuild.adapters import EngineAdapter

TargetKind = Literal["image", "command", "url", "cluster"]
LOOPBACK = "127.0.0.1"
STAGE_LABEL = "org.sparkbuild.stage"  # which stage started a container: smoke or bench


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that is free right now on ``host`` (the engine binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class Target(ABC):
    """An engine endpoint with a lifecycle: ``start()``, ``exit_code()``, ``stop()``."""

    kind: TargetKind
    #: The engine's output, or None when sparkbuild cannot see it (``--url``).
    logs: LogBuffer | None = None
    started_at: float | None = None

    @property
    @abstractmethod
    def base_url(self) -> str:
        """``http://host:port`` of the engine's HTTP server (valid after ``start()``)."""

    @property
    @abstractmethod
    def description(self) -> str:
        """What ran, for reports: the image, the command or the URL."""

    @property
    def owns_engine(self) -> bool:
        """Whether sparkbuild started the engine (and so can check its boot)."""
        return self.kind != "url"

    @abstractmethod
    def start(self) -> None:
        """Launch the engine (no-op for an external URL). Returns without waiting for it."""

    @abstractmethod
    def exit_code(self) -> int | None:
        """The engine's exit status once it has exited, otherwise None."""

    @abstractmethod
    def stop(self) -> None:
        """Stop the engine and release everything it holds; safe to call twice."""

    def describe_exit(self, code: int) -> str:
        """How the engine ended, for reports (a cluster names the rank and node)."""
        return f"engine exited with status {code}"

    def __enter__(self) -> Target:
        try:
            self.start()
        except BaseException:
            self.stop()  # a half-started engine (created container, spawned process) goes too
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def engine_base_url(value: str, option: str = "--url") -> str:
    """An engine's http(s) base URL, without its trailing slash: requests add their paths
    (``/v1/models``) after it, so a query or fragment would swallow them."""
    parts = urlsplit(value)
    example = f"e.g. {option} http://127.0.0.1:8000"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"{option} {redact(value)!r} is not an http(s) URL", example)
    if parts.query or parts.fragment or "?" in value or "#" in value:
        raise UsageError(
            f"{option} {redact(value)!r} has a query or fragment: the engine's paths "
            "(/v1/models, /metrics, ...) are added after the URL, so they would land inside it",
            f"give the engine's base URL alone, {example}",
        )
    return value.rstrip("/")


class UrlTarget(Target):
    """An engine somebody else runs; sparkbuild only talks to it."""

    kind: TargetKind = "url"

    def __init__(self, url: str) -> None:
        self._url = engine_base_url(url)

    @property
    def base_url(self) -> str:
        return self._url

    @property
    def description(self) -> str:
        return redact(self._url)  # what reports and the lock keep: no userinfo, no token

    def start(self) -> None:
        self.started_at = time.monotonic()

    def exit_code(self) -> int | None:
        return None

    def stop(self) -> None:
        return None


class ProcessTarget(Target):
    """A local engine process in its own process group, stopped with everything it spawned.

    ``stop()`` sends SIGTERM to the group, waits ``grace_s`` and then sends SIGKILL, and
    returns only when no process of the group is left.
    """

    kind: TargetKind = "command"

    def __init__(
        self,
        argv: Sequence[str],
        *,
        port: int,
        env: Mapping[str, str] | None = None,
        host: str = LOOPBACK,
        log_path: Path | None = None,
        grace_s: float = 10.0,
    ) -> None:
        self.argv = list(argv)
        self.port = port
        self.host = host
        self.env = dict(env or {})
        self.grace_s = grace_s
        self.logs = LogBuffer(log_path)
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._lifeline: Lifeline | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def description(self) -> str:
        return shlex.join(self.argv)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self) -> None:
        try:
            self._proc = subprocess.Popen(
                self.argv,
                env={**os.environ, **self.env},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: killpg reaches every child
                # SIGTERM from the kernel if we die; the thread that starts it must outlive
                # it. The hook only calls the already-resolved prctl: no lock, no import.
                preexec_fn=parent_death_signal(),  # noqa: PLW1509
            )
        except OSError as exc:
            raise UsageError(
                f"cannot run engine command {self.argv[0]!r}: {exc.strerror or exc}",
                "check the --command value (the engine launcher, e.g. "
                "'python -m vllm.entrypoints.openai.api_server')",
            ) from exc
        self.started_at = time.monotonic()
        # The parent-death signal reaches only the engine's first process; the watchdog
        # stops the whole group (engine workers it spawned) if we are killed.
        self._lifeline = Lifeline.for_process_group(self._proc.pid)
        self._reader = threading.Thread(target=self._pump, name="engine-log", daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        assert self.logs is not None
        for raw in self._proc.stdout:
            self.logs.append(raw.decode("utf-8", errors="replace"))

    def exit_code(self) -> int | None:
        return self._proc.poll() if self._proc else None

    def _group_alive(self, pgid: int) -> bool:
        assert self._proc is not None
        self._proc.poll()  # reap our direct child so it does not linger as a zombie
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return group_running(pgid)

    def _signal_group(self, pgid: int, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)

    def _wait_group(self, pgid: int, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while self._group_alive(pgid):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
        return True

    def stop(self) -> None:
        if self._proc is None:
            return
        pgid = self._proc.pid  # start_new_session: the group id is the leader's pid
        if self._group_alive(pgid):
            self._signal_group(pgid, signal.SIGTERM)
            if not self._wait_group(pgid, self.grace_s):
                self._signal_group(pgid, signal.SIGKILL)
                self._wait_group(pgid, 10.0)
        self._proc.wait()
        if self._lifeline is not None:
            self._lifeline.dismiss()
        if self._reader is not None:
            self._reader.join(timeout=5)
        if self.logs is not None:
            self.logs.close()


@dataclass(frozen=True)
class Mount:
    source: Path
    target: str
    read_only: bool = True


def device_requests(gpus: str | None) -> list[DeviceRequest]:
    """``docker run --gpus`` semantics: ``all``, a count, ``device=0,1``; None/none = no GPU."""
    import docker.types

    if gpus is None or gpus.strip().lower() in ("", "none"):
        return []
    value = gpus.strip()
    if value == "all":
        return [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]
    if value.isdigit():
        return [docker.types.DeviceRequest(count=int(value), capabilities=[["gpu"]])]
    if value.startswith("device="):
        ids = [part for part in value.removeprefix("device=").strip("\"'").split(",") if part]
        return [docker.types.DeviceRequest(device_ids=ids, capabilities=[["gpu"]])]
    raise UsageError(f"--gpus {gpus!r} is not 'all', a count, 'device=ID,...' or 'none'")


def local_image_id(image: str) -> str:
    """The id (``sha256:...``) of ``image`` in the local Docker engine."""
    import docker.errors

    from sparkbuild import dockerhost  # the docker SDK loads only when a container is used

    try:
        return str(dockerhost.client().images.get(image).id)
    except docker.errors.ImageNotFound as exc:
        raise LocalImageError(
            f"image {image} is not in the local Docker engine",
            "build it with `sparkbuild build BUILD` or `docker pull` it first",
        ) from exc


def image_labels(image: str) -> dict[str, str]:
    """The labels of ``image`` in the local Docker engine (empty when it has none)."""
    import docker.errors

    from sparkbuild import dockerhost

    try:
        labels = dockerhost.client().images.get(image).labels
    except docker.errors.ImageNotFound as exc:
        raise LocalImageError(
            f"image {image} is not in the local Docker engine",
            "build it with `sparkbuild build BUILD` or `docker pull` it first",
        ) from exc
    return {str(k): str(v) for k, v in (labels or {}).items()}


class ContainerTarget(Target):
    """The engine in a container of ``image``; logs streamed and kept; always removed.

    The engine's port is published on 127.0.0.1 only. ``ipc="host"`` (what both engines
    expect for NCCL and their shared-memory queues); ``shm_size`` applies when ipc is private.
    The caller's ``stage`` names the container ``sparkbuild-<stage>-<random>`` and labels it
    ``org.sparkbuild.stage=<stage>``; the orphan sweep goes by the owner labels, not by either.
    """

    kind: TargetKind = "image"

    def __init__(  # noqa: PLR0913 - docker's container settings, each by name
        self,
        image: str,
        *,
        entrypoint: Sequence[str],
        args: Sequence[str],
        container_port: int,
        env: Mapping[str, str] | None = None,
        mounts: Sequence[Mount] = (),
        gpus: str | None = "all",
        ipc: str = "host",
        shm_size: str | None = None,
        log_path: Path | None = None,
        grace_s: float = 10.0,
        stage: str,
        endpoint: str | None = None,
        logs: LogBuffer | None = None,
    ) -> None:
        self.image = image
        self.entrypoint = list(entrypoint)
        self.args = list(args)
        self.container_port = container_port
        self.env = dict(env or {})
        self.mounts = list(mounts)
        self.gpus = gpus
        self.ipc = ipc
        self.shm_size = shm_size
        self.grace_s = grace_s
        self.stage = stage
        self.name = f"sparkbuild-{stage}-{uuid.uuid4().hex[:10]}"
        self.endpoint = endpoint  # another daemon (a cluster node); None: this host's
        self._own_logs = logs is None  # a cluster's ranks write into the cluster's log
        self.logs = LogBuffer(log_path) if logs is None else logs
        self.image_id: str | None = None
        self._client: DockerClient | None = None
        self._container: Container | None = None
        self._host_port: int | None = None
        self._reader: threading.Thread | None = None
        self._exit: int | None = None
        self._last_poll = 0.0
        self._lifeline: Lifeline | None = None

    @property
    def base_url(self) -> str:
        if self._host_port is None:
            raise EngineContainerError(f"container {self.name} has no published port yet")
        return f"http://{LOOPBACK}:{self._host_port}"

    @property
    def description(self) -> str:
        return self.image

    def _run_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, object] = {
            "entrypoint": self.entrypoint,
            "command": self.args,
            "detach": True,
            "name": self.name,
            "environment": self.env,
            "ports": {f"{self.container_port}/tcp": (LOOPBACK, None)},
            "ipc_mode": self.ipc,
            "volumes": {
                str(m.source): {"bind": m.target, "mode": "ro" if m.read_only else "rw"}
                for m in self.mounts
            },
            "device_requests": device_requests(self.gpus),
            # Who owns it: a later run removes it if this process dies without doing so.
            "labels": {STAGE_LABEL: self.stage, **owner_labels()},
        }
        if self.shm_size and self.ipc != "host":
            kwargs["shm_size"] = self.shm_size
        return kwargs

    def start(self) -> None:
        import docker.errors

        from sparkbuild import dockerhost

        self._client = dockerhost.client(endpoint=self.endpoint)
        remove_orphans(self._client)  # engines left by a sparkbuild that was killed
        if self.endpoint is None:
            self.image_id = local_image_id(self.image)
        # Armed before the container exists: a kill during `run` is covered too.
        self._lifeline = Lifeline.for_container(self.name, self.endpoint)
        try:
            self._container = self._client.containers.run(self.image, **self._run_kwargs())
        except docker.errors.APIError as exc:
            self._remove()
            raise EngineContainerError(
                f"cannot start a container of {self.image}: {exc.explanation or exc}",
                "GPU flags can be changed with --gpus (e.g. --gpus none on a host without GPUs)",
            ) from exc
        self.started_at = time.monotonic()
        self._container.reload()
        # What the container runs, not what the tag names now (a tag can move meanwhile).
        self.image_id = str(self._container.attrs.get("Image") or "") or None
        bindings = self._container.attrs["NetworkSettings"]["Ports"] or {}
        published = bindings.get(f"{self.container_port}/tcp") or []
        if published:
            self._host_port = int(published[0]["HostPort"])
        self._reader = threading.Thread(target=self._pump, name="container-log", daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        assert self.logs is not None
        splitter = LineSplitter(self.logs)
        try:
            assert self._container is not None  # the reader starts once the container runs
            for chunk in self._container.logs(stream=True, follow=True):
                splitter.feed(chunk)
        except Exception:
            pass
        splitter.flush()

    def exit_code(self) -> int | None:
        import docker.errors

        if self._container is None or self._exit is not None:
            return self._exit
        now = time.monotonic()
        if now - self._last_poll < 0.5:
            return None
        self._last_poll = now
        try:
            self._container.reload()
        except docker.errors.NotFound:
            self._exit = -1
            return self._exit
        state = self._container.attrs.get("State", {})
        if state.get("Status") in ("exited", "dead"):
            self._exit = int(state.get("ExitCode", -1))
        return self._exit

    def exit_code_now(self) -> int | None:
        """:meth:`exit_code`, asked of the daemon now rather than at most twice a second."""
        self._last_poll = 0.0
        return self.exit_code()

    def kill(self) -> None:
        """Stop the engine now (SIGKILL), leaving the container for ``stop()`` to remove."""
        import docker.errors

        if self._container is not None:
            with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                self._container.kill()

    def _remove(self) -> None:
        import docker.errors

        if self._client is None:
            return
        with contextlib.suppress(docker.errors.NotFound):
            self._client.containers.get(self.name).remove(force=True)

    def stop(self) -> None:
        import docker.errors

        if self._container is not None:
            with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                self._container.stop(timeout=int(self.grace_s))
            if self._reader is not None:
                self._reader.join(timeout=5)
        self._remove()
        self._container = None
        if self._lifeline is not None:
            self._lifeline.dismiss()
            self._lifeline = None
        if self.logs is not None and self._own_logs:
            self.logs.close()


@dataclass(frozen=True)
class Readiness:
    """How a boot ended: ``ready``, ``exited`` (with its exit code) or ``timeout``."""

    outcome: Literal["ready", "exited", "timeout"]
    seconds: float
    exit_code: int | None = None
    ready_line_seen: bool = False

    @property
    def ready(self) -> bool:
        return self.outcome == "ready"


#: A health endpoint answers a few bytes; anything this large is not one.
_PROBE_BODY_LIMIT = 64 * 1024


def probe(session: net.Session, url: str, timeout: float = 2.0) -> int | None:
    """The HTTP status of a GET, or None when nothing answers (within ``timeout``, all of it)."""
    try:
        return session.get(url, timeout=timeout, max_body=_PROBE_BODY_LIMIT).status_code
    except requests.RequestException:
        return None


def boot_detail(seconds: float, line: str) -> str:
    """The live line of a boot wait: seconds waited and what the engine said last."""
    return f"{seconds:.0f} s" + (f" · {line[:120]}" if line else "")


def wait_ready(
    target: Target,
    adapter: EngineAdapter,
    timeout_s: float,
    *,
    poll_s: float = 0.5,
    line_grace_s: float = 10.0,
    waiting: Callable[[float, str], None] | None = None,
) -> Readiness:
    """Wait until the readiness endpoint answers 200 and the engine printed its ready line.

    Stops early when the engine exits. If the endpoint is up but the ready line does not
    appear within ``line_grace_s`` (an engine version that words it differently), the engine
    counts as ready with ``ready_line_seen=False``. ``waiting`` is told, at each poll, the
    seconds waited so far and the engine's last log line (for a live progress line).
    """
    started = target.started_at if target.started_at is not None else time.monotonic()
    deadline = started + timeout_s
    health_since: float | None = None
    session = adapter.session()
    url = target.base_url + adapter.endpoints.health
    line_seen, scanned = target.logs is None, 0
    while True:
        now = time.monotonic()
        code = target.exit_code()
        if code is not None:
            return Readiness("exited", now - started, exit_code=code)
        if not line_seen and target.logs is not None:
            fresh = target.logs.since(scanned)
            scanned += len(fresh)
            line_seen = any(adapter.ready_line.search(line) for line in fresh)
        if probe(session, url) == 200:
            health_since = health_since or now
            if line_seen or now - health_since >= line_grace_s:
                return Readiness("ready", time.monotonic() - started, ready_line_seen=line_seen)
        else:
            health_since = None
        if time.monotonic() >= deadline:
            return Readiness("timeout", time.monotonic() - started)
        if waiting is not None:
            last = engine_lines(target.logs.tail(20)) if target.logs is not None else []
            waiting(time.monotonic() - started, last[-1].strip() if last else "")
        time.sleep(poll_s)


#: SIGTERM/SIGHUP unwind like Ctrl-C, so the engine is stopped and its container removed.
stop_on_signals = interrupts.signals_interrupt
