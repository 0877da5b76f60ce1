"""Real device code for the audit tests, made once per machine (shared test cache).

- Kernels compiled here by CUDA 13.0's nvcc from PyPI (`tests/support/cuda_toolchain.py`'s
  wheels, installed into a tree with `pip --target`): fatbins for sm_120 + sm_121a
  (native), sm_90a + sm_100a (Hopper and B200 only) and compute_90 PTX only, and loose
  cubins for sm_121a and sm_90a.
- Each fatbin packed into a linux/arm64 shared library the way nvcc's host side does it (the
  fatbin in `.nv_fatbin`, its wrapper in `.nvFatBinSegment`), by Debian's aarch64 cross
  gcc; the Hopper one also as an executable.
- Wheels of our own around the libraries, installed for aarch64 by the host's pip
  (`--target --platform`, so RECORD and METADATA are pip's own), next to two published
  aarch64 wheels: bitsandbytes (its CUDA 11.8 to 13.2 builds, device code from sm_75 to
  sm_121) and flashinfer-python (no device code: it compiles at first use).
- One image (`audit_image`): the arm64 Debian base with the SGLang release package (its
  real METADATA: it requires `sglang-kernel` and `flashinfer_python`), those wheels in its
  site-packages, and loose files under /opt. `sglang-kernel` here is our Hopper-only
  wheel under the name SGLang pins (the published one is 600 MB): what an sgl-kernel built
  without sm_121 code looks like to the engine.
"""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from tests.support.cache import shared_test_cache
from tests.support.cuda_toolchain import cuda_wheels
from tests.support.docker_env import (
    BOOKWORM_PYTHON_SITE,
    LocalRegistry,
    docker_client,
    push_arm64_base,
    remove_images,
    require_command,
    run,
    start_registry,
)
from tests.support.publish_env import write_wheel
from tests.support.sglang_releases import extract_wheel_package

SGLANG = "0.5.12"
LAYOUT = "1"
KERNEL = """\
__global__ void add(float *a, const float *b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) a[i] += b[i];
}
"""
# nvcc's host side, by hand: the fatbin in .nv_fatbin, the wrapper the runtime registers.
STUB = """\
__asm__(".section .nv_fatbin, \\"a\\"\\n.align 8\\nsparkbuild_fatbin:\\n"
        ".incbin \\"" FATBIN "\\"\\n.text\\n");
extern const unsigned long long sparkbuild_fatbin[];
struct wrapper { int magic; int version; const void *data; void *unused; };
__attribute__((section(".nvFatBinSegment"), used))
const struct wrapper sparkbuild_wrapper = {0x466243b1, 1, sparkbuild_fatbin, 0};
const void *sparkbuild_kernels(void) { return &sparkbuild_wrapper; }
"""
FATBINS = {
    "native": ("arch=compute_120,code=sm_120", "arch=compute_121a,code=sm_121a"),
    "hopper": ("arch=compute_90a,code=sm_90a", "arch=compute_100a,code=sm_100a"),
    "ptx": ("arch=compute_90,code=compute_90",),
}
CUBINS = ("sm_121a", "sm_90a")
AARCH64 = "py3-none-manylinux2014_aarch64"
_PLATFORMS = ("manylinux2014_aarch64", "manylinux_2_24_aarch64")
PUBLISHED = ("bitsandbytes==0.50.2", "flashinfer-python==0.6.11.post1")
# Our wheels: distribution -> (version, import package, the library its extension is).
WHEELS = {
    "spark-native-kernels": ("1.0", "spark_native_kernels", "native"),
    "ptx-kernels": ("1.0", "ptx_kernels", "ptx"),
    "sglang-kernel": ("0.4.2.post2", "sgl_kernel", "hopper"),
}


def cuda_tree() -> Path:
    """CUDA 13.0's nvcc and cuobjdump for this host, from PyPI, as a CUDA home."""
    tree = shared_test_cache() / "downloads" / "cuda-13.0-amd64-tree"
    home = tree / "nvidia" / "cu13"
    if (tree / ".complete").exists():
        return home
    with FileLock(str(tree) + ".lock"):
        if not (tree / ".complete").exists():
            shutil.rmtree(tree, ignore_errors=True)
            wheels = [str(w) for w in cuda_wheels("amd64").glob("nvidia_*.whl")]
            pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index"]
            run([*pip, "--target", str(tree), *wheels])
            if not (home / "lib64").exists():
                (home / "lib64").symlink_to("lib")
            (tree / ".complete").touch()
    return home


def cuobjdump() -> Path:
    return cuda_tree() / "bin" / "cuobjdump"


def kernels() -> Path:
    """The compiled kernels and the aarch64 binaries that carry them (cached)."""
    folder = shared_test_cache() / f"device-code-v{LAYOUT}"
    if (folder / ".complete").exists():
        return folder
    with FileLock(str(folder) + ".lock"):
        if not (folder / ".complete").exists():
            shutil.rmtree(folder, ignore_errors=True)
            with tempfile.TemporaryDirectory(dir=folder.parent, prefix=".device-code-") as tmp:
                _compile(Path(tmp))
                os.replace(tmp, folder)
                (folder / ".complete").touch()
    return folder


def _compile(work: Path) -> None:
    home = cuda_tree()
    nvcc = [str(home / "bin" / "nvcc")]
    env = {**os.environ, "PATH": f"{home / 'bin'}:{os.environ['PATH']}", "CUDA_HOME": str(home)}
    (work / "kernel.cu").write_text(KERNEL)
    (work / "stub.c").write_text(STUB)
    for name, codes in FATBINS.items():
        gencodes = [f"-gencode={code}" for code in codes]
        _run([*nvcc, "-fatbin", *gencodes, "-o", f"{name}.fatbin", "kernel.cu"], work, env)
        _cross(work, name, ["-shared", "-fPIC", f"-Wl,-soname,lib{name}.so.1"], f"lib{name}.so")
    _cross(work, "hopper", ["-static", "-Wl,-e,sparkbuild_kernels"], "hopper-tool")
    for arch in CUBINS:
        _run(
            [*nvcc, "-cubin", f"-arch={arch}", "-o", f"kernel.{arch}.cubin", "kernel.cu"], work, env
        )
    for leftover in ("kernel.cu", "stub.c"):
        (work / leftover).unlink()


def _cross(work: Path, fatbin: str, flags: list[str], output: str) -> None:
    native = platform.machine() in ("aarch64", "arm64")
    gcc = require_command("gcc" if native else "aarch64-linux-gnu-gcc")
    define = f'-DFATBIN="{fatbin}.fatbin"'
    _run([gcc, "-O1", "-nostdlib", *flags, define, "-o", output, "stub.c"], work, None)


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None) -> None:
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed:\n{result.stdout}{result.stderr}")


# --- wheels -------------------------------------------------------------------------------


def published_wheels() -> Path:
    """The published aarch64 wheels (downloaded once)."""
    folder = shared_test_cache() / "downloads" / "audit-published-v1"
    if (folder / ".complete").exists():
        return folder
    with FileLock(str(folder) + ".lock"):
        if not (folder / ".complete").exists():
            folder.mkdir(parents=True, exist_ok=True)
            run(
                [
                    *(sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"),
                    *("--only-binary=:all:", "--platform", "manylinux_2_24_aarch64"),
                    *("--python-version", "3.11", "-d", str(folder), *PUBLISHED),
                ]
            )
            (folder / ".complete").touch()
    return folder


def site_packages(work: Path) -> Path:
    """Our wheels and the published ones installed for aarch64 by pip (a site directory)."""
    built = kernels()
    wheels = work / "wheels"
    wheels.mkdir()
    for name, (version, package, library) in WHEELS.items():
        data = (built / f"lib{library}.so").read_bytes()
        write_wheel(wheels, name, version, {f"{package}/_C.abi3.so": data}, AARCH64)
    site = work / "site"
    run(
        [
            *(sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index"),
            *("--only-binary=:all:", "--python-version", "3.11", "--target", str(site)),
            *(a for p in _PLATFORMS for a in ("--platform", p)),
            *map(str, [*wheels.glob("*.whl"), *published_wheels().glob("*.whl")]),
        ]
    )
    shutil.copytree(extract_wheel_package(SGLANG, shared_test_cache()), site, dirs_exist_ok=True)
    return site


def loose_files(work: Path) -> Path:
    """/opt/kernels: the executable, a fatbin and cubins, and a library no package owns."""
    built = kernels()
    folder = work / "opt-kernels"
    folder.mkdir()
    for name in ("hopper-tool", "native.fatbin", "ptx.fatbin", "libnative.so"):
        shutil.copyfile(built / name, folder / name)
    for arch in CUBINS:
        shutil.copyfile(built / f"kernel.{arch}.cubin", folder / f"kernel.{arch}.cubin")
    (folder / "hopper-tool").chmod(0o755)
    return folder


@dataclass
class AuditImage:
    registry: LocalRegistry
    reference: str
    image_id: str
    work: Path


@contextlib.contextmanager
def audit_image(work: Path) -> Iterator[AuditImage]:
    """The one image every audit test reads, in a loopback registry (an overlay's base)."""
    client = docker_client()
    extras = {BOOKWORM_PYTHON_SITE: site_packages(work), "/opt/kernels": loose_files(work)}
    with start_registry(work / "registry") as registry:
        reference = push_arm64_base(
            registry, "sparkbuild-tests/audit", tag=f"v{SGLANG}", extras=extras, work_dir=work
        )
        image_id = str(client.images.get(reference).id)
        try:
            yield AuditImage(registry, reference, image_id, work)
        finally:
            remove_images(client, [reference, image_id])


def cuobjdump_listing(path: Path) -> tuple[set[str], set[str]] | None:
    """cuobjdump's own listing of a file: (SASS archs, PTX archs), by its file names; None
    when cuobjdump refuses the file."""
    result = subprocess.run(
        [str(cuobjdump()), "--list-elf", "--list-ptx", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if "Invalid ELF" in result.stdout + result.stderr:
        return None
    sass: set[str] = set()
    ptx: set[str] = set()
    for line in result.stdout.splitlines():
        kind, _, name = line.partition(":")
        arch = name.strip().rsplit(".", 2)[-2] if name.count(".") >= 2 else ""
        if kind.startswith("ELF file"):
            sass.add(arch)
        elif kind.startswith("PTX file"):
            ptx.add(arch)
    return sass, ptx
