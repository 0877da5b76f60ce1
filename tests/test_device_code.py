"""Reading device code out of one file, on real nvcc output (tests/support/device_code.py),
and on that output damaged as a hostile image could: every such file is reported, never
trusted and never crashes the audit. The compile cache's trust checks and its watch, on
real directories."""

from __future__ import annotations

import io
import os
import struct
from pathlib import Path

import pytest

from sparkbuild.adapters.vllm import VllmAdapter
from sparkbuild.engines.compile_cache import (
    CompileWatch,
    compile_lines,
    contents_problem,
    open_cache,
)
from sparkbuild.engines.launch import LaunchSettings, TargetChoice, compile_cache_for
from sparkbuild.errors import CompileCapError, UsageError
from sparkbuild.image.audit import file_verdict
from sparkbuild.image.devicecode import DeviceCode, read_device_code
from tests.support.device_code import cuobjdump_listing, kernels

upstream = pytest.mark.upstream  # nvcc from PyPI, once per machine


def _read(data: bytes) -> DeviceCode | None:
    return read_device_code(io.BytesIO(data), len(data))


@upstream
def test_each_kernel_file_reads_as_cuobjdump_lists_it() -> None:
    built = kernels()
    for path in sorted(p for p in built.iterdir() if not p.name.startswith(".")):
        with path.open("rb") as handle:
            code = read_device_code(handle, path.stat().st_size)
        assert code is not None, path
        assert (code.sass, code.ptx) == cuobjdump_listing(path), path.name
    with (built / "libptx.so").open("rb") as handle:
        ptx = read_device_code(handle, (built / "libptx.so").stat().st_size)
    assert ptx is not None and ptx.ptx_isa == {"9.0"} and ptx.soname == "libptx.so.1"
    verdicts = {}
    for name in ("libnative.so", "libhopper.so", "libptx.so", "kernel.sm_90a.cubin"):
        with (built / name).open("rb") as handle:
            found = read_device_code(handle, (built / name).stat().st_size)
        assert found is not None
        verdicts[name] = file_verdict(found)
    assert verdicts == {
        "libnative.so": "native",
        "libhopper.so": "none",
        "libptx.so": "ptx",
        "kernel.sm_90a.cubin": "none",
    }


@upstream
def test_damaged_files_are_reported_not_trusted() -> None:
    built = kernels()
    fatbin = (built / "native.fatbin").read_bytes()
    # A header that claims more than the file holds: no code, a problem.
    lying = fatbin[:8] + struct.pack("<Q", 1 << 40) + fatbin[16:]
    found = _read(lying)
    assert found is not None and not found.has_code
    assert "malformed fatbin header" in str(found.problem)
    # An entry whose payload runs past its container: the entries before it stay.
    entry_size = struct.unpack_from("<I", fatbin, 16 + 4)[0]
    second = 16 + entry_size + struct.unpack_from("<Q", fatbin, 16 + 8)[0]
    broken = bytearray(fatbin)
    struct.pack_into("<Q", broken, second + 8, 1 << 40)
    cut = _read(bytes(broken))
    assert cut is not None and len(cut.sass) == 1
    assert "malformed fatbin entry" in str(cut.problem)
    # A shared library cut short: pyelftools' own error, reported.
    library = (built / "libhopper.so").read_bytes()
    short = _read(library[: len(library) // 3])
    assert short is not None and short.problem
    # Not an ELF, not a fatbin: nothing.
    assert _read(b"#!/bin/sh\necho hi\n" * 4) is None
    # Magic bytes with garbage after them: no crash, nothing claimed.
    junk = _read(b"\x7fELF" + os.urandom(4096))
    assert junk is not None and not junk.has_code


def test_compile_cache_trust_checks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cache = open_cache(tmp_path, "image-" + "ab" * 32, fresh=False)
    assert oct(cache.root.stat().st_mode & 0o777) == "0o700"
    assert contents_problem(cache.root) is None
    (cache.root / "triton" / "kernel.so").write_bytes(b"x")
    assert open_cache(tmp_path, cache.key, fresh=False).usage().files == 1  # kept
    # A symlink out of the cache, planted: the cache is not used, it starts empty.
    (cache.root / "inductor" / "evil").symlink_to("/etc/passwd")
    assert "symlink out of the cache" in str(contents_problem(cache.root))
    again = open_cache(tmp_path, cache.key, fresh=False)
    assert again.usage().files == 0 and "is not used" in capsys.readouterr().err
    # A file others can write: the same.
    planted = again.root / "engine" / "graph.py"
    planted.write_text("x")
    planted.chmod(0o666)
    assert "writable by group or others" in str(contents_problem(again.root))
    # --fresh-compile-cache empties a good one.
    (again.root / "engine" / "graph.py").unlink()
    (again.root / "cuda" / "jit.bin").write_bytes(b"y" * 10)
    assert open_cache(tmp_path, cache.key, fresh=True).usage().files == 0
    with pytest.raises(ValueError):
        open_cache(tmp_path, "../escape", fresh=False)


def test_compile_watch_stops_a_boot_that_keeps_compiling(tmp_path: Path) -> None:
    cache = open_cache(tmp_path, "command-" + "cd" * 16, fresh=True)
    log: list[str] = ["INFO Loading weights"]
    watch = CompileWatch(
        cache, cache.usage(), 1.0, lambda: log, VllmAdapter.compile_line, poll_s=0.0
    )
    watch(0.0)
    log.append("INFO Compiling a graph for compile range (1, 8)")
    watch(0.5)  # compiling from here
    (cache.root / "inductor" / "a.py").write_text("a")
    (cache.root / "triton" / "c.so").write_text("c")
    watch(1.4)  # for 0.9 s: under the cap
    with pytest.raises(CompileCapError) as over:
        watch(1.6)
    assert "inductor (+1 files), triton (+1 files)" in over.value.message
    assert "Compiling a graph for compile range (1, 8)" in over.value.message
    measured = watch.measured()
    assert (measured.first_boot, measured.files_added) == (True, 2)
    # A compile that printed its total is over: no cap however long the boot goes on.
    done = CompileWatch(cache, cache.usage(), 1.0, lambda: log, VllmAdapter.compile_line, 0.0)
    log.append("INFO torch.compile took 3.20 s in total")
    done(0.0)
    done(60.0)
    # An engine that prints no compile line: the cache's growth is the compile.
    quiet = CompileWatch(cache, cache.usage(), 1.0, list, VllmAdapter.compile_line, 0.0)
    quiet(0.0)
    (cache.root / "flashinfer" / "k1.so").write_text("k")
    quiet(1.0)
    (cache.root / "flashinfer" / "k2.so").write_text("k")
    with pytest.raises(CompileCapError, match=r"flashinfer \(\+2 files\)"):
        quiet(2.5)


def test_vllm_compile_lines_give_the_seconds() -> None:
    lines = [
        "(EngineCore pid=1) INFO 11-27 [monitor.py:62] torch.compile took 12.50 s in total",
        "INFO [backends.py:399] Compiling a graph for compile range (1, 2048) takes 9.10 s",
        "INFO Application startup complete.",
    ]
    seconds, kept = compile_lines(lines, VllmAdapter.compile_line)
    assert seconds == 12.5 and len(kept) == 2
    assert compile_lines(["INFO nothing compiled"], VllmAdapter.compile_line) == (None, [])


def test_fresh_compile_cache_is_refused_where_there_is_no_cache_of_ours(tmp_path: Path) -> None:
    for choice in (TargetChoice(url="http://127.0.0.1:1"), TargetChoice(image="x", cluster="c")):
        with pytest.raises(UsageError, match="--fresh-compile-cache"):
            compile_cache_for(LaunchSettings(choice, fresh_compile_cache=True), tmp_path)
        assert compile_cache_for(LaunchSettings(choice), tmp_path) is None
    command = LaunchSettings(TargetChoice(command="python -m engine"), fresh_compile_cache=True)
    cache = compile_cache_for(command, tmp_path)
    assert cache is not None and cache.fresh and cache.key.startswith("command-")
