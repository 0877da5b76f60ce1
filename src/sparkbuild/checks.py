"""A check's result, shared by the stages that judge a build: preflight and smoke; and the
statuses the stages settle on, which the lock records.

A check returns a :class:`CheckResult`; it does not print or exit. Each stage's report owns
how its checks are shown (smoke lists them with their measured ``value``; preflight keys them
by name with the offending ``items``); the lock records only their statuses.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

Status = Literal["pass", "fail", "skip"]
# A verdict that cannot be skipped: a smoke run passes or fails.
Verdict = Literal["pass", "fail"]
# What the source stage concluded about a PR, patch or source step (see sparkbuild.source):
# declared before every stage, as the lock records it and the source stage makes it.
ItemStatus = Literal["applied", "upstream", "out-of-range", "conflict", "missing", "invalid"]


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: Status
    detail: str
    value: Any = None  # what the check measured (smoke: accept_len, counts)
    items: tuple[Any, ...] = ()  # what it found, one entry per module or class (preflight)


def combined(statuses: Iterable[Status]) -> Status:
    """Any fail fails; otherwise any skip is a skip (never a pass); else pass."""
    seen = set(statuses)
    if "fail" in seen:
        return "fail"
    return "skip" if "skip" in seen else "pass"


__all__ = ["CheckResult", "ItemStatus", "Status", "Verdict", "combined"]
