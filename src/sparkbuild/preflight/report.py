"""Preflight results as plain data: per check, per profile, per build; the JSON form (the
lock's form is :class:`sparkbuild.lockfile.PreflightRun`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sparkbuild.checks import CheckResult, Status, combined
from sparkbuild.engines.host_facts import NodeFacts
from sparkbuild.jsontext import JsonObject

PACKAGE_CHECKS = ("compile", "imports", "registry", "signals")
PROFILE_CHECKS = ("flags", "env", "config")


def check_from_probe(name: str, data: object) -> CheckResult:
    """The probe's answer for check ``name`` (a failure when it gave none that makes sense)."""
    if not isinstance(data, dict) or data.get("status") not in ("pass", "fail", "skip"):
        return CheckResult(name, "fail", f"the probe returned no valid result for {name}")
    detail = str(data.get("detail", ""))
    return CheckResult(name, data["status"], detail, items=tuple(data.get("items", [])))


def _check_json(check: CheckResult) -> JsonObject:
    return {"status": check.status, "detail": check.detail, "items": list(check.items)}


@dataclass(frozen=True)
class ProfileResult:
    profile: str
    checks: tuple[CheckResult, ...]

    @property
    def own_verdict(self) -> Status:
        return combined([c.status for c in self.checks])


@dataclass(frozen=True)
class PreflightReport:
    build: str
    engine: str
    version: str
    where: str  # "venv", "image" or "python"
    tree: str
    deps_digest: str
    package_checks: tuple[CheckResult, ...]
    profiles: tuple[ProfileResult, ...]
    image_id: str | None = None
    versions: dict[str, Any] = field(default_factory=dict)
    dependencies: dict[str, Any] = field(default_factory=dict)
    host: NodeFacts | None = None  # the machine preflight ran on

    def verdict_for(self, profile: ProfileResult) -> Status:
        """A profile's verdict includes the build-wide checks (its image runs that code)."""
        return combined([c.status for c in (*self.package_checks, *profile.checks)])

    @property
    def verdict(self) -> Status:
        if not self.profiles:
            return combined([c.status for c in self.package_checks])
        return combined([self.verdict_for(p) for p in self.profiles])

    @property
    def key(self) -> str:
        return f"{self.tree}+{self.deps_digest}"

    def failures(self) -> list[str]:
        return self._lines("fail", "")

    def skips(self) -> list[str]:
        """The checks that could not run here, each with its reason."""
        return self._lines("skip", "skip: ")

    def _lines(self, status: Status, prefix: str) -> list[str]:
        lines = [f"{c.name}: {prefix}{c.detail}" for c in self.package_checks if c.status == status]
        for profile in self.profiles:
            lines += [
                f"{profile.profile} {c.name}: {prefix}{c.detail}"
                for c in profile.checks
                if c.status == status
            ]
        return lines

    def reasons(self) -> list[str]:
        """Why the verdict is not ``pass``: every failure, then every skip."""
        return [*self.failures(), *self.skips()]

    def to_json(self) -> JsonObject:
        return {
            "build": self.build,
            "engine": self.engine,
            "version": self.version,
            "where": self.where,
            "tree": self.tree,
            "deps_digest": self.deps_digest,
            "image_id": self.image_id,
            "verdict": self.verdict,
            "versions": self.versions,
            "dependencies": self.dependencies,
            "host": self.host.to_json() if self.host else None,
            "checks": {c.name: _check_json(c) for c in self.package_checks},
            "profiles": {
                p.profile: {
                    "verdict": self.verdict_for(p),
                    "checks": {c.name: _check_json(c) for c in p.checks},
                }
                for p in self.profiles
            },
        }


__all__ = [
    "PACKAGE_CHECKS",
    "PROFILE_CHECKS",
    "PreflightReport",
    "ProfileResult",
    "check_from_probe",
]
