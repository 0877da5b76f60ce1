"""A real sshd on 127.0.0.1 for ``ssh://`` Docker endpoints: Debian's ``openssh-server``
(``scripts/setup-host.sh`` installs it) on a free port, with a throwaway host key and user
key, reaching this machine's own Docker daemon as ``ssh://root@127.0.0.1:PORT``.

Nothing of the user's is touched: the daemon reads its own config, the client side is an
``ssh`` on a PATH of its own that adds ``-F`` with a config naming the key and the host key
(the docker SDK runs ``ssh`` by name, as a user's own ``~/.ssh/config`` would be read).
The daemon is stopped by its pid when the block ends, whatever happened.

Run as a script (``python tests/support/sshd.py start DIR``) it starts one in the background
and prints the shell lines that export ``SSH_ENDPOINT`` and put its ``ssh`` first on
``PATH``; ``python tests/support/sshd.py stop DIR`` stops it.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SSHD = "/usr/sbin/sshd"

__all__ = ["LoopbackSshd", "loopback_sshd", "sshd_available"]


@dataclass(frozen=True)
class LoopbackSshd:
    endpoint: str  # ssh://root@127.0.0.1:PORT
    bin_dir: Path  # holds the ``ssh`` that uses the throwaway keys
    pid: int

    def env(self) -> dict[str, str]:
        """The environment for a process that reaches the endpoint (its ``ssh`` first)."""
        return {"PATH": f"{self.bin_dir}{os.pathsep}{os.environ['PATH']}"}


def sshd_available() -> str | None:
    """Why no loopback sshd can run here, or None when one can."""
    if not Path(SSHD).is_file():
        return f"no {SSHD}: `apt-get install openssh-server` (scripts/setup-host.sh does)"
    if shutil.which("ssh-keygen") is None or shutil.which("ssh") is None:
        return "no ssh or ssh-keygen on PATH (openssh-client)"
    return None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "sparkbuild-test",
                    "-f", str(path)], check=True)  # fmt: skip
    return path.with_suffix(".pub").read_text().strip()


def _write_configs(root: Path, port: int) -> tuple[Path, Path]:
    host_public = _keygen(root / "host_key")
    user_public = _keygen(root / "user_key")
    (root / "authorized_keys").write_text(user_public + "\n")
    sshd_config = root / "sshd_config"
    sshd_config.write_text(
        "\n".join([
            f"ListenAddress 127.0.0.1:{port}",
            f"HostKey {root / 'host_key'}",
            f"PidFile {root / 'sshd.pid'}",
            f"AuthorizedKeysFile {root / 'authorized_keys'}",
            "PermitRootLogin prohibit-password",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",  # the keys live in a temp dir, not under ~/.ssh
            "LogLevel ERROR",
            "",
        ])
    )  # fmt: skip
    (root / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_public}\n")
    client_config = root / "ssh_config"
    client_config.write_text(
        "\n".join([
            "Host 127.0.0.1",
            f"  Port {port}",
            f"  IdentityFile {root / 'user_key'}",
            "  IdentitiesOnly yes",
            f"  UserKnownHostsFile {root / 'known_hosts'}",
            "  StrictHostKeyChecking yes",
            "  BatchMode yes",  # never a password prompt: a failure, at once
            "  LogLevel ERROR",
            "",
        ])
    )  # fmt: skip
    bin_dir = root / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "ssh"
    real = shutil.which("ssh") or "/usr/bin/ssh"
    wrapper.write_text(f'#!/bin/sh\nexec {real} -F {client_config} "$@"\n')
    wrapper.chmod(0o755)
    return sshd_config, bin_dir


def _start(root: Path) -> LoopbackSshd:
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation dir
    port = _free_port()
    sshd_config, bin_dir = _write_configs(root, port)
    log = root / "sshd.log"
    subprocess.run([SSHD, "-t", "-f", str(sshd_config)], check=True)
    subprocess.run([SSHD, "-f", str(sshd_config), "-E", str(log)], check=True)  # forks, pidfile
    user = getpass.getuser()
    endpoint = f"ssh://{user}@127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    pid_file = root / "sshd.pid"
    while not pid_file.is_file() or not pid_file.read_text().strip():
        if time.monotonic() > deadline:
            raise RuntimeError(f"sshd did not start: {log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.1)
    daemon = LoopbackSshd(endpoint, bin_dir, int(pid_file.read_text()))
    _wait_for_login(daemon, user, port, deadline)
    return daemon


def _wait_for_login(daemon: LoopbackSshd, user: str, port: int, deadline: float) -> None:
    while True:
        done = subprocess.run(
            ["ssh", "-p", str(port), f"{user}@127.0.0.1", "true"],
            env={**os.environ, **daemon.env()}, capture_output=True, text=True, check=False,
        )  # fmt: skip
        if done.returncode == 0:
            return
        if time.monotonic() > deadline:
            _stop(daemon.pid)
            raise RuntimeError(f"no key login to the loopback sshd: {done.stderr.strip()}")
        time.sleep(0.2)


def _stop(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def loopback_sshd() -> Iterator[LoopbackSshd]:
    """An sshd on 127.0.0.1 for the length of the block (its connections' children, such as
    ``docker system dial-stdio``, end with their sessions)."""
    root = Path(tempfile.mkdtemp(prefix="sb-sshd-", dir="/tmp"))
    try:
        daemon = _start(root)
        try:
            yield daemon
        finally:
            _stop(daemon.pid)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str]) -> int:
    """``start DIR``: an sshd in the background, its state in DIR; prints the exports.
    ``stop DIR``: stops it and removes DIR."""
    if len(argv) != 2 or argv[0] not in ("start", "stop"):
        print("usage: python tests/support/sshd.py start|stop DIR", file=sys.stderr)
        return 2
    root = Path(argv[1]).absolute()
    if argv[0] == "stop":
        pid_file = root / "sshd.pid"
        if pid_file.is_file():
            _stop(int(pid_file.read_text()))
        shutil.rmtree(root, ignore_errors=True)
        return 0
    missing = sshd_available()
    if missing:
        print(f"error: {missing}", file=sys.stderr)
        return 1
    root.mkdir(parents=True, exist_ok=False)
    try:
        daemon = _start(root)
    except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
        print(f"error: the loopback sshd did not start: {exc}", file=sys.stderr)
        shutil.rmtree(root, ignore_errors=True)
        return 1
    print(f"export SSH_ENDPOINT={shlex.quote(daemon.endpoint)}")
    print(f'export PATH={shlex.quote(str(daemon.bin_dir))}:"$PATH"')
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
