"""What an engine version reads, in engine-neutral terms: its NaN switch, a version from a
label or a server answer, and a fact read from the releases around a version.

Each engine's own facts by release live in its adapter's module (``adapters/``), cited
from the release files they were read from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from packaging.version import InvalidVersion, Version


@dataclass(frozen=True)
class NanSwitch:
    """How to turn on an engine version's own NaN detection, and what it then signals."""

    env: Mapping[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ()
    signal: str = ""  # one line for the smoke report

    @property
    def active(self) -> bool:
        return bool(self.env or self.args)

    def describe(self) -> str:
        what = [f"{k}={v}" for k, v in self.env.items()] + list(self.args)
        return f"{' '.join(what)}: {self.signal}" if what else self.signal


#: The image label sparkbuild (and upstream images built with OCI labels) carry the version in.
VERSION_LABEL = "org.opencontainers.image.version"
UNKNOWN_VERSION = NanSwitch(signal="engine version unknown: no NaN switch set")


def parse_version(text: str | None) -> Version | None:
    """A PEP 440 version from a label or server answer ('v0.5.12', '0.5.12.post1'), else None."""
    if not text:
        return None
    try:
        return Version(text.strip().lstrip("v"))
    except InvalidVersion:
        return None


def disagree(declared: str | None, served: str | None) -> bool:
    """Whether the version an image declares and the one its server reports name different
    releases (a local tag such as ``+cpu`` is the same release)."""
    ours, theirs = parse_version(declared), parse_version(served)
    if ours is None or theirs is None:
        return bool(declared and served and declared.strip() != served.strip())
    return ours.public != theirs.public


@dataclass(frozen=True)
class LoadFormatFact:
    """Whether an engine release loads weights by ``--load-format NAME``: True, False, or
    None when the releases read around it disagree (so the version in between is not known)."""

    known: bool | None
    detail: str
