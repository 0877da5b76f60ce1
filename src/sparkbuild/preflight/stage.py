"""Preflight's entry point: run the probe for one prepared build and its profiles, compare
with the unpatched release, and report."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from sparkbuild.checks import CheckResult
from sparkbuild.preflight.compare import compare_with_release
from sparkbuild.preflight.plan import (
    REGISTRY_DIRS,
    ProfilePlan,
    load_profile_plan,
)
from sparkbuild.preflight.report import (
    PACKAGE_CHECKS,
    PROFILE_CHECKS,
    PreflightReport,
    ProfileResult,
    check_from_probe,
)
from sparkbuild.preflight.signals import signals_for
from sparkbuild.preflight.venv import LocalVenv
from sparkbuild.preflight.where import (
    ChosenTargets,
    Where,
    choose_targets,
    unavailable_modules,
)
from sparkbuild.settings import Settings
from sparkbuild.source import PreparedSource
from sparkbuild.spec import Build


def changed_in_package(prepared: PreparedSource) -> list[str]:
    """Changed files that still exist, relative to the engine's package directory."""
    prefix = prepared.build.package_dir.strip("/") + "/"
    return [
        c.path[len(prefix) :]
        for c in prepared.changed
        if c.path.startswith(prefix) and c.status != "D"
    ]


def probe_plan(
    build: Build,
    changed: list[str],
    profiles: list[ProfilePlan],
    unavailable: dict[str, str],
    checks: tuple[str, ...],
) -> dict[str, Any]:
    return {
        "engine": build.engine,
        "package": build.package_dir.strip("/").rsplit("/", 1)[-1],
        "changed": changed,
        "checks": list(checks),
        "signals": signals_for(build.engine, build.version),
        "registry_dir": REGISTRY_DIRS.get(build.engine),
        "unavailable_modules": unavailable,
        "profiles": [p.to_probe() for p in profiles],
    }


def _package_checks(
    data: dict[str, Any], base_data: dict[str, Any] | None, changed: bool
) -> list[CheckResult]:
    results = []
    for name in PACKAGE_CHECKS:
        if name not in data.get("checks", {}):
            if name in ("imports", "registry") and not changed:
                results.append(
                    CheckResult(name, "pass", "no changed files: the tree is the release")
                )
            continue
        result = check_from_probe(name, data["checks"][name])
        if name in ("imports", "registry"):
            base = base_data["checks"].get(name) if base_data else None
            result = compare_with_release(
                result, check_from_probe(name, base) if base else None, name
            )
        results.append(result)
    return results


def _baseline(
    settings: Settings, prepared: PreparedSource, chosen: ChosenTargets, plan: dict[str, Any]
) -> dict[str, Any]:
    """The unpatched release's imports/registry results, cached: the same release commit,
    dependencies and plan always give the same answer, so warm runs skip it."""
    assert chosen.base is not None
    if chosen.image_id is not None:  # an image's base is judged by its own id each time
        return chosen.base.run(plan)
    text = json.dumps([prepared.base_commit, chosen.deps_digest, plan], sort_keys=True)
    key = hashlib.sha256(text.encode()).hexdigest()[:32]
    path = settings.cache_dir / "preflight-baselines" / f"{key}.json"
    if path.exists():
        cached = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(cached, dict):
            return cached
    data = chosen.base.run(plan)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    tmp.replace(path)
    return data


def run_preflight(
    settings: Settings,
    prepared: PreparedSource,
    profile_names: list[str],
    where: Where,
) -> PreflightReport:
    """Preflight one prepared build for ``profile_names`` (the build's own when empty)."""
    build = prepared.build
    version = build.version
    profiles = [load_profile_plan(settings, n, build.engine, version) for n in profile_names]
    changed = changed_in_package(prepared)
    chosen = choose_targets(settings, prepared, where, bool(changed))
    unavailable = unavailable_modules(chosen.venv)
    checks = [c for c in ("compile", "signals", *PROFILE_CHECKS) if c in where.checks]
    if changed:
        checks += [c for c in ("imports", "registry") if c in where.checks]
    data = chosen.target.run(probe_plan(build, changed, profiles, unavailable, tuple(checks)))
    base_checks = tuple(c for c in ("imports", "registry") if c in checks)
    base_data = None
    if chosen.base is not None and base_checks:
        base_plan = probe_plan(build, changed, [], unavailable, base_checks)
        base_data = _baseline(settings, prepared, chosen, base_plan)
    profile_results = tuple(
        ProfileResult(
            p.name,
            tuple(
                check_from_probe(c, data.get("profiles", {}).get(p.name, {}).get(c))
                for c in PROFILE_CHECKS
                if c in checks
            ),
        )
        for p in profiles
    )
    return PreflightReport(
        build=build.name,
        engine=build.engine,
        version=str(version),
        where=chosen.target.where,
        tree=prepared.tree,
        deps_digest=chosen.deps_digest,
        package_checks=tuple(_package_checks(data, base_data, bool(changed))),
        profiles=profile_results,
        image_id=chosen.image_id,
        versions=dict(data.get("versions", {})),
        dependencies=_deps_json(chosen.venv),
    )


def _deps_json(venv: LocalVenv | None) -> dict[str, Any]:
    if venv is None:
        return {}
    return {**venv.deps.to_json(), "unavailable": list(venv.unavailable), "venv": str(venv.path)}


def report_json(reports: list[PreflightReport]) -> str:
    return json.dumps([r.to_json() for r in reports], indent=2, sort_keys=True, default=str)
