"""Source mode on a real CUDA extension, without a GPU: BuildKit, nvcc 13, cubin check.

The extension is our own (tests/data/spark_kernel): a CMake build shaped like sgl-kernel's,
with hardcoded gencode lists (sm_90 as the base, sm_100a/sm_103a/sm_120a as CUDA rises,
sm_121a on aarch64 only), FA3 forced on from CUDA 12.4, a separate sm90 target, a FlashMLA
target in an included file, an nvcc thread count in a CMake cache variable, and a
scikit-build-core wheel. The base image is Debian with CUDA 13.0's nvcc and cuobjdump from
PyPI (tests/support/cuda_toolchain.py), pushed to a loopback registry. `sparkbuild build` runs
the real source-mode path: the spec's sm121a-prune step (with a `when` range, as in
builds/sglang.yaml) leaves sm_121a only and removes the three targets; BuildKit compiles; then
sparkbuild's own check lists the wheel's cubins with cuobjdump inside the image. Without the
step the same build fails that check, the image is removed, and the lock is kept.
Natively on this x86_64 host for speed (nvcc cross-compiles device code for any arch);
SPARKBUILD_TEST_CUDA_ARCH=arm64 runs the same test for linux/arm64 under emulation (aarch64
nvcc wheels, a debootstrapped arm64 base: minutes, so not the default).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.support.cuda_toolchain import BASE_SETUP, cuda_wheels
from tests.support.docker_env import (
    BUILD_ROOTFS,
    docker_client,
    push_arm64_base,
    python_in_image,
    remove_images,
    start_registry,
)
from tests.support.gitrepos import git, tagged_repo
from tests.support.image_project import build_json, load_lock, sparkbuild

pytestmark = [pytest.mark.docker, pytest.mark.upstream]

DATA = Path(__file__).parent / "data"
BUILD = "spark-kernel-0.1.0"
ARCH = os.environ.get("SPARKBUILD_TEST_CUDA_ARCH", "amd64")
WHEEL = "spark_kernel-0.1.0-cp311-cp311-linux_{}.whl".format(
    {"amd64": "x86_64", "arm64": "aarch64"}[ARCH]
)
PRUNE = {"step": "sm121a-prune", "file": "CMakeLists.txt", "when": ">=0.1,<0.2"}


def _kernel_repo(root: Path) -> Path:
    repo = root / "spark-kernel"
    shutil.copytree(DATA / "spark_kernel", repo)
    tagged_repo(repo, "v0.1.0", "spark-kernel 0.1.0")
    # Served as GitHub serves: the mirror is a partial clone, so the build context's export
    # must fetch the tree's contents first (and keep the step's own blob).
    git(repo, "config", "uploadpack.allowFilter", "true")
    return repo


def _spec(repo: Path, base: str, steps: list[dict[str, str]]) -> str:
    spec: dict[str, Any] = {
        "engine": "sglang",
        "repo": str(repo),
        "package_dir": "python/spark_kernel",
        "mode": "source",
        "platform": f"linux/{ARCH}",
        "base_image": base,
        "dockerfile": "docker/spark_kernel.Dockerfile",
        "tags": ["sparkbuild-tests/spark-kernel:{version}-{tree_short}"],
        "builds": {BUILD: {"ref": "v0.1.0", "version": "0.1.0", "steps": steps}},
    }
    return json.dumps(spec)  # JSON is YAML


def _wheel_build_info(image_id: str) -> dict[str, str]:
    code = (
        "import json, spark_kernel.build_info as b;"
        "print(json.dumps({k: getattr(b, k) for k in dir(b) if k.isupper()}))"
    )
    stdout = python_in_image(image_id, code, platform=f"linux/{ARCH}")
    info: dict[str, str] = json.loads(stdout)
    return info


def _wheel_members(image_id: str) -> str:
    code = (
        "import glob, zipfile;"
        "print('\\n'.join(zipfile.ZipFile(glob.glob('/opt/sparkbuild/wheels/*.whl')[0]).namelist()))"
    )
    return python_in_image(image_id, code, platform=f"linux/{ARCH}")


def test_cuda_source_build_keeps_only_sm_121a_and_the_check_catches_more(tmp_path: Path) -> None:
    client = docker_client()
    repo = _kernel_repo(tmp_path)
    project = tmp_path / "project"
    (project / "docker").mkdir(parents=True)
    shutil.copyfile(DATA / "spark_kernel.Dockerfile", project / "docker/spark_kernel.Dockerfile")
    spec_file = project / "builds" / "sglang.yaml"
    spec_file.parent.mkdir(parents=True)
    images: list[str] = []
    with start_registry(tmp_path / "registry") as registry:
        base = push_arm64_base(
            registry,
            "sparkbuild-tests/cuda13-nvcc",
            packages=BUILD_ROOTFS,
            setup=BASE_SETUP,
            context_files={"wheels": cuda_wheels(ARCH)},
            work_dir=tmp_path,
            arch=ARCH,
        )
        images.append(base)
        try:
            spec_file.write_text(_spec(repo, base, [PRUNE]))
            result = build_json(sparkbuild(project, tmp_path / "cache", "build", "--json"))
            images.append(result["image_id"])
            assert result["mode"] == "source"
            (mirror,) = (tmp_path / "cache" / "mirrors").glob("*.git")
            assert git(mirror, "config", "extensions.partialClone") == "origin"
            assert result["cuda_code"] == {
                "wheels_dir": "/opt/sparkbuild/wheels",
                "expected": ["sm_121a"],
                "wheels": [WHEEL],
                "cubin_archs": ["sm_121a"],
                "ptx_archs": [],
            }
            info = _wheel_build_info(result["image_id"])
            assert info["COMPILE_THREADS"] == "1"  # the -D cache variable reached CMake
            assert info["CUDA_FLAGS"].split() == [
                "-DNDEBUG",
                "-gencode=arch=compute_121a,code=sm_121a",
                "--expt-relaxed-constexpr",
                "--threads=1",
                "--compress-mode=size",
            ]
            wheel = _wheel_members(result["image_id"])
            assert "spark_kernel/sm100/" in wheel and "spark_kernel/infllm/" in wheel
            for removed in ("spark_kernel/sm90/", "spark_kernel/flash/", "spark_kernel/flashmla/"):
                assert removed not in wheel, removed
            assert info["CUDA_COMPILER_VERSION"].startswith("13.0")
            section = load_lock(project)["builds"][BUILD]["image"]
            assert section["cuda_code"]["cubin_archs"] == ["sm_121a"]
            lock_before = (project / "images.lock").read_text()

            # The same build without the step: the hardcoded archs and the targets come back.
            spec_file.write_text(_spec(repo, base, []))
            failed = sparkbuild(project, tmp_path / "cache", "--quiet", "build")
            assert failed.exit_code == 1, failed.stderr
            assert "carry CUDA code that does not run on sm_121a" in failed.stderr
            listed = {
                line.split(": ", 2)[1].split(".", 1)[0]: line.split(": ", 2)[2]
                for line in failed.stderr.splitlines()
                if line.strip().startswith(f"{WHEEL}: ")
            }
            hardcoded = "cubins for sm_100a, sm_103a, sm_120a, sm_90, sm_90a"
            assert listed == {
                "spark_kernel/sm90/_kernels": hardcoded,
                "spark_kernel/sm100/_kernels": hardcoded,
                "spark_kernel/flash/_kernels": "cubins for sm_90a",  # FA3, forced on
                "spark_kernel/flashmla/_kernels": "cubins for sm_100a, sm_90a",
                "spark_kernel/infllm/_kernels": "cubins for sm_90",
            }, failed.stderr
            if ARCH == "amd64":  # sgl-kernel adds sm_121a on aarch64 only
                assert "no cubins that run on sm_121a in any wheel" in failed.stderr
            assert "the image was removed" in failed.stderr
            assert "Traceback" not in failed.stderr
            assert (project / "images.lock").read_text() == lock_before
            leftovers = client.images.list(filters={"label": "io.sparkbuild.build=" + BUILD})
            assert [image.id for image in leftovers] == [result["image_id"]]
        finally:
            remove_images(client, images)
