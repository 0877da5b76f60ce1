"""Dropping the page cache before a cold start (``--drop-caches``).

On a DGX Spark the page cache and the GPU share one pool of memory: files read earlier (the
last model's weights) still hold memory the next engine's budget counts on, which is why
Spark users drop the cache before every cold start. Dropping writes ``1`` (the page cache;
dentries and inodes are kept) to ``/proc/sys/vm/drop_caches`` after a ``sync``, which needs
root (CAP_SYS_ADMIN): a local process does it itself, a container node through a short
privileged container on that node's Docker endpoint (the kernel's vm sysctls are not
namespaced, so it drops the node's cache).

That container is a fixed helper, never the image under test: busybox pinned by its index
digest (:data:`HELPER`, or ``SPARKBUILD_DROP_CACHES_HELPER``, itself pinned by digest or image
id), running one fixed command with no network, a read-only root and nothing mounted. An
image under test runs only after ``--key`` has checked its signature, and never privileged.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from sparkbuild.errors import UsageError

DROP_CACHES = Path("/proc/sys/vm/drop_caches")
#: What the privileged helper container runs on a node.
DROP_COMMAND = ["sh", "-c", "sync && echo 1 > /proc/sys/vm/drop_caches"]
#: The helper: busybox 1.37.0's multi-arch index (linux/arm64 among its platforms).
HELPER = (
    "docker.io/library/busybox:1.37.0"
    "@sha256:bdf57e528e45e4433820e045b29b4597825a1c9e38353532d90a01445013f82e"
)
HELPER_VARIABLE = "SPARKBUILD_DROP_CACHES_HELPER"
_PINNED = re.compile(r"^(?:[^\s@]+@)?sha256:[0-9a-f]{64}\Z")


def helper_image() -> str:
    """The image the privileged helper runs: :data:`HELPER`, or the environment's, which
    must be pinned (``REPOSITORY@sha256:...`` or an image id ``sha256:...``)."""
    chosen = os.environ.get(HELPER_VARIABLE, "").strip() or HELPER
    if not _PINNED.match(chosen):
        raise UsageError(
            f"{HELPER_VARIABLE}={chosen!r} is not pinned: the one privileged container "
            "sparkbuild runs must be named by digest (REPOSITORY@sha256:<64 hex>) or image id",
            f"unset it to use {HELPER}, or pin the image you trust",
        )
    return chosen


def drop_local(path: Path = DROP_CACHES) -> None:
    """Drop this host's page cache; a clear error without the privilege."""
    os.sync()
    try:
        with path.open("w", encoding="ascii") as control:
            control.write("1\n")
    except PermissionError:
        raise UsageError(
            f"--drop-caches: writing {path} needs root (uid {os.getuid()} may not drop the "
            "page cache)",
            "run as root (or with sudo), or leave out --drop-caches",
        ) from None
    except OSError as exc:
        raise UsageError(
            f"--drop-caches: cannot write {path}: {exc.strerror or exc}",
            "leave out --drop-caches on a host whose /proc/sys is read-only",
        ) from None
