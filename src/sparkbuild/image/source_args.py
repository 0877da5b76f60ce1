"""Build arguments of the source templates that depend on the engine release.

The upstream trees move between releases; each move is one row here, with the range it
covers and where it was read, the same way patches carry `when` ranges. sparkbuild passes
these as build arguments (so they feed the inputs digest); a spec's own `build_args` win.

SGLang (read from the release wheels on PyPI, 0.5.10-0.5.23):
- every release from 0.5.10 requires `sglang-kernel` (wheel `sglang_kernel-*.whl`, imported as
  `sgl_kernel`); older trees build `sgl_kernel-*.whl`;
- 0.5.17 reorganised the kernels (`sglang/jit_kernel` became `sglang/kernels`); the AOT kernel
  tree moved from `sgl-kernel/` to `python/sglang/kernels/aot` with it (the AOT sources are
  not in the wheels: checked in the tree, not here).
vLLM (read from the 0.33.0 sdist and its docker/Dockerfile):
- build requirements at `requirements/build/cuda.txt` (earlier: `requirements/build.txt`);
- `tools/use_existing_torch.py --prefix` (earlier: `use_existing_torch.py` at the top).
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.specifiers import SpecifierSet

from sparkbuild import templates
from sparkbuild.spec import Build

# Memory per parallel compile job: a sm_121a CUTLASS/FlashInfer nvcc job peaks at 10-12 GiB
# (community Spark builds: 16 jobs at one nvcc thread each still ran out of 119 GiB).
GIB_PER_JOB = 11
# Upstream release images are CUDA 13 devel images with torch: the default source base, pinned
# by digest in images.lock when first resolved. A spec's `base_image` overrides it.
DEFAULT_SOURCE_BASE = {
    "sglang": "lmsysorg/sglang:v{version}-cu130",
    "vllm": "vllm/vllm-openai:v{version}-aarch64",
}


@dataclass(frozen=True)
class Moved:
    """One build argument whose value changed at a release."""

    name: str
    when: str
    value: str


TREE_MOVES: dict[str, tuple[Moved, ...]] = {
    "sglang": (
        Moved("SGL_KERNEL_DIR", "<0.5.17", "sgl-kernel"),
        Moved("SGL_KERNEL_DIR", ">=0.5.17", "python/sglang/kernels/aot"),
        Moved("SGL_KERNEL_WHEEL", "<0.5.10", "sgl_kernel"),
        Moved("SGL_KERNEL_WHEEL", ">=0.5.10", "sglang_kernel"),
    ),
    "vllm": (
        Moved("VLLM_BUILD_REQUIREMENTS", "<0.33", "requirements/build.txt"),
        Moved("VLLM_BUILD_REQUIREMENTS", ">=0.33", "requirements/build/cuda.txt"),
        Moved("VLLM_USE_EXISTING_TORCH", "<0.33", "use_existing_torch.py"),
        Moved("VLLM_USE_EXISTING_TORCH", ">=0.33", "tools/use_existing_torch.py --prefix"),
    ),
}


def default_base(build: Build) -> str | None:
    template = DEFAULT_SOURCE_BASE.get(build.engine)
    return templates.fill(template, {"version": str(build.version)}) if template else None


def source_args(build: Build) -> dict[str, str]:
    """The version-dependent build arguments of ``build``'s engine template."""
    args = {
        "TORCH_CUDA_ARCH_LIST": "12.1a",
        "CUDA_VERSION": "13.0",
        "ENGINE_VERSION": str(build.version),
        "GIB_PER_JOB": str(GIB_PER_JOB),
    }
    for moved in TREE_MOVES.get(build.engine, ()):
        if SpecifierSet(moved.when).contains(build.version, prereleases=True):
            args[moved.name] = moved.value
    return args
