"""Dropping the page cache before a cold start (``--drop-caches``).

On a DGX Spark the page cache and the GPU share one pool of memory: files read earlier (the
last model's weights) still hold memory the next engine's budget counts on, which is why
Spark users drop the cache before every cold start. Dropping writes ``1`` (the page cache;
dentries and inodes are kept) to ``/proc/sys/vm/drop_caches`` after a ``sync``, which needs
root (CAP_SYS_ADMIN): a local process does it itself, a container node through a short
privileged container of the image under test on that node's Docker endpoint (the kernel's
vm sysctls are not namespaced, so it drops the node's cache).
"""

from __future__ import annotations

import os
from pathlib import Path

from sparkbuild.errors import UsageError

DROP_CACHES = Path("/proc/sys/vm/drop_caches")
#: What the privileged helper container runs on a node.
DROP_COMMAND = ["sh", "-c", "sync && echo 1 > /proc/sys/vm/drop_caches"]


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
