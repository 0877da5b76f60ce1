"""The dependency set of a local preflight venv: the release's own pins, minus CUDA-only
packages, plus a CPU torch and the build's own pins on top.

Read from the engine wheel's ``METADATA`` (``Requires-Dist``), so the set follows the
release exactly. The digest over the final requirement list is the venv's cache key.
"""

from __future__ import annotations

import hashlib
import re
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from sparkbuild.errors import PreflightSetupError
from sparkbuild.jsontext import JsonObject

# torch and torchvision as PyPI builds them (CUDA libraries inside; they run on a CPU). The
# local CPU torch 2.13.0 cannot be used: SGLang imports torchvision at module level
# (srt/utils/common.py in 0.5.12) and no PyPI torchvision loads beside that CPU torch
# ("operator torchvision::nms does not exist"). They live in one shared base venv that every
# preflight venv sees through a .pth file, and are pinned through a constraints file, so no
# dependency can make pip fetch another torch.
TORCH = ("torch==2.14.1", "torchvision==0.29.1")
CPU_TORCH = TORCH[0]

# Needed to import SGLang's server args on the CPU, but not declared by the wheel (they come
# with the CUDA image): triton (kernel decorators at import time), IPython and traitlets.
CPU_EXTRAS = ("triton", "IPython", "traitlets")

# Left out of the local venv, with why no preflight check depends on them. The checks run
# Python (argparse, ServerArgs, config loaders, module imports); no kernel runs. A module that
# imports one of these fails to import in the venv *and* in the unpatched release, so the
# imports/registry checks compare against the unpatched tree and report it as a skip.
CUDA_ONLY: dict[str, str] = {
    "torch": f"replaced by {TORCH[0]} from the shared base venv; same Python API",
    "torchvision": f"replaced by {TORCH[1]} from the shared base venv",
    "torchaudio": "built for the release's torch only; audio inputs only",
    "torchcodec": "built for the release's torch only; video inputs only",
    "kernels": "fetches CUDA kernels from the Hub at run time; transformers runs without it",
    "torchao": "quantisation kernels built against the release's CUDA torch",
    "cuda-python": "CUDA driver bindings; no GPU here",
    "flashinfer-python": "CUDA attention/GEMM kernels; no kernel runs in preflight",
    "flashinfer-cubin": "CUDA kernel binaries",
    "nvidia-cutlass-dsl": "CUDA kernel DSL",
    "nvidia-mathdx": "CUDA math library",
    "nvshmem4py-cu13": "CUDA NVSHMEM bindings",
    "sglang-kernel": "CUDA kernels only (no CPU build on PyPI)",
    "sgl-kernel": "CUDA kernels only (no CPU build on PyPI)",
    "sgl-deep-gemm": "CUDA GEMM kernels",
    "sgl-deep-ep": "CUDA expert-parallel kernels",
    "sgl-flash-mla": "CUDA MLA kernels",
    "flash-attn-4": "CUDA attention kernels",
    "tilelang": "CUDA kernel compiler",
    "tokenspeed-mla": "CUDA MLA kernels",
    "torch-memory-saver": "CUDA memory hooks",
    "quack-kernels": "CUDA kernels (CuTe DSL)",
    "humming-kernels": "CUDA kernels",
    "helion": "GPU kernel DSL, pinned to the release's CUDA torch",
    "apache-tvm-ffi": "runtime of the CUDA kernel packages above",
}


# In a built image, dependencies of the packages above whose binaries also need the CUDA
# driver or a GPU to load; the local venv gets them as stand-ins through kernels.py.
STANDIN_ALSO_INSTALLED = (
    "cuda-bindings",
    "nvidia-cudnn-frontend",
    "nvidia-cutlass-dsl-libs-base",
    "nvidia-cutlass-dsl-libs-cu13",
    "flashinfer-jit-cache",
)


@dataclass(frozen=True)
class DependencySet:
    """What a venv holds. ``requirements`` is the list pip installs (sorted, canonical)."""

    engine: str
    version: str
    requirements: tuple[str, ...]
    left_out: tuple[tuple[str, str], ...]  # (package, reason)

    @property
    def digest(self) -> str:
        text = "\n".join([self.engine, self.version, *TORCH, *self.requirements])
        return "sha256:" + hashlib.sha256(text.encode()).hexdigest()

    def to_json(self) -> JsonObject:
        return {
            "engine": self.engine,
            "version": self.version,
            "digest": self.digest,
            "torch": list(TORCH),
            "requirements": list(self.requirements),
            "left_out": [{"package": p, "reason": r} for p, r in self.left_out],
        }


def wheel_requirements(wheel: Path) -> list[str]:
    """The unconditional ``Requires-Dist`` lines of a wheel (extras left out)."""
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
        if not names:
            raise PreflightSetupError(f"{wheel}: no .dist-info/METADATA in the wheel")
        text = archive.read(names[0]).decode("utf-8", "replace")
    prefix = "Requires-Dist:"
    lines = [line[len(prefix) :].strip() for line in text.splitlines() if line.startswith(prefix)]
    return [line for line in lines if line and "extra ==" not in line and "extra==" not in line]


def requirement_name(line: str) -> str:
    """A requirement line's canonical package name (``Mistral_Common>=1.11``: mistral-common)."""
    return str(canonicalize_name(Requirement(line).name))


def _parse(line: str, where: str) -> Requirement:
    try:
        return Requirement(line)
    except InvalidRequirement as exc:
        raise PreflightSetupError(f"{where}: requirement {line!r} is not valid ({exc})") from exc


def dependency_set(
    engine: str,
    version: str,
    release_requirements: Iterable[str],
    build_pins: Sequence[str] = (),
) -> DependencySet:
    """Release pins (markers evaluated for this host) minus CUDA-only packages, the CPU
    extras, then the build's pins replacing the release's pin of the same package."""
    chosen: dict[str, str] = {}
    left_out: dict[str, str] = {}
    for line in release_requirements:
        req = _parse(line, f"{engine} {version} wheel metadata")
        name = canonicalize_name(req.name)
        if req.marker is not None and not req.marker.evaluate():
            continue
        if name in CUDA_ONLY:
            left_out[name] = CUDA_ONLY[name]
            continue
        req.marker = None
        req.extras = set()  # "[cu13]" extras pull CUDA wheels
        chosen[name] = str(req)
    for extra in CPU_EXTRAS:
        chosen.setdefault(canonicalize_name(extra), extra)
    for line in build_pins:
        req = _parse(line, "build requirements")
        name = canonicalize_name(req.name)
        if name in ("torch", "torchvision"):
            continue  # the shared torch stays; a build's torch pin is for the image
        left_out.pop(name, None)
        chosen[name] = str(req)
    return DependencySet(
        engine=engine,
        version=version,
        requirements=tuple(sorted(chosen.values(), key=str.lower)),
        left_out=tuple(sorted(left_out.items())),
    )


__all__ = [
    "CPU_EXTRAS",
    "CPU_TORCH",
    "CUDA_ONLY",
    "STANDIN_ALSO_INSTALLED",
    "TORCH",
    "DependencySet",
    "dependency_set",
    "requirement_name",
    "wheel_requirements",
]
