"""Preflight results as plain data: per check, per profile, per build; JSON and lock forms."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Status = Literal["pass", "fail", "skip"]
PACKAGE_CHECKS = ("compile", "imports", "registry", "signals")
PROFILE_CHECKS = ("flags", "env", "config")


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: Status
    detail: str
    items: tuple[Any, ...] = ()

    @classmethod
    def from_probe(cls, name: str, data: Any) -> CheckResult:
        if not isinstance(data, dict) or data.get("status") not in ("pass", "fail", "skip"):
            return cls(name, "fail", f"the probe returned no valid result for {name}")
        return cls(name, data["status"], str(data.get("detail", "")), tuple(data.get("items", [])))

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "detail": self.detail, "items": list(self.items)}


def combined(statuses: list[Status]) -> Status:
    """Any fail fails; otherwise any skip is a skip (never a pass); else pass."""
    if "fail" in statuses:
        return "fail"
    return "skip" if "skip" in statuses else "pass"


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
        lines = [f"{c.name}: {c.detail}" for c in self.package_checks if c.status == "fail"]
        for profile in self.profiles:
            lines += [
                f"{profile.profile} {c.name}: {c.detail}"
                for c in profile.checks
                if c.status == "fail"
            ]
        return lines

    def to_json(self) -> dict[str, Any]:
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
            "checks": {c.name: c.to_json() for c in self.package_checks},
            "profiles": {
                p.profile: {
                    "verdict": self.verdict_for(p),
                    "checks": {c.name: c.to_json() for c in p.checks},
                }
                for p in self.profiles
            },
        }

    def lock_value(self) -> dict[str, Any]:
        """What ``builds.<name>.preflight.<tree>+<deps>`` holds: verdicts, not the details."""
        value: dict[str, Any] = {
            "where": self.where,
            "tree": self.tree,
            "deps_digest": self.deps_digest,
            "versions": {k: v for k, v in self.versions.items() if v},
            "checks": {c.name: c.status for c in self.package_checks},
            "profiles": {
                p.profile: {
                    "verdict": self.verdict_for(p),
                    "checks": {c.name: c.status for c in p.checks},
                }
                for p in self.profiles
            },
        }
        if self.image_id:
            value["image_id"] = self.image_id
        return value


__all__ = [
    "PACKAGE_CHECKS",
    "PROFILE_CHECKS",
    "CheckResult",
    "PreflightReport",
    "ProfileResult",
    "Status",
    "combined",
]
