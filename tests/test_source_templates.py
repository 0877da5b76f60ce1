"""The source-mode templates, rendered per engine release: the community Spark recipe.

"Rendered" means the packaged template with the build arguments sparkbuild passes for that
release substituted into its `ARG` defaults. The vLLM paths are checked against the real
0.33.0 sdist from PyPI (downloaded once into the shared test cache); SGLang's kernel wheel
name against the real release wheels' metadata.
"""

from __future__ import annotations

import re
import tarfile
import zipfile
from pathlib import Path

import pytest
import yaml
from packaging.version import Version

from sparkbuild.adapters import engine_names
from sparkbuild.image import context, source_args
from sparkbuild.settings import Settings
from sparkbuild.spec import Build, load_builds
from tests.support.cache import shared_test_cache
from tests.support.sglang_releases import download_wheel
from tests.support.vllm_sdist import vllm_sdist

SGLANG_RELEASES = [f"0.5.{minor}" for minor in range(11, 24)]


def _build(tmp_path: Path, engine: str, version: str) -> Build:
    spec = {
        "engine": engine,
        "repo": "https://example.invalid/x.git",
        "package_dir": engine,
        "mode": "source",
        "builds": {f"{engine}-b": {"ref": f"v{version}"}},
    }
    (tmp_path / "builds").mkdir(exist_ok=True)
    (tmp_path / "builds" / f"{engine}.yaml").write_text(yaml.safe_dump(spec))
    return load_builds(Settings(project_dir=tmp_path))[f"{engine}-b"]


def render(engine: str, args: dict[str, str]) -> str:
    """The packaged template with ``args`` as its ARG defaults (what BuildKit will use)."""
    text = context.packaged(f"{engine}-source.Dockerfile").read_text()
    for name, value in args.items():
        text, count = re.subn(rf"^ARG {name}(=.*)?$", f"ARG {name}={value}", text, flags=re.M)
        assert count == 1, f"{engine} template declares no ARG {name}"
    return text


def _run_step(text: str) -> str:
    return text[text.index("RUN --mount") :]


@pytest.mark.parametrize("version", SGLANG_RELEASES)
def test_sglang_template_per_release(tmp_path: Path, version: str) -> None:
    build = _build(tmp_path, "sglang", version)
    args = source_args.source_args(build)
    text = render("sglang", args)
    kernel_dir = (
        "sgl-kernel" if Version(version) < Version("0.5.17") else "python/sglang/kernels/aot"
    )
    assert f"ARG SGL_KERNEL_DIR={kernel_dir}\n" in text
    assert "ARG SGL_KERNEL_WHEEL=sglang_kernel\n" in text
    assert f"ARG ENGINE_VERSION={version}\n" in text
    assert "SETUPTOOLS_SCM_PRETEND_VERSION=${ENGINE_VERSION}" in text
    assert "ARG TORCH_CUDA_ARCH_LIST=12.1a\n" in text
    assert "FLASHINFER_CUDA_ARCH_LIST=12.1a" in text
    step = _run_step(text)
    # The community recipe: one nvcc thread as a CMake define, not an environment variable.
    assert "--config-settings=cmake.define.SGL_KERNEL_COMPILE_THREADS=1" in step
    assert "export SGL_KERNEL_COMPILE_THREADS" not in step
    for off in ("SGL_KERNEL_ENABLE_FA3", "SGL_KERNEL_ENABLE_FLASHMLA", "SGL_KERNEL_BUILD_SM90"):
        assert f"--config-settings=cmake.define.{off}=OFF" in step
    assert "CMAKE_CUDA_ARCHITECTURES" not in step  # adds an arch, prunes none
    assert "SGL_KERNEL_ENABLE_SM100A" not in step  # a no-op from CUDA 12.8
    assert "PIP_CONSTRAINT=/tmp/sparkbuild-constraints.txt" in step
    assert "pip install --no-build-isolation --no-deps ." in step
    assert ".[all]" not in step
    assert "import sgl_kernel" not in step  # no libcuda in a BuildKit step
    assert "CCACHE_COMPRESS=1" in text and "ccache --max-size" in step
    assert "gib*1048576" in step and "ARG GIB_PER_JOB=11\n" in text


@pytest.mark.upstream
@pytest.mark.parametrize("version", ["0.5.11", "0.5.17", "0.5.23"])
def test_sglang_kernel_wheel_name_matches_the_release_metadata(
    tmp_path: Path, version: str
) -> None:
    wheel = download_wheel(version, shared_test_cache())
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read(f"sglang-{version}.dist-info/METADATA").decode()
    kernel = re.search(r"^Requires-Dist: (sgl[-_a-z]*kernel)==", metadata, flags=re.M)
    assert kernel is not None
    wheel_prefix = kernel.group(1).replace("-", "_")
    assert source_args.source_args(_build(tmp_path, "sglang", version))["SGL_KERNEL_WHEEL"] == (
        wheel_prefix
    )


@pytest.mark.upstream
def test_vllm_template_matches_the_0_33_sdist(tmp_path: Path) -> None:
    args = source_args.source_args(_build(tmp_path, "vllm", "0.33.0"))
    text = render("vllm", args)
    assert "ARG VLLM_BUILD_REQUIREMENTS=requirements/build/cuda.txt\n" in text
    assert "ARG VLLM_USE_EXISTING_TORCH=tools/use_existing_torch.py --prefix\n" in text
    assert (
        "VLLM_VERSION_OVERRIDE=${ENGINE_VERSION}" in text and "ARG ENGINE_VERSION=0.33.0\n" in text
    )
    assert "FLASHINFER_CUDA_ARCH_LIST=12.1a" in text
    step = _run_step(text)
    assert "NVCC_THREADS=1" in step and "--no-deps" in step
    with tarfile.open(vllm_sdist()) as sdist:
        names = set(sdist.getnames())
        setup_py = sdist.extractfile("vllm-0.33.0/setup.py")
        assert setup_py is not None
        setup_text = setup_py.read().decode()
        dockerfile = sdist.extractfile("vllm-0.33.0/docker/Dockerfile")
        assert dockerfile is not None
        upstream = dockerfile.read().decode()
    assert f"vllm-0.33.0/{args['VLLM_BUILD_REQUIREMENTS']}" in names
    assert "vllm-0.33.0/requirements/build.txt" not in names
    assert 'os.getenv("VLLM_VERSION_OVERRIDE")' in setup_text
    assert f"python3 {args['VLLM_USE_EXISTING_TORCH']}" in upstream


def test_source_builds_default_to_the_release_image(tmp_path: Path) -> None:
    assert source_args.default_base(_build(tmp_path, "sglang", "0.5.23")) == (
        "lmsysorg/sglang:v0.5.23-cu130"
    )
    assert source_args.default_base(_build(tmp_path, "vllm", "0.33.0")) == (
        "vllm/vllm-openai:v0.33.0-aarch64"
    )


@pytest.mark.parametrize("engine", engine_names())
def test_templates_build_as_root_and_end_as_the_base_user(engine: str) -> None:
    """A base whose USER is not root still builds (pip into the system Python, /opt), and the
    image runs as that user again; sparkbuild passes the user it read from the base."""
    lines = context.packaged(f"{engine}-source.Dockerfile").read_text().rstrip("\n").split("\n")
    start = lines.index("FROM ${BASE_IMAGE}")
    first_run = next(i for i, line in enumerate(lines) if line.startswith("RUN "))
    assert start < lines.index("USER root") < first_run
    assert "ARG SPARKBUILD_BASE_USER=" in lines
    assert lines[-1] == "USER ${SPARKBUILD_BASE_USER:-root}"
    assert [line for line in lines if line.startswith("USER ")] == [
        "USER root",
        "USER ${SPARKBUILD_BASE_USER:-root}",
    ]
