"""A persistent compile cache per host and image: the first boot of an image compiles
(torch inductor, Triton, FlashInfer's JIT, DeepGEMM, the driver's PTX JIT), later boots of
the same image on the same host load what it compiled (docs/smoke.md, "Compile cache").

One directory per image id (a ``--command`` run: per command line) under the cache
directory, mounted into the engine's container (or given to its process) with each
compiler's own variable pointing into it. Boots are measured against it: the files and
bytes each compiler's part gained during the boot, and the engine's own compile lines.
The cache is an input to a run, so it gets the trust checks preflight's caches get
(``cachetrust``): the directory is the user's own, 0700, under directories no one else can
write, and nothing in it is a symlink out of it, another user's, or writable by others; a
cache that fails is discarded with a note, never used. A cluster's nodes each keep their
own, a Docker volume named after the image on each node.

Two facts per engine, in its adapter: ``compile_line``, the engine's compile lines (a group
``seconds`` gives the seconds compiling, summed over a boot; it or a group ``end`` ends the
compile), and ``compile_cache_vars``, the engine's own cache variables (the ``engine`` part).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sparkbuild import cachetrust, console
from sparkbuild.engines.targets import Mount
from sparkbuild.errors import CompileCapError
from sparkbuild.jsontext import JsonObject

INSIDE = "/sparkbuild-compile-cache"
#: Each compiler's cache variable -> its part of the cache.
PARTS: dict[str, str] = {
    "TORCHINDUCTOR_CACHE_DIR": "inductor",
    "TRITON_CACHE_DIR": "triton",
    "FLASHINFER_WORKSPACE_BASE": "flashinfer",
    "DG_JIT_CACHE_DIR": "deep_gemm",
    "CUDA_CACHE_PATH": "cuda",  # the driver's JIT of PTX-only libraries
}
#: The part of the engine's own compile cache (its adapter's ``compile_cache_vars``); what
#: the engine keeps there outside a directory named for compiling (vLLM's
#: ``torch_compile_cache/``) is counted apart, not as compiled.
ENGINE_PART = "engine"
ENGINE_OTHER = "engine (not compiled)"
#: The driver keeps 256 MiB of PTX JIT output by default: a PTX-only library outgrows it.
EXTRA_ENV = {"CUDA_CACHE_MAXSIZE": str(4 * 1024**3)}
MAX_FILES = 2_000_000  # a walk of the cache stops here
_KEY = re.compile(r"^[a-z]+-[0-9a-f]{16,64}\Z")


@dataclass(frozen=True)
class Usage:
    """What a cache holds: files and bytes, per part."""

    parts: Mapping[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def files(self) -> int:
        """Compiled files: the engine's other files (an asset, a startup plan) left out."""
        return sum(files for name, (files, _) in self.parts.items() if name != ENGINE_OTHER)

    @property
    def bytes(self) -> int:
        return sum(size for name, (_, size) in self.parts.items() if name != ENGINE_OTHER)


@dataclass(frozen=True)
class CompileCache:
    """One image's (or command's) cache on this host."""

    root: Path
    key: str
    fresh: bool  # --fresh-compile-cache: emptied before this run

    def env(self, base: str, engine_vars: Iterable[str] = ()) -> dict[str, str]:
        return compiler_env(base, engine_vars)

    def mount(self) -> Mount:
        return Mount(self.root, INSIDE, read_only=False)

    def usage(self) -> Usage:
        return usage(self.root)


def compiler_env(base: str, engine_vars: Iterable[str] = ()) -> dict[str, str]:
    """Each compiler's variable (and the engine's own, ``engine_vars``), pointing into a
    cache that is at ``base``."""
    engine = {var: f"{base}/{ENGINE_PART}" for var in engine_vars}
    return {var: f"{base}/{part}" for var, part in PARTS.items()} | engine | EXTRA_ENV


def cache_key(image_id: str | None, command: str | None) -> str:
    """``image-<hex>`` for an image id, ``command-<hex>`` for a command line."""
    if image_id:
        return "image-" + image_id.removeprefix("sha256:")[:64].lower()
    digest = hashlib.sha256((command or "").encode()).hexdigest()
    return f"command-{digest[:32]}"


def volume_name(image_id: str) -> str:
    """A cluster node's cache: a Docker volume on that node, named after the image."""
    return "sparkbuild-compile-" + image_id.removeprefix("sha256:")[:32]


def open_cache(cache_dir: Path, key: str, *, fresh: bool) -> CompileCache:
    """The cache for ``key`` under ``cache_dir``, checked (or emptied: ``fresh``, or one
    that fails its checks) and made 0700 where it is not there."""
    if not _KEY.match(key):
        raise ValueError(f"not a compile cache key: {key!r}")
    root = cachetrust.private_dir(cache_dir / "compile-cache", "the compile caches")
    folder = root / key
    why = contents_problem(folder) if os.path.lexists(folder) else None
    if why is not None:
        console.warn(f"compile cache {folder} is not used: {why}; starting it empty")
    if fresh or why is not None:
        _empty(folder)
    cachetrust.private_dir(folder, "the compile cache")
    for part in [*PARTS.values(), ENGINE_PART]:
        (folder / part).mkdir(mode=0o700, exist_ok=True)
    return CompileCache(folder, key, fresh)


def _empty(folder: Path) -> None:
    if folder.is_symlink() or folder.is_file():
        folder.unlink()
    elif folder.exists():
        shutil.rmtree(folder)


def _walk(root: Path) -> Iterable[tuple[str, os.stat_result]]:
    pending, seen = [""], 0
    while pending:
        folder = pending.pop()
        with os.scandir(os.path.join(root, folder) if folder else root) as entries:
            for entry in entries:
                seen += 1
                if seen > MAX_FILES:
                    return
                relative = f"{folder}/{entry.name}" if folder else entry.name
                info = entry.stat(follow_symlinks=False)
                yield relative, info
                if stat.S_ISDIR(info.st_mode):
                    pending.append(relative)


def contents_problem(folder: Path) -> str | None:
    """Why a cache may not be used: it, or anything in it, is not ours or root's (an
    engine in a container writes as root), is writable by others, is a special file, or
    is a symlink leading out of it."""
    why = cachetrust.path_problem(folder)
    if why is not None or not folder.is_dir() or folder.is_symlink():
        return why or "is not a directory"
    for relative, info in _walk(folder):
        path = folder / relative
        if stat.S_ISLNK(info.st_mode):
            if not cachetrust.inside(path, folder):
                return f"{relative} is a symlink out of the cache"
            continue
        why = cachetrust.path_problem(path, own=False)
        if why is None and not (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)):
            why = "is not a regular file or directory"
        if why is not None:
            return f"{relative} {why}"
    return None


def _part(relative: str) -> str:
    top, _, rest = relative.partition("/")
    if top == ENGINE_PART and "compile" not in rest.split("/", 1)[0]:
        return ENGINE_OTHER
    return top


def usage(root: Path) -> Usage:
    counted: dict[str, list[int]] = {}
    for relative, info in _walk(root):
        if stat.S_ISREG(info.st_mode):
            part = counted.setdefault(_part(relative), [0, 0])
            part[0] += 1
            part[1] += info.st_size
    return Usage({name: (files, size) for name, (files, size) in sorted(counted.items())})


@dataclass(frozen=True)
class CompilePhase:
    """One boot's compiling: the cache's growth, and the engine's own compile lines."""

    key: str
    first_boot: bool  # the cache held nothing before this boot
    fresh: bool
    before: Usage
    after: Usage
    seconds: float | None  # the engine's own figure (summed), where its log says one
    lines: tuple[str, ...] = ()

    @property
    def files_added(self) -> int:
        return self.after.files - self.before.files

    @property
    def bytes_added(self) -> int:
        return self.after.bytes - self.before.bytes

    def grew(self) -> list[str]:
        """The parts that gained files: what compiled."""
        return [
            f"{name} (+{files - self.before.parts.get(name, (0, 0))[0]} files)"
            for name, (files, _size) in self.after.parts.items()
            if files > self.before.parts.get(name, (0, 0))[0] and name != ENGINE_OTHER
        ]

    def to_json(self) -> JsonObject:
        return {
            "cache": self.key,
            "first_boot": self.first_boot,
            "fresh": self.fresh,
            "seconds": None if self.seconds is None else round(self.seconds, 2),
            "files_added": self.files_added,
            "bytes_added": self.bytes_added,
            "files": self.after.files,
            "bytes": self.after.bytes,
            "compiled": self.grew(),
            "lines": list(self.lines),
        }


def compile_lines(lines: Iterable[str], pattern: re.Pattern[str]) -> tuple[float | None, list[str]]:
    """The engine's compile lines and the seconds they give (the pattern's ``seconds``)."""
    seconds: float | None = None
    kept: list[str] = []
    for line in lines:
        match = pattern.search(line)
        if match is None:
            continue
        kept.append(line.strip()[:300])
        found = match.groupdict().get("seconds")
        if found:
            seconds = (seconds or 0.0) + float(found)
    return seconds, kept[-20:]


def phase(
    cache: CompileCache, before: Usage, lines: Iterable[str], pattern: re.Pattern[str]
) -> CompilePhase:
    seconds, kept = compile_lines(lines, pattern)
    return CompilePhase(
        cache.key, before.files == 0, cache.fresh, before, cache.usage(), seconds, tuple(kept)
    )


class CompileWatch:
    """A boot's compiling, watched while the engine boots: with a profile's cap
    (``expect.compile.max_seconds``), a boot that keeps compiling past it is stopped
    (CompileCapError), naming the parts of the cache that grew and the last compile line.

    Compiling starts at the engine's first compile line (or the cache's first growth, for
    an engine that prints none) and ends at a line that gives its total or its end (vLLM's
    "took X s in total", its CPU warm-up's "done"); without one, it lasts as long as the
    cache keeps growing."""

    def __init__(
        self,
        cache: CompileCache,
        before: Usage,
        max_seconds: float | None,
        lines: Callable[[], list[str]],
        pattern: re.Pattern[str],
        poll_s: float = 2.0,
    ) -> None:
        self.cache, self.before, self.max_seconds = cache, before, max_seconds
        self.lines, self.pattern, self.poll_s = lines, pattern, poll_s
        self._last: Usage = before
        self._checked: float | None = None
        self._began: float | None = None  # the first compile line, seen at this poll
        self._ended = False  # a line gave the total: the compile is over
        self._first: float | None = None  # when the cache was first seen growing
        self._latest: float | None = None  # and last

    def __call__(self, seconds: float) -> None:
        """Told the seconds since the boot began, at each poll of the wait."""
        if self.max_seconds is None or (
            self._checked is not None and seconds - self._checked < self.poll_s
        ):
            return
        self._checked = seconds
        self._read_lines(seconds)
        now = self.cache.usage()
        if now.files != self._last.files or now.bytes != self._last.bytes:
            self._first = self._first if self._first is not None else seconds
            self._latest, self._last = seconds, now
        spent = self._spent(seconds)
        if spent > self.max_seconds:
            raise CompileCapError.over(self.max_seconds, spent, self.what())

    def _read_lines(self, seconds: float) -> None:
        for line in self.lines():
            match = self.pattern.search(line)
            if match is None:
                continue
            if self._began is None:
                self._began = seconds
            if match.groupdict().get("seconds") or match.groupdict().get("end"):
                self._ended = True

    def _spent(self, seconds: float) -> float:
        if self._ended:
            return 0.0
        if self._began is not None:
            return seconds - self._began
        if self._first is not None and self._latest is not None:
            return self._latest - self._first
        return 0.0

    def measured(self) -> CompilePhase:
        """The boot's compiling, once it ended."""
        return phase(self.cache, self.before, self.lines(), self.pattern)

    def what(self) -> str:
        compiling = phase(self.cache, self.before, [], self.pattern).grew()
        _seconds, kept = compile_lines(self.lines(), self.pattern)
        last = f"; the engine's last compile line: {kept[-1]}" if kept else ""
        return (", ".join(compiling) or "nothing in the cache yet") + last
