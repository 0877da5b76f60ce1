"""Record a preflight verdict for a build's pinned image through preflight's own recorder
(as `sparkbuild preflight BUILD --image IMAGE --record` does), for publication tests."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from sparkbuild import lockfile
from sparkbuild.checks import CheckResult
from sparkbuild.preflight import record
from sparkbuild.preflight.report import PreflightReport, ProfileResult
from sparkbuild.settings import Settings


def record_preflight(
    lock_path: Path,
    build: str,
    profile: str,
    verdict: Literal["pass", "fail", "skip"] = "pass",
    *,
    where: str = "image",
) -> str:
    image = lockfile.read_entry(lock_path, build).image or lockfile.ImageSection()
    image_id = str(image.image_id)
    report = PreflightReport(
        build=build,
        engine="sglang",
        version="0.0.0",
        where=where,
        tree=image.tree or "0" * 40,
        deps_digest=image_id if where == "image" else "sha256:" + "c" * 64,
        package_checks=(CheckResult("compile", "pass", "recorded by the tests"),),
        profiles=(ProfileResult(profile, (CheckResult("config", verdict, "recorded"),)),),
        image_id=image_id if where == "image" else None,
    )
    record(Settings(project_dir=lock_path.parent, lock_path=lock_path), report)
    return image_id
