"""Preflight: run the engine's own Python boot path on the CPU, before any GPU.

For a build and each profile it lists, a probe (``data/preflight/probe.py``) runs under the
target interpreter, in a cached local venv (the patched tree over the release's own
dependencies) or inside the built image with no GPU, and checks:

* compile: every changed file compiles;
* imports: every changed module and every module importing one imports; the model registry
  has no more failing classes than the unpatched release;
* signals: every metric and response field the smoke/bench adapters rely on exists;
* flags / env / config, per profile: the engine's parser takes every flag, every variable
  the profile sets is read by that version, and the server config builds from the flags
  against a config-only model directory, including the reserved-token computation, the
  speculative defaults and the draft config loading.

See docs/preflight.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from sparkbuild import git
from sparkbuild.errors import SparkbuildError
from sparkbuild.preflight.deps import dependency_set, wheel_requirements
from sparkbuild.preflight.plan import (
    REGISTRY_DIRS,
    UNAVAILABLE_MODULES,
    ProfilePlan,
    load_profile_plan,
)
from sparkbuild.preflight.report import (
    PACKAGE_CHECKS,
    PROFILE_CHECKS,
    CheckResult,
    PreflightReport,
    ProfileResult,
)
from sparkbuild.preflight.runner import ImageTarget, LocalTarget, ProbeTarget
from sparkbuild.preflight.signals import signals_for
from sparkbuild.preflight.venv import LocalVenv, ensure_venv
from sparkbuild.settings import Settings
from sparkbuild.source import PreparedSource
from sparkbuild.spec import Build

SECTION = "preflight"
ALL_CHECKS = (*PACKAGE_CHECKS, *PROFILE_CHECKS)


@dataclass(frozen=True)
class Where:
    """Where to run: the built ``image``, a given ``python``, or (neither) a cached venv."""

    image: str | None = None
    python: Path | None = None
    docker: str = "docker"
    venv_root: Path | None = None
    wheel: Path | None = None  # the engine release's wheel (read for its Requires-Dist)
    tree: bool = False  # put the prepared tree over a given interpreter's installed package
    image_python: str = "python3"  # the interpreter inside the image
    docker_args: tuple[str, ...] = ()  # more `docker run` options for the image
    checks: tuple[str, ...] = ALL_CHECKS


def build_pins(build: Build) -> list[str]:
    """The build's own ``requirements:`` pins for its version (spec field, when present)."""
    active = getattr(build, "active_requirements", None)
    items = active() if callable(active) else getattr(build, "requirements", ())
    return [str(getattr(item, "req", item)) for item in items or ()]


def changed_in_package(prepared: PreparedSource) -> list[str]:
    """Changed files that still exist, relative to the engine's package directory."""
    prefix = prepared.build.package_dir.strip("/") + "/"
    return [
        c.path[len(prefix) :]
        for c in prepared.changed
        if c.path.startswith(prefix) and c.status != "D"
    ]


def export_tree(prepared: PreparedSource, commit_or_tree: str, cache: Path) -> Path:
    """The tree's package directory on disk (cached by object id); returns its parent."""
    dest = cache / "preflight-trees" / commit_or_tree
    package_dir = prepared.build.package_dir.strip("/")
    if not (dest / package_dir).is_dir():
        tmp = dest.with_name(dest.name + ".tmp")
        subprocess.run(["rm", "-rf", str(tmp)], check=True)
        tmp.mkdir(parents=True)
        archive = git.run(
            ["archive", "--format=tar", commit_or_tree, "--", package_dir],
            git_dir=prepared.mirror,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
        tmp.rename(dest)
    return (dest / package_dir).parent


def release_wheel(settings: Settings, build: Build) -> Path:
    """The engine release's linux/aarch64 CPython 3.11 wheel (downloaded once)."""
    wheels = settings.cache_dir / "wheels"
    found = sorted(wheels.glob(f"{build.engine}-{build.version}-*.whl"))
    if found:
        return found[0]
    wheels.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    cmd += ["--platform", "manylinux_2_34_aarch64", "--python-version", "3.11"]
    cmd += ["--implementation", "cp", "--abi", "cp311", "--quiet", "-d", str(wheels)]
    cmd.append(f"{build.engine}=={build.version}")
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    found = sorted(wheels.glob(f"{build.engine}-{build.version}-*.whl"))
    if done.returncode != 0 or not found:
        raise SparkbuildError(
            f"{build.name}: cannot download the {build.engine} {build.version} wheel "
            f"for its dependency list:\n{done.stderr[-1500:]}",
            "preflight inside the built image instead: sparkbuild preflight BUILD --image IMAGE",
        )
    return found[0]


def local_venv(settings: Settings, build: Build, where: Where) -> LocalVenv:
    if build.engine != "sglang":
        raise SparkbuildError(
            f"{build.name}: a local venv is made for SGLang builds only; {build.engine} needs "
            "its own CPU build",
            f"pass --python PATH (a venv with {build.engine} for the CPU) or --image IMAGE",
        )
    wheel = where.wheel or release_wheel(settings, build)
    deps = dependency_set(
        build.engine, str(build.version), wheel_requirements(wheel), build_pins(build)
    )
    root = where.venv_root or settings.cache_dir / "preflight-venvs"
    return ensure_venv(root, deps)


def unavailable_modules(venv: LocalVenv | None) -> dict[str, str]:
    modules = dict(UNAVAILABLE_MODULES)
    for requirement in venv.unavailable if venv else ():
        name = canonicalize_name(
            requirement.split(";")[0].split("=")[0].split("<")[0].split(">")[0]
        )
        modules[name.replace("-", "_")] = name
    return modules


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


def image_id_of(image: str, docker: str) -> str:
    done = subprocess.run(
        [docker, "image", "inspect", "--format", "{{.Id}}", image],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SparkbuildError(
            f"image {image} is not in the local Docker store",
            "build it first (`sparkbuild build BUILD`) or pull it",
        )
    return done.stdout.strip()


def _compare(patched: CheckResult, base: CheckResult | None, what: str) -> CheckResult:
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
                patched.items,
            )
        lines = [_registry_line(i) for i in new]
        return CheckResult(
            "registry",
            "fail",
            f"{len(new)} model module(s) newly fail to import against the release: "
            + "; ".join(lines),
            tuple(new),
        )
    return _compare_imports(patched, base_failing)


def _failure_key(item: dict[str, Any]) -> tuple[Any, ...]:
    """The same failure in two trees: module and what is missing, paths left out (the
    patched and the unpatched tree sit in different directories)."""
    error = re.sub(r"\([^()]*/[^()]*\)", "", str(item.get("error", "")))
    return (item.get("module"), item.get("missing_module"), item.get("missing_name"), error)


def _import_line(item: dict[str, Any]) -> str:
    if item.get("missing_name"):
        return (
            f"{item['module']} imports name {item['missing_name']!r} that "
            f"{item.get('from_module')} does not have (a prerequisite change is missing)"
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
        return CheckResult("imports", "fail", detail, tuple(items))
    same = sum(bool(i.get("pre_existing")) for i in items)
    needs = sorted({str(i["unavailable_package"]) for i in items if i.get("unavailable_package")})
    if needs:
        return CheckResult(
            "imports",
            "skip",
            f"{len(items)} module(s) checked; {same} fail in the unpatched release too; some "
            f"need packages not installable on this CPU: {', '.join(needs)}",
            tuple(items),
        )
    return CheckResult(
        "imports",
        "pass",
        f"{len(items)} module(s) checked; the {same} that fail also fail in the unpatched release",
        tuple(items),
    )


@dataclass(frozen=True)
class _Targets:
    target: ProbeTarget
    base: ProbeTarget | None  # the unpatched release, for the imports/registry comparison
    deps_digest: str
    venv: LocalVenv | None = None
    image_id: str | None = None


def _targets(settings: Settings, prepared: PreparedSource, where: Where, changed: bool) -> _Targets:
    build = prepared.build
    if where.image:
        image_id = image_id_of(where.image, where.docker)
        platform = build.image.platform
        base_image = build.image.base_image if changed else None

        def in_image(reference: str) -> ImageTarget:
            return ImageTarget(
                reference,
                docker=where.docker,
                platform=platform,
                python=where.image_python,
                extra_args=where.docker_args,
            )

        return _Targets(
            in_image(where.image),
            in_image(base_image) if base_image else None,
            image_id,
            image_id=image_id,
        )
    venv = None
    if where.python is not None:
        python, digest, kind = where.python, _python_digest(where.python), "python"
    else:
        venv = local_venv(settings, build, where)
        python, digest, kind = venv.python, venv.deps.digest, "venv"
    # A venv we made holds no engine package: the tree stands in for it. A given interpreter
    # has the engine installed; the tree goes over it only when something changed.
    use_tree = changed or kind == "venv" or where.tree
    root = export_tree(prepared, prepared.tree, settings.cache_dir) if use_tree else None
    base = None
    if changed:
        base_root = export_tree(prepared, prepared.base_commit, settings.cache_dir)
        base = LocalTarget(python, base_root, where=kind)
    return _Targets(LocalTarget(python, root, where=kind), base, digest, venv=venv)


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
        result = CheckResult.from_probe(name, data["checks"][name])
        if name in ("imports", "registry"):
            base = base_data["checks"].get(name) if base_data else None
            result = _compare(result, CheckResult.from_probe(name, base) if base else None, name)
        results.append(result)
    return results


def _baseline(
    settings: Settings, prepared: PreparedSource, chosen: _Targets, plan: dict[str, Any]
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
    chosen = _targets(settings, prepared, where, bool(changed))
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
                CheckResult.from_probe(c, data.get("profiles", {}).get(p.name, {}).get(c))
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


def _python_digest(python: Path) -> str:
    """A given interpreter's dependency set: the digest of its `pip freeze`."""
    done = subprocess.run(
        [str(python), "-m", "pip", "freeze", "--all"], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SparkbuildError(f"{python} is not a Python with pip", "pass a venv's bin/python")
    lines = sorted(line for line in done.stdout.splitlines() if line.strip())
    return "sha256:" + hashlib.sha256("\n".join(lines).encode()).hexdigest()


def record(settings: Settings, report: PreflightReport) -> None:
    """``builds.<build>.preflight.<tree>+<deps>``; other keys (and, under the same key, the
    verdicts of profiles this run did not check) stay."""
    from sparkbuild import lockfile

    run = lockfile.PreflightRun.model_validate(report.lock_value())

    def change(entry: lockfile.BuildEntry) -> None:
        runs = entry.preflight or {}
        earlier = runs.get(report.key)
        if earlier is not None and "profiles" in earlier.model_fields_set:
            # Same tree and dependencies: a run of other profiles adds to the verdicts.
            run.profiles = {**earlier.profiles, **run.profiles}
        entry.preflight = {**runs, report.key: run}

    lockfile.update_entry(settings.lock_file, report.build, change)


def report_json(reports: list[PreflightReport]) -> str:
    return json.dumps([r.to_json() for r in reports], indent=2, sort_keys=True, default=str)


__all__ = [
    "SECTION",
    "PreflightReport",
    "Where",
    "build_pins",
    "changed_in_package",
    "record",
    "run_preflight",
]
