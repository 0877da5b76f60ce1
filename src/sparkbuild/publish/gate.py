"""What must hold before an image is published: the lock pins it, and every profile the
build lists has a verified passing smoke verdict for that exact image id."""

from __future__ import annotations

from typing import Any

from sparkbuild import console
from sparkbuild import lock as lockfile
from sparkbuild.errors import LockError, SparkbuildError
from sparkbuild.settings import Settings
from sparkbuild.spec import Build


def pinned_image(settings: Settings, build: Build) -> dict[str, Any]:
    entry = lockfile.build_entry(lockfile.load(settings.lock_file), build.name) or {}
    image = entry.get("image")
    if not isinstance(image, dict) or not image.get("image_id") or not image.get("tree"):
        raise LockError(
            f"{build.name}: {settings.lock_file.name} pins no image for it; nothing to publish",
            f"`sparkbuild build {build.name}`, then smoke it with "
            f"`sparkbuild smoke --image IMAGE --profile P --record {build.name}`",
        )
    return image


def _counted_verdict(result: Any, image_id: str) -> str:
    """'pass' only for a verified run of ``image_id``; otherwise what the record says."""
    verdict = result.get("verdict") if isinstance(result, dict) else None
    if not verdict:
        return "missing"
    if verdict == "pass" and not (
        result.get("verified") is True and result.get("image_id") == image_id
    ):
        return f"unverified pass ({result.get('target') or 'unknown target'})"
    return str(verdict)


def smoke_verdicts(settings: Settings, build: Build, image_id: str) -> dict[str, str]:
    """profile -> verdict for every profile the build lists: 'pass' (a verified run of this
    image), 'fail', 'missing', or 'unverified pass (TARGET)' (a command or URL run)."""
    entry = lockfile.build_entry(lockfile.load(settings.lock_file), build.name) or {}
    section = entry.get("smoke")
    recorded = section.get(image_id) if isinstance(section, dict) else None
    recorded = recorded if isinstance(recorded, dict) else {}
    return {p: _counted_verdict(recorded.get(p), image_id) for p in build.smoke_profiles}


def smoke_gate(settings: Settings, build: Build, image_id: str, *, force: bool) -> bool:
    """Whether the image passed every profile; refuses (or with ``force`` warns) otherwise."""
    short = image_id[:19]
    if not build.smoke_profiles:
        problem = (
            f"{build.name}: the build lists no smoke profiles (`smoke:` in "
            f"{build.spec_file.name}), so nothing proves image {short} works"
        )
        hint = f"add `smoke: [PROFILE]` to build '{build.name}' and record a run"
    else:
        verdicts = smoke_verdicts(settings, build, image_id)
        failing = {p: v for p, v in verdicts.items() if v != "pass"}
        if not failing:
            return True
        listed = ", ".join(f"{p}: {v}" for p, v in failing.items())
        problem = f"{build.name}: image {short} has no passing smoke verdict ({listed})"
        profile = next(iter(failing))
        hint = (
            f"`sparkbuild smoke --image IMAGE --profile {profile} --record {build.name}` "
            "records one (command and URL runs are recorded unverified and do not count)"
        )
    if not force:
        raise SparkbuildError(problem, hint + "; --force publishes anyway, recorded unverified")
    console.warn(f"{problem}\n--force: PUBLISHING AN UNVERIFIED IMAGE; the lock records it as such")
    return False
