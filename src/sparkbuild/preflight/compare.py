"""Judging a patched tree against the unpatched release: a failure both have is the release's,
not the patch's."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from sparkbuild.checks import CheckResult


def compare_with_release(patched: CheckResult, base: CheckResult | None, what: str) -> CheckResult:
    """Failures the unpatched release has too are not the patch's doing."""
    if base is None:
        return patched
    base_failing = {
        _failure_key(i) for i in base.items if isinstance(i, dict) and not i.get("ok", False)
    }
    if what == "registry":
        new = [i for i in patched.items if _failure_key(i) not in base_failing]
        if not new:
            return CheckResult(
                "registry",
                "pass",
                f"{len(patched.items)} model module(s) fail to import here, the same as in the "
                "unpatched release",
                items=patched.items,
            )
        lines = [_registry_line(i) for i in new]
        return CheckResult(
            "registry",
            "fail",
            f"{len(new)} model module(s) newly fail to import against the release: "
            + "; ".join(lines),
            items=tuple(new),
        )
    return _compare_imports(patched, base_failing)


def _failure_key(item: Mapping[str, object]) -> tuple[Any, ...]:
    """The same failure in two trees: module and what is missing, paths left out (the
    patched and the unpatched tree sit in different directories)."""
    error = re.sub(r"\([^()]*/[^()]*\)", "", str(item.get("error", "")))
    return (item.get("module"), item.get("missing_module"), item.get("missing_name"), error)


def _import_line(item: Mapping[str, object]) -> str:
    if item.get("missing_name"):
        package = f" ({item['package']})" if item.get("package") else ""
        return (
            f"{item['module']} imports name {item['missing_name']!r} that "
            f"{item.get('from_module')}{package} does not have (a prerequisite change is missing)"
        )
    if item.get("missing_module"):
        return f"{item['module']} needs module {item['missing_module']!r}, which is missing"
    return f"{item['module']}: {item.get('error', '')}"


def _registry_line(item: dict[str, Any]) -> str:
    classes = ", ".join(item.get("classes") or []) or "(no EntryClass)"
    cause = (
        f"name {item['missing_name']!r} missing from {item.get('from_module')}"
        if item.get("missing_name")
        else f"module {item['missing_module']!r} missing"
        if item.get("missing_module")
        else item.get("error", "")
    )
    return f"{classes} ({item['module']}): {cause}"


def _compare_imports(patched: CheckResult, base_failing: set[tuple[Any, Any]]) -> CheckResult:
    if patched.status != "fail":
        return patched
    items = [
        {**item, "pre_existing": True}
        if isinstance(item, dict)
        and not item.get("ok", True)
        and _failure_key(item) in base_failing
        else item
        for item in patched.items
    ]
    failing = [
        i
        for i in items
        if not i.get("ok") and not i.get("pre_existing") and not i.get("unavailable_package")
    ]
    if failing:
        lines = "; ".join(_import_line(i) for i in failing)
        detail = (
            f"{len(failing)} of {len(items)} module(s) fail to import where the unpatched "
            f"release does not: {lines}"
        )
        return CheckResult("imports", "fail", detail, items=tuple(items))
    same = sum(bool(i.get("pre_existing")) for i in items)
    needs = sorted({str(i["unavailable_package"]) for i in items if i.get("unavailable_package")})
    if needs:
        return CheckResult(
            "imports",
            "skip",
            f"{len(items)} module(s) checked; {same} fail in the unpatched release too; some "
            f"need packages not installable on this CPU: {', '.join(needs)}",
            items=tuple(items),
        )
    return CheckResult(
        "imports",
        "pass",
        f"{len(items)} module(s) checked; the {same} that fail also fail in the unpatched release",
        items=tuple(items),
    )
