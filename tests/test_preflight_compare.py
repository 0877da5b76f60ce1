"""How preflight weighs the patched tree's import failures against the unpatched release's."""

from __future__ import annotations

from sparkbuild.checks import CheckResult
from sparkbuild.preflight.compare import compare_with_release as _compare


def _item(module: str, error: str, **extra: str) -> dict[str, object]:
    return {"module": module, "role": "importer", "ok": False, "error": error, **extra}


def test_import_failures_the_release_has_too_do_not_count_but_skips_stay() -> None:
    mlx = _item("sglang.srt.hardware_backend.mlx.tp_worker", "No module named 'mlx'",
                missing_module="mlx")  # fmt: skip
    kernel = _item("sglang.srt.layers.x", "No module named 'sgl_kernel'",
                   missing_module="sgl_kernel", unavailable_package="sglang-kernel")  # fmt: skip
    patched = CheckResult("imports", "fail", "1 fails", items=(mlx, kernel))
    base = CheckResult("imports", "fail", "1 fails", items=(mlx,))
    result = _compare(patched, base, "imports")
    assert result.status == "skip" and "sglang-kernel" in result.detail
    only_mlx = _compare(CheckResult("imports", "fail", "x", items=(mlx,)), base, "imports")
    assert only_mlx.status == "pass" and "also fail in the unpatched release" in only_mlx.detail


def test_a_new_registry_failure_is_named_by_class_and_missing_name() -> None:
    # The same failure in a different tree directory is the same failure.
    old = {"module": "sglang.srt.models.a", "classes": ["A"],
           "error": "ImportError: cannot import name 'f' from 'm' (/tree/one/m.py)",
           "missing_name": "f", "from_module": "m"}  # fmt: skip
    moved = {**old, "error": "ImportError: cannot import name 'f' from 'm' (/tree/two/m.py)"}
    new = {"module": "sglang.srt.models.b", "classes": ["B", "BMTP"], "missing_name": "g",
           "from_module": "sglang.srt.layers.y", "error": "ImportError: ..."}  # fmt: skip
    base = CheckResult("registry", "pass", "", items=(old,))
    same = _compare(CheckResult("registry", "pass", "", items=(moved,)), base, "registry")
    assert same.status == "pass"
    result = _compare(CheckResult("registry", "pass", "", items=(moved, new)), base, "registry")
    assert result.status == "fail"
    assert "B, BMTP (sglang.srt.models.b): name 'g' missing from sglang.srt.layers.y" in (
        result.detail
    )


def test_a_new_import_failure_is_listed_without_the_release_own_failures() -> None:
    ray = _item("sglang.srt.ray.engine", "No module named 'ray'", missing_module="ray")
    new = _item("sglang.srt.speculative.frozen_kv_mtp_info", "ImportError: cannot import ...",
                missing_name="EagleDraftExtendInput",
                from_module="sglang.srt.speculative.eagle_info")  # fmt: skip
    patched = CheckResult("imports", "fail", "2 fail: ray, frozen_kv_mtp_info", items=(ray, new))
    result = _compare(patched, CheckResult("imports", "fail", "", items=(ray,)), "imports")
    assert result.status == "fail" and "ray" not in result.detail
    assert result.detail.startswith("1 of 2 module(s) fail to import where the unpatched")
    assert "frozen_kv_mtp_info imports name 'EagleDraftExtendInput' that " in result.detail
