"""Preflight's entry point: run the probe for one prepared build and its profiles, compare
with the unpatched release, and report."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from sparkbuild import cachetrust, fileio
from sparkbuild.adapters import PreflightFacts, adapter_type
from sparkbuild.checks import CheckResult
from sparkbuild.engines.host_facts import this_host
from sparkbuild.engines.signatures import diagnose
from sparkbuild.errors import PreflightSetupError, UsageError
from sparkbuild.preflight.binary import binary_facts, program_of, run_binary_preflight
from sparkbuild.preflight.compare import compare_with_release
from sparkbuild.preflight.kernels import KernelStandins
from sparkbuild.preflight.plan import SPARK_GPU, ProfilePlan, load_profile_plan
from sparkbuild.preflight.report import (
    PACKAGE_CHECKS,
    PROFILE_CHECKS,
    PreflightReport,
    ProfileResult,
    check_from_probe,
)
from sparkbuild.preflight.runner import probe_digest
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
    standins: tuple[Mapping[str, object], ...] = (),
) -> dict[str, Any]:
    facts = adapter_type(build.engine)
    python = facts.preflight
    if not isinstance(python, PreflightFacts):
        raise PreflightSetupError(f"{build.engine} is no Python engine: the probe has no plan")
    return {
        "standins": list(standins),
        # An engine without the Spark's GPU stood in runs under its own CPU build.
        "gpu": SPARK_GPU if python.spark_gpu else None,
        "engine": build.engine,
        "engine_facts": python.probe.to_json(),
        "package": build.package_dir.strip("/").rsplit("/", 1)[-1],
        "changed": changed,
        "checks": list(checks),
        "signals": facts.preflight_signals(build.version),
        "registry_dir": python.registry_dir,
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
    settings: Settings, prepared: PreparedSource, chosen: ChosenTargets, plan: Mapping[str, object]
) -> dict[str, object]:
    """The unpatched release's imports/registry results, cached: the same release commit,
    dependencies and plan always give the same answer, so warm runs skip it."""
    assert chosen.base is not None
    if chosen.image_id is not None:  # an image's base is judged by its own id each time
        return chosen.base.run(plan)
    # The probe's own code is part of what the answer depends on.
    text = json.dumps(
        [prepared.base_commit, chosen.deps_digest, plan, probe_digest()], sort_keys=True
    )
    key = hashlib.sha256(text.encode()).hexdigest()[:32]
    folder = cachetrust.private_dir(
        settings.cache_dir / "preflight-baselines", "the baseline cache"
    )
    path = folder / f"{key}.json"
    if os.path.lexists(path):
        cached = _cached_baseline(path)
        if cached is not None:
            return cached
    data = chosen.base.run(plan)
    fileio.write_atomic(path, json.dumps(data))
    return data


def _cached_baseline(path: Path) -> dict[str, object] | None:
    """A cached baseline read as a verdict input: a regular file of the user's, written by
    no one else (never a symlink), holding a JSON object; else None, the file removed."""
    why = cachetrust.path_problem(path)
    if why is None and (path.is_symlink() or not path.is_file()):
        why = "is not a regular file"
    if why is None:
        try:
            cached = json.loads(fileio.read_text(path))
        except (OSError, ValueError) as exc:
            why = f"cannot be read as JSON ({exc})"
        else:
            if isinstance(cached, dict):
                return cached
            why = "is not a JSON object"
    cachetrust.discard(path, "the cached baseline", why)
    return None


def with_remedy(check: CheckResult, engine: str) -> CheckResult:
    """A failure the engine raised that is a known signature names the flags that fix it
    (``data/signatures.yaml``), beside the engine's own words."""
    if check.status != "fail" or "fix:" in check.detail:
        return check
    found = diagnose([check.detail], engine)
    if not found:
        return check
    return replace(check, detail=f"{check.detail}; fix: {found[0].remedy}")


def run_preflight(
    settings: Settings,
    prepared: PreparedSource,
    profile_names: list[str],
    where: Where,
) -> PreflightReport:
    """Preflight one prepared build for ``profile_names`` (the build's own when empty): the
    Python engine's boot path under the probe, or a built program's own answers."""
    build = prepared.build
    program = binary_facts(build.engine)
    if program is not None:
        if where.python is not None:
            raise UsageError(
                f"{build.engine} is a built program, not a Python package: --python has no "
                "interpreter to run it under",
                "pass --server PATH (a CPU build of its server), --image or --in-image",
            )
        asked = program_of(program, where.image, where.server)
        return run_binary_preflight(settings, prepared, profile_names, asked)
    if where.server is not None:
        raise UsageError(
            f"--server is for engines that are built programs; {build.engine} is a Python engine",
            "pass --python PATH (an interpreter with the engine), --image or --in-image",
        )
    version = build.version
    profiles = [load_profile_plan(settings, n, build.engine, version) for n in profile_names]
    changed = changed_in_package(prepared)
    chosen = choose_targets(settings, prepared, where, bool(changed))
    unavailable = unavailable_modules(chosen.venv, chosen.kernels)
    checks = [c for c in ("compile", "signals", *PROFILE_CHECKS) if c in where.checks]
    if changed:
        checks += [c for c in ("imports", "registry") if c in where.checks]
    plan = probe_plan(build, changed, profiles, unavailable, tuple(checks), chosen.standins)
    plan["standin_site"] = chosen.standin_site
    data = chosen.target.run(plan)
    base_checks = tuple(c for c in ("imports", "registry") if c in checks)
    base_data = None
    if chosen.base is not None and base_checks:
        base_plan = probe_plan(build, changed, [], unavailable, base_checks, chosen.standins)
        base_plan["standin_site"] = chosen.standin_site
        base_data = _baseline(settings, prepared, chosen, base_plan)
    profile_results = tuple(
        ProfileResult(
            p.name,
            tuple(
                with_remedy(
                    check_from_probe(c, data.get("profiles", {}).get(p.name, {}).get(c)),
                    build.engine,
                )
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
        dependencies=_deps_json(chosen.venv, chosen.kernels, data),
        host=this_host(),
    )


def _deps_json(
    venv: LocalVenv | None, kernels: KernelStandins | None, data: Mapping[str, object]
) -> dict[str, Any]:
    """The venv's dependencies, the kernel stand-ins, and what the probe stood in for."""
    out: dict[str, object] = {}
    if venv is not None:
        out = {**venv.deps.to_json(), "unavailable": list(venv.unavailable)}
        out["venv"] = str(venv.path)
        if venv.layer_over is not None:
            out["venv_layer_over"] = str(venv.layer_over)
    if kernels is not None:
        out["standins"] = kernels.to_json()
    if data.get("native_loads"):
        out["native_loads"] = data["native_loads"]
    return out


def report_json(reports: list[PreflightReport]) -> str:
    return json.dumps([r.to_json() for r in reports], indent=2, sort_keys=True, default=str)
