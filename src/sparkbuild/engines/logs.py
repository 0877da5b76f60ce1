"""An engine's log as it streams in: kept in memory (bounded) and, optionally, in full on disk."""

from __future__ import annotations

import re
import threading
import time
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import IO

from sparkbuild import fileio
from sparkbuild.redact import redact

# Engines print progress bars and colours; neither belongs in an excerpt.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


# An HTTP server's access-log line (uvicorn, as vLLM and SGLang log each request):
# `INFO:     127.0.0.1:53824 - "POST /v1/completions HTTP/1.1" 200 OK`.
ACCESS_LINE = re.compile(r'"(?:GET|POST|PUT|PATCH|DELETE|HEAD|OPTIONS) \S+ HTTP/[\d.]+" \d{3}\b')


def engine_lines(lines: Iterable[str]) -> list[str]:
    """``lines`` without the access-log lines: what the engine itself said."""
    return [line for line in lines if not ACCESS_LINE.search(line)]


class LogBuffer:
    """Thread-safe log lines with a monotonically increasing index.

    Readers ask for lines ``since`` an index, so a check can look only at what the engine
    printed during one phase (boot, or the smoke requests). The memory copy keeps the last
    ``max_lines``; ``path`` keeps everything.
    """

    def __init__(self, path: Path | None = None, max_lines: int = 20000) -> None:
        self._lines: deque[str] = deque(maxlen=max_lines)
        self._times: deque[float] = deque(maxlen=max_lines)  # when each line arrived
        self._total = 0
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._file: IO[str] | None = None
        self.path = path
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = fileio.open_output(path)  # a planted link is replaced, not followed

    def append(self, line: str) -> None:
        clean = redact(_ANSI.sub("", line.rstrip("\r\n")))
        with self._changed:
            self._lines.append(clean)
            self._times.append(time.monotonic())
            self._total += 1
            if self._file is not None:
                self._file.write(clean + "\n")
                self._file.flush()
            self._changed.notify_all()

    def extend(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.append(line)

    @property
    def count(self) -> int:
        """How many lines were ever appended (the index of the next line)."""
        with self._lock:
            return self._total

    def since(self, index: int = 0) -> list[str]:
        """Lines from ``index`` on (as far as the bounded memory copy still holds them)."""
        with self._lock:
            first_kept = self._total - len(self._lines)
            start = max(index - first_kept, 0)
            return list(self._lines)[start:]

    def stamped(self, index: int = 0) -> list[tuple[float, str]]:
        """:meth:`since` with each line's arrival (``time.monotonic()``): boot phases."""
        with self._lock:
            first_kept = self._total - len(self._lines)
            start = max(index - first_kept, 0)
            return list(zip(self._times, self._lines, strict=True))[start:]

    def tail(self, n: int) -> list[str]:
        with self._lock:
            return list(self._lines)[-n:] if n > 0 else []

    def wait_for(self, pattern: re.Pattern[str], since: int, timeout: float) -> bool:
        """Whether a line matching ``pattern`` appears (or already appeared) after ``since``."""
        deadline = time.monotonic() + timeout
        seen = since
        while True:
            lines = self.since(seen)
            if any(pattern.search(line) for line in lines):
                return True
            seen += len(lines)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            with self._changed:
                if self._total == seen:
                    self._changed.wait(remaining)

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


class LineSplitter:
    """Bytes arriving in arbitrary chunks (docker log streams) into whole lines."""

    def __init__(self, sink: LogBuffer) -> None:
        self._sink = sink
        self._pending = b""

    def feed(self, chunk: bytes) -> None:
        self._pending += chunk
        *lines, self._pending = self._pending.split(b"\n")
        for line in lines:
            self._sink.append(line.decode("utf-8", errors="replace"))

    def flush(self) -> None:
        if self._pending:
            self._sink.append(self._pending.decode("utf-8", errors="replace"))
            self._pending = b""
