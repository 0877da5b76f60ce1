"""Stopping a run: SIGTERM and SIGHUP unwind like Ctrl-C (KeyboardInterrupt), so whatever a
command holds (a half-made mirror, a temporary file, an engine and its container) is cleaned
up by the same ``finally`` blocks as on Ctrl-C, when it is stopped and not only when it fails."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType


@contextlib.contextmanager
def signals_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise KeyboardInterrupt (main thread only: no
    other thread may set handlers, so an embedding caller's thread keeps its own)."""

    def interrupt(signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
