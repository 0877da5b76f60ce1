"""The pure parts of the overlay scope and the cubin check (their real runs are in
test_image_overlay_user.py and test_image_cuda_source.py)."""

from __future__ import annotations

import pytest

from sparkbuild import imageref
from sparkbuild.errors import SparkbuildError
from sparkbuild.image import cubins
from sparkbuild.source import scope


@pytest.mark.parametrize(
    ("path", "allowed"),
    [
        ("test/srt/test_spec.py", True),
        ("python/sglang/test/x.py", True),  # inside the package: carried, never refused
        ("docs/backend/spark.md", True),
        ("README.md", True),
        ("benchmark/test_speed.py", True),
        ("sgl-kernel/csrc/spark.cu", False),
        ("python/pyproject.toml", False),
        ("docker/Dockerfile", False),
        ("scripts/testing_helper.sh", False),
    ],
)
def test_what_an_overlay_may_leave_out(path: str, allowed: bool) -> None:
    refused = scope.refused("python/sglang", [path])
    assert (refused == []) is allowed


def test_the_status_note_names_what_is_left_out() -> None:
    paths = ["python/sglang/a.py", "test/a_test.py", "docs/a.md", "docs/b.rst", "docs/c.md"]
    note = scope.left_out_note("python/sglang", paths)
    assert note == (
        "4 test/doc file(s) outside python/sglang are not in the overlay image "
        "(docs/a.md, docs/b.rst, docs/c.md and 1 more)"
    )
    assert scope.left_out_note("python/sglang", ["python/sglang/a.py"]) is None


def test_arch_lists_become_cuobjdump_names() -> None:
    assert cubins.expected_archs("12.1a") == (("sm_121a",), False)
    assert cubins.expected_archs("9.0a;12.1a+PTX") == (("sm_90a", "sm_121a"), True)
    assert cubins.expected_archs("12.0f 12.1a") == (("sm_120f", "sm_121a"), False)
    with pytest.raises(SparkbuildError, match=r"MAJOR\.MINOR"):
        cubins.expected_archs("sm_121a")


def _code(wheels: dict[str, dict[str, dict[str, list[str]]]]) -> cubins.CudaCode:
    return cubins.CudaCode("/opt/sparkbuild/wheels", ("sm_121a",), wheels)


def test_problems_name_the_wheel_library_and_arch() -> None:
    good: dict[str, dict[str, dict[str, list[str]]]] = {
        "k.whl": {"k/_ops.so": {"elf": ["sm_121a"], "ptx": []}, "k/_c.so": {"elf": [], "ptx": []}}
    }
    assert cubins.problems(_code(good), ptx_wanted=False) == []
    fat = {"k.whl": {"k/_ops.so": {"elf": ["sm_121a", "sm_90a"], "ptx": ["sm_90a"]}}}
    assert cubins.problems(_code(fat), ptx_wanted=False) == [
        "k.whl: k/_ops.so: cubins for sm_90a",
        "k.whl: k/_ops.so: PTX for sm_90a",
    ]
    wrong = {"k.whl": {"k/_ops.so": {"elf": ["sm_120a"], "ptx": []}}}
    assert cubins.problems(_code(wrong), ptx_wanted=False) == [
        "k.whl: k/_ops.so: cubins for sm_120a",
        "no cubins that run on sm_121a in any wheel",
    ]
    assert cubins.problems(_code({}), ptx_wanted=False) == ["no wheel in /opt/sparkbuild/wheels"]
    # vLLM builds its generic kernels as sm_120 for 12.1a: they run on the Spark.
    portable = {"v.whl": {"v/_C.so": {"elf": ["sm_120", "sm_120f", "sm_121a"], "ptx": []}}}
    assert cubins.problems(_code(portable), ptx_wanted=False) == []


@pytest.mark.parametrize(
    ("cubin", "target", "runs"),
    [
        ("sm_121a", "sm_121a", True),
        ("sm_120", "sm_121a", True),
        ("sm_120f", "sm_121a", True),
        ("sm_120a", "sm_121a", False),
        ("sm_90a", "sm_121a", False),
        ("sm_100a", "sm_121a", False),
        ("sm_110", "sm_121a", False),
        ("sm_121", "sm_120", False),
    ],
)
def test_which_cubins_run_on_a_gb10(cubin: str, target: str, runs: bool) -> None:
    assert cubins.runs_on(cubin, target) is runs


@pytest.mark.parametrize(
    ("reference", "expected"),
    [
        ("lmsysorg/sglang:v0.5.12-cu130@sha256:" + "a" * 64, ("docker.io", "lmsysorg/sglang")),
        ("ubuntu:24.04", ("docker.io", "library/ubuntu")),
        ("127.0.0.1:5000/tests/sglang:v1", ("127.0.0.1:5000", "tests/sglang")),
        ("ghcr.io/acme/base", ("ghcr.io", "acme/base")),
    ],
)
def test_base_references_split_into_registry_and_repository(
    reference: str, expected: tuple[str, str]
) -> None:
    assert imageref.split_reference(reference) == expected
