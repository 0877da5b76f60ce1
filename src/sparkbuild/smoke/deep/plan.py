"""Which deep checks a smoke run makes, with what limits, and where lossless gets its
reference from."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import SplitResult, urlsplit

from pydantic import BaseModel

from sparkbuild.engines.profiles import (
    DEEP_FIELDS,
    AcceptancePerPositionLimits,
    BurnInLimits,
    ChatLimits,
    Expectations,
    LongContextLimits,
    LongOutputLimits,
    LosslessLimits,
)
from sparkbuild.engines.targets import Target, engine_base_url

#: Makes a target of the same engine, image and model with other serve flags (the profile's
#: without speculation); the reference boot of lossless.
ReferenceBoot = Callable[[Sequence[str]], Target]


def reference_url(value: str) -> str:
    """``--reference-url``: the base URL of a running engine (as ``--url``)."""
    return engine_base_url(value, "--reference-url")


_LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1", "0.0.0.0", "::"})


def same_engine(url: str, other: str) -> bool:
    """Whether two base URLs reach the same engine: the same port on the same host, any
    name of this machine's loopback counting as one."""
    first, second = urlsplit(url), urlsplit(other)
    return _host(first.hostname) == _host(second.hostname) and _port(first) == _port(second)


def _host(name: str | None) -> str:
    lowered = (name or "").lower().rstrip(".")
    return "loopback" if lowered in _LOOPBACK or lowered.startswith("127.") else lowered


def _port(parts: SplitResult) -> int | None:
    try:
        return parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None


@dataclass(frozen=True)
class ReferenceSource:
    """Where lossless's reference comes from, in order: a reference recorded for the same
    image id, model and requests (``store`` and ``image_id``); an engine already running
    without speculation (``url``); a second boot (``boot``)."""

    boot: ReferenceBoot | None = None
    url: str | None = None
    store: Path | None = None  # .sparkbuild/smoke-references/


#: The limits a check takes when ``--deep`` runs it undeclared.
_DEFAULTS: dict[str, type[BaseModel]] = {
    "lossless": LosslessLimits,
    "long_output": LongOutputLimits,
    "acceptance_per_position": AcceptancePerPositionLimits,
    "burn_in": BurnInLimits,
    "long_context": LongContextLimits,
    "chat": ChatLimits,
}


@dataclass(frozen=True)
class DeepPlan:
    """The deep checks of one run: the profile's ``expect`` with each check to run set (its
    declared limits, or the defaults under ``--deep``) and the others None."""

    limits: Expectations
    reference: ReferenceSource = field(default_factory=ReferenceSource)
    declared: tuple[str, ...] = ()  # the checks the profile declares (publish requires them)

    @classmethod
    def of(
        cls, expect: Expectations, everything: bool, reference: ReferenceSource | None = None
    ) -> DeepPlan | None:
        """The profile's declared checks; with ``everything`` (``--deep``) every check, the
        undeclared with their defaults. None when there is nothing to run."""
        limits = expect
        if everything:
            filled = {name: getattr(expect, name) or kind() for name, kind in _DEFAULTS.items()}
            limits = expect.model_copy(update=filled)
        plan = cls(limits, reference or ReferenceSource(), expect.declared_deep())
        return plan if plan.checks else None

    @property
    def checks(self) -> tuple[str, ...]:
        """The check names this plan runs, in the order they are reported."""
        return tuple(name for name, attr in DEEP_FIELDS.items() if getattr(self.limits, attr))

    @property
    def ranked(self) -> int:
        """Alternatives per token the smoke's own requests ask for: they are lossless's
        speculative run and burn-in's round 1."""
        lossless, burn_in = self.limits.lossless, self.limits.burn_in
        return max(lossless.top_logprobs if lossless else 0, burn_in.top_logprobs if burn_in else 0)

    @property
    def seed(self) -> int | None:
        """The seed the smoke's own requests carry when lossless or burn-in replays them."""
        lossless = self.limits.lossless
        if lossless is None and self.limits.burn_in is None:
            return None
        return lossless.seed if lossless else 0


__all__ = ["DeepPlan", "ReferenceBoot", "ReferenceSource", "reference_url", "same_engine"]
