"""CUDA 13 nvcc and cuobjdump from PyPI, for source-mode tests without a GPU.

NVIDIA publishes the CUDA compiler as wheels (`nvidia-cuda-nvcc` and the parts it requires:
`nvidia-nvvm`, `nvidia-cuda-crt`, `nvidia-cuda-runtime`) and `nvidia-cuda-cuobjdump`, for
x86_64 and aarch64. They install into `site-packages/nvidia/cu13/{bin,include,lib,nvvm}`,
which is laid out like a CUDA home, except that 13.0's nvcc.profile links from `lib64`
(a `lib64 -> lib` link fixes that; 13.5's profile uses `lib`). Containers here cannot reach
PyPI over TLS, so the wheels are downloaded on the host (once, into the shared test cache)
and installed into a base image from its build context, with scikit-build-core for the
wheel build.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from filelock import FileLock

from tests.support.cache import shared_test_cache

# CUDA 13.0 (what Spark images ship); cuobjdump's first wheel is 13.2 and reads 13.0 cubins.
CUDA_WHEELS = (
    "nvidia-cuda-nvcc==13.0.88",
    "nvidia-nvvm==13.0.88",
    "nvidia-cuda-crt==13.0.88",
    "nvidia-cuda-runtime==13.0.88",
    "nvidia-cuda-cuobjdump==13.2.51",
)
BUILD_WHEELS = ("scikit-build-core==0.11.6", "packaging==25.0", "pathspec==0.12.1")
_PLATFORMS = {
    "amd64": ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64"),
    "arm64": ("manylinux2014_aarch64", "manylinux_2_17_aarch64", "manylinux_2_28_aarch64"),
}
# Where the wheels land in a Debian bookworm image (`pip install --break-system-packages`).
CUDA_HOME = "/usr/local/lib/python3.11/dist-packages/nvidia/cu13"
BASE_SETUP = f"""\
COPY wheels /tmp/wheels
RUN python3 -m pip install --no-index --no-deps --break-system-packages /tmp/wheels/*.whl \\
    && rm -rf /tmp/wheels \\
    && ln -s lib {CUDA_HOME}/lib64
ENV CUDA_HOME={CUDA_HOME} \\
    PATH={CUDA_HOME}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
"""


def cuda_wheels(arch: str) -> Path:
    """A directory of the CUDA 13 compiler wheels (and build backend) for ``arch``."""
    folder = shared_test_cache() / "downloads" / f"cuda-13.0-{arch}"
    done = folder / ".complete"
    if done.exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):
        if done.exists():
            return folder
        with tempfile.TemporaryDirectory(dir=folder.parent, prefix=".cuda-") as tmp:
            _pip_download(arch, Path(tmp))
            folder.mkdir(exist_ok=True)
            for wheel in Path(tmp).glob("*.whl"):
                os.replace(wheel, folder / wheel.name)
        done.touch()
    return folder


def _pip_download(arch: str, dest: Path) -> None:
    platforms = [arg for tag in _PLATFORMS[arch] for arg in ("--platform", tag)]
    common = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", str(dest)]
    for packages, extra in ((CUDA_WHEELS, platforms), (BUILD_WHEELS, [])):
        cmd = [*common, "--only-binary=:all:", *extra, *packages]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
        if result.returncode != 0:
            raise AssertionError(f"pip download failed:\n{result.stdout}{result.stderr}")
