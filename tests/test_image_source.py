"""Source mode through the production path, on a tiny repository with a C extension.

A real git repository with a setuptools C extension is made here; a patch changes the C
code; `sparkbuild build` exports the patched tree as the build context and BuildKit compiles
it for linux/arm64 under emulation, FROM an arm64 Debian with gcc pushed to a loopback
registry. Only the Dockerfile is the test's own (`dockerfile:` in the spec); the CUDA
templates need a GPU toolchain this machine does not have.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.docker_env import (
    BUILD_ROOTFS,
    docker_client,
    push_arm64_base,
    python_in_image,
    remove_images,
    start_registry,
)
from tests.support.gitrepos import git, tagged_repo
from tests.support.image_project import (
    build_json,
    load_lock,
    make_patch_file,
    sparkbuild,
    write_spec,
)

pytestmark = [pytest.mark.docker]

SETUP_PY = """\
from setuptools import Extension, setup

setup(
    name="spark-ext",
    version="1.0.0",
    packages=["spark_ext"],
    ext_modules=[Extension("spark_ext._fast", ["spark_ext/_fast.c"])],
)
"""
INIT_PY = "from spark_ext._fast import answer\n"
FAST_C = """\
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *answer(PyObject *self, PyObject *args) { return PyLong_FromLong(41); }

static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, "The answer."}, {NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fast", NULL, -1, methods};
PyMODINIT_FUNC PyInit__fast(void) { return PyModule_Create(&module); }
"""
DOCKERFILE = """\
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
ARG MAX_JOBS
ARG TORCH_CUDA_ARCH_LIST
ARG CUDA_VERSION
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/root/.cache/pip --mount=type=cache,target=/root/.ccache \\
    printf 'MAX_JOBS=%s\\nTORCH_CUDA_ARCH_LIST=%s\\nCUDA_VERSION=%s\\n' \\
        "$MAX_JOBS" "$TORCH_CUDA_ARCH_LIST" "$CUDA_VERSION" > /build-info.txt && \\
    python3 setup.py build_ext --inplace --parallel "$MAX_JOBS"
ENV PYTHONPATH=/src
"""


def _extension_repo(root: Path) -> Path:
    repo = root / "spark-ext"
    (repo / "spark_ext").mkdir(parents=True)
    (repo / "setup.py").write_text(SETUP_PY)
    (repo / "spark_ext" / "__init__.py").write_text(INIT_PY)
    (repo / "spark_ext" / "_fast.c").write_text(FAST_C)
    tagged_repo(repo, "v1.0.0", "spark-ext 1.0.0")
    return repo


def test_source_build_compiles_the_patched_c_extension_for_arm64(tmp_path: Path) -> None:
    client = docker_client()
    repo = _extension_repo(tmp_path)
    project = tmp_path / "project"
    make_patch_file(
        repo,
        "v1.0.0",
        {"spark_ext/_fast.c": ("PyLong_FromLong(41)", "PyLong_FromLong(42)")},
        project / "patches" / "ext.patch",
    )
    (project / "docker").mkdir(parents=True)
    (project / "docker" / "ext.Dockerfile").write_text(DOCKERFILE)
    images: list[str] = []
    with start_registry(tmp_path / "registry") as registry:
        base = push_arm64_base(
            registry, "sparkbuild-tests/buildtools", packages=BUILD_ROOTFS, work_dir=tmp_path
        )
        images.append(base)
        write_spec(
            project,
            "vllm",
            {
                "repo": str(repo),
                "package_dir": "spark_ext",
                "mode": "source",
                "base_image": base,
                "dockerfile": "docker/ext.Dockerfile",
                "tags": ["sparkbuild-tests/spark-ext:{version}-{tree_short}"],
                "builds": {
                    "ext-1.0.0": {"ref": "v1.0.0", "patches": [{"file": "patches/ext.patch"}]}
                },
            },
        )
        try:
            result = build_json(sparkbuild(project, tmp_path / "cache", "build", "--json"))
            images.append(result["image_id"])
            assert result["skipped"] is False
            assert result["mode"] == "source"
            stdout = python_in_image(
                result["image_id"],
                "import json, platform, spark_ext, spark_ext._fast as f;"
                "print(json.dumps([spark_ext.answer(), platform.machine(), f.__file__,"
                " open('/build-info.txt').read()]))",
            )
            answer, machine, so_file, info = json.loads(stdout)
            assert answer == 42  # the patched C code was compiled
            assert machine == "aarch64"
            assert so_file.endswith(".so") and "aarch64" in so_file
            facts = dict(line.split("=", 1) for line in info.split())
            assert facts["TORCH_CUDA_ARCH_LIST"] == "12.1a"
            assert facts["CUDA_VERSION"] == "13.0"
            assert int(facts["MAX_JOBS"]) >= 1

            labels = client.images.get(result["image_id"]).labels
            assert labels["io.sparkbuild.build"] == "ext-1.0.0"
            assert labels["org.opencontainers.image.revision"] == git(
                repo, "rev-parse", "v1.0.0^{commit}"
            )
            section = load_lock(project)["builds"]["ext-1.0.0"]["image"]
            assert section["mode"] == "source"
            assert section["image_id"] == result["image_id"]

            again = build_json(sparkbuild(project, tmp_path / "cache", "build", "--json"))
            assert again["skipped"] is True
        finally:
            remove_images(client, images)
