"""The device-code audit on real device code in a real linux/arm64 image.

One image serves every test here (tests/support/device_code.py): kernels compiled by CUDA
13's nvcc from PyPI for sm_120 + sm_121a, sm_90a + sm_100a and compute_90 PTX, packed
into aarch64 shared libraries inside wheels and as loose files (a fatbin, cubins, an
executable), beside the published bitsandbytes (CUDA 11.8 to 13.2 builds) and
flashinfer-python (compiles at first use) wheels and the SGLang release package. The
audit reads the image without running it; every file's listing is held against
cuobjdump's own on the same bytes, and an overlay build on this image fails naming the
Hopper-only library SGLang's launch loads.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sparkbuild import lockfile
from sparkbuild.attest.contents import ImageContents, PythonDistribution
from sparkbuild.attest.device_code import check_device_code
from sparkbuild.attest.sbom import build_sbom
from sparkbuild.image.audit import judge
from sparkbuild.image.audit_record import lock_record
from sparkbuild.image.imagefiles import ImageFiles, read_image_files
from tests.support.cache import shared_test_cache
from tests.support.device_code import (
    AuditImage,
    audit_image,
    cuobjdump_listing,
    kernels,
    published_wheels,
)
from tests.support.docker_env import BOOKWORM_PYTHON_SITE, docker_client
from tests.support.image_project import OverlayEnv, load_lock, overlay_project, sparkbuild
from tests.support.sglang_releases import sglang_release_repo

pytestmark = [pytest.mark.docker, pytest.mark.upstream]

SITE = BOOKWORM_PYTHON_SITE


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuditImage]:
    with audit_image(tmp_path_factory.mktemp("audit")) as built:
        yield built


@pytest.fixture(scope="module")
def cli_run(image: AuditImage) -> tuple[int, dict[str, Any], str]:
    result = sparkbuild(
        image.work / "project",
        image.work / "cache",
        "audit",
        image.reference,
        "--engine",
        "sglang",
        "--json",
    )
    return result.exit_code, json.loads(result.stdout), result.stderr


@pytest.fixture(scope="module")
def files(image: AuditImage) -> ImageFiles:
    return read_image_files(docker_client(), image.image_id)


def _libraries(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {lib["name"]: lib for lib in report["libraries"]}


def test_audit_judges_each_library_and_fails_on_what_the_launch_loads(
    cli_run: tuple[int, dict[str, Any], str],
) -> None:
    code, report, stderr = cli_run
    libs = _libraries(report)
    hopper = libs["sglang-kernel"]
    assert (hopper["verdict"], hopper["loaded"]) == ("none", True)
    assert hopper["sass"] == ["sm_100a", "sm_90a"] and hopper["ptx"] == []
    assert (libs["spark-native-kernels"]["verdict"], libs["ptx-kernels"]["verdict"]) == (
        "native",
        "ptx",
    )
    assert not libs["spark-native-kernels"]["loaded"]  # nothing the launch needs requires it
    flashinfer = libs["flashinfer-python"]
    assert (flashinfer["verdict"], flashinfer["loaded"], flashinfer["files"]) == ("jit", True, [])
    assert "no flashinfer-cubin" in flashinfer["compiles"]
    assert "no nvcc" in flashinfer["compiles"]
    loose = {lib["name"]: lib["verdict"] for lib in report["libraries"] if lib["kind"] == "file"}
    assert loose == {
        "/opt/kernels/hopper-tool": "none",
        "/opt/kernels/kernel.sm_121a.cubin": "native",
        "/opt/kernels/kernel.sm_90a.cubin": "none",
        "/opt/kernels/libnative.so": "native",
        "/opt/kernels/native.fatbin": "native",
        "/opt/kernels/ptx.fatbin": "ptx",
    }
    bnb = {f["path"].rsplit("/", 1)[-1]: f for f in libs["bitsandbytes"]["files"]}
    assert bnb["libbitsandbytes_cuda130.so"]["verdict"] == "native"
    assert bnb["libbitsandbytes_cuda126.so"]["verdict"] == "none"  # sm_75 to sm_90 only
    assert "libcudart.so.11.0" in bnb["libbitsandbytes_cuda118.so"]["problem"]
    assert report["roots"] == ["sglang"]
    assert code == 1
    assert f"sglang-kernel: {SITE}/sgl_kernel/_C.abi3.so (SASS sm_100a, sm_90a)" in stderr
    assert "Traceback" not in stderr


def _host_copy(path: str, work: Path) -> Path:
    """The bytes the image holds at ``path``, as the test made or downloaded them."""
    built = kernels()
    name = path.rsplit("/", 1)[-1]
    if path.startswith("/opt/kernels/"):
        return built / name
    by_package = {"sgl_kernel": "hopper", "ptx_kernels": "ptx", "spark_native_kernels": "native"}
    package = path.removeprefix(SITE + "/").split("/", 1)[0]
    if package in by_package:
        return built / f"lib{by_package[package]}.so"
    assert package == "bitsandbytes", path
    (wheel,) = published_wheels().glob("bitsandbytes-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return Path(archive.extract(f"bitsandbytes/{name}", work))


def test_audit_agrees_with_cuobjdump(
    cli_run: tuple[int, dict[str, Any], str], tmp_path: Path
) -> None:
    _code, report, _stderr = cli_run
    compared, refused = 0, []
    for lib in report["libraries"]:
        for file in lib["files"]:
            listed = cuobjdump_listing(_host_copy(file["path"], tmp_path))
            if listed is None:
                refused.append(file["path"].rsplit("/", 1)[-1])
                continue
            assert (set(file["sass"]), set(file["ptx"])) == listed, file["path"]
            compared += 1
    assert compared == 3 + 6 + 6  # our wheels, the loose files, bitsandbytes' CUDA builds
    # cuobjdump 13.2 calls this published file "Invalid ELF"; binutils' readelf reads its
    # .nv_fatbin section as the audit does (SASS sm_75, sm_80, sm_90): both are shown.
    assert refused == ["libbitsandbytes_cuda121.so"]


def test_ptx_only_warns_and_native_passes(files: ImageFiles, image: AuditImage) -> None:
    ptx = judge(image.image_id, files, ["ptx-kernels"])
    assert ptx.failures() == []
    assert any("ptx-kernels" in w and "PTX only" in w for w in ptx.warnings())
    native = judge(image.image_id, files, ["spark-native-kernels"])
    assert native.failures() == []
    assert not any("spark-native-kernels" in w for w in native.warnings())
    assert _libraries(native.to_json())["spark-native-kernels"]["loaded"] is True


def test_overlay_build_on_a_hopper_only_kernel_fails_naming_it(image: AuditImage) -> None:
    repo = sglang_release_repo(shared_test_cache(), ["0.5.12"])
    env = OverlayEnv("0.5.12", image.registry, image.reference, repo, image.work, [])
    edits = {"python/sglang/srt/sparkbuild_marker.py": "MARKER = 1\n"}
    tags = ["sparkbuild-tests/audit:{tree_short}"]
    project = overlay_project(env, "hopper-build", "sglang-audit", edits, tags)
    result = sparkbuild(project, image.work / "cache", "--quiet", "build")
    assert result.exit_code == 1, result.stderr
    assert "sglang-audit: the launch loads device code with nothing for sm_121" in result.stderr
    assert f"sglang-kernel: {SITE}/sgl_kernel/_C.abi3.so" in result.stderr
    assert "the image was removed and images.lock was not changed" in result.stderr
    assert load_lock(project) == {}
    left = docker_client().images.list(filters={"label": "io.sparkbuild.build=sglang-audit"})
    assert left == []


def test_the_sbom_carries_the_audit_and_verify_refuses_a_loaded_library_without_sm121(
    files: ImageFiles, image: AuditImage
) -> None:
    dists = tuple(
        PythonDistribution(d.name, d.version, d.site, None, 0) for d in files.distributions.values()
    )
    found = ImageContents("debian", "12", (), dists)
    entry = _entry(lock_record(judge(image.image_id, files, ["sglang"])))
    document = build_sbom(found, "b", entry, "registry.example/audit", image.image_id).document
    by_name = {c["name"]: c for c in document["components"]}
    props = {p["name"]: p["value"] for p in by_name["sglang-kernel"]["properties"]}
    assert (
        props["sparkbuild:sm121:verdict"] == "none" and props["sparkbuild:sm121:loaded"] == "true"
    )
    assert props["sparkbuild:sm121:sass"] == "sm_100a sm_90a"
    ok, detail = check_device_code(document)
    assert not ok and detail == "loaded with no sm_121 code: sglang-kernel (SASS sm_100a sm_90a)"
    passing = _entry(lock_record(judge(image.image_id, files, ["spark-native-kernels"])))
    document = build_sbom(found, "b", passing, "registry.example/audit", image.image_id).document
    ok, detail = check_device_code(document)
    assert ok and detail.startswith(f"sm_121 audit {image.image_id}: native"), detail


def _entry(device_code: dict[str, Any]) -> lockfile.BuildEntry:
    return lockfile.BuildEntry.model_validate(
        {
            "source": {"engine": "sglang", "repo": "https://example.invalid/sglang"},
            "image": {"image_id": device_code["image_id"], "device_code": device_code},
        }
    )
