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


_STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Within the block, Ctrl-C, SIGTERM and SIGHUP wait and take effect as it ends: for the
    few steps that must happen together (two directories swapped, a scratch removed), so a
    stop leaves the old state or the new one, never half of each. Python runs signal
    handlers in the main thread only, whichever thread the signal reached, so holding them
    there holds them all."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[signal.Signals] = []

    def hold(signum: int, _frame: FrameType | None) -> None:
        caught.append(signal.Signals(signum))

    previous = {sig: signal.signal(sig, hold) for sig in _STOPS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if caught:
            handler = previous[caught[0]]
            if callable(handler):
                handler(caught[0], None)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(caught[0])
