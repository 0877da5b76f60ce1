"""Which deep checks a smoke run makes, with what limits, and where lossless gets its
reference from."""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

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
from sparkbuild.engines.targets import Target
from sparkbuild.errors import UsageError

_L = TypeVar("_L")

#: Makes a target of the same engine, image and model with other serve flags (the profile's
#: without speculation); the reference boot of lossless.
ReferenceBoot = Callable[[Sequence[str]], Target]


def reference_url(value: str) -> str:
    """``--reference-url``: an http(s) address of a running engine, without its trailing
    slash (requests append their paths)."""
    parsed = urllib.parse.urlsplit(value)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise UsageError(
            f"--reference-url {value!r} is not an http(s) address",
            "give the engine's base address, e.g. --reference-url http://127.0.0.1:8001",
        )
    return value.rstrip("/")


@dataclass(frozen=True)
class ReferenceSource:
    """Where lossless's reference comes from, in order: a reference recorded for the same
    image id, model and requests (``store`` and ``image_id``); an engine already running
    without speculation (``url``); a second boot (``boot``)."""

    boot: ReferenceBoot | None = None
    url: str | None = None
    store: Path | None = None  # .sparkbuild/smoke-references/


@dataclass(frozen=True)
class DeepPlan:
    """The deep checks of one run and their limits (None: not run)."""

    lossless: LosslessLimits | None = None
    long_output: LongOutputLimits | None = None
    acceptance_per_position: AcceptancePerPositionLimits | None = None
    burn_in: BurnInLimits | None = None
    long_context: LongContextLimits | None = None
    chat: ChatLimits | None = None
    reference: ReferenceSource = field(default_factory=ReferenceSource)
    declared: tuple[str, ...] = ()  # the checks the profile declares (publish requires them)

    @classmethod
    def of(
        cls, expect: Expectations, everything: bool, reference: ReferenceSource | None = None
    ) -> DeepPlan | None:
        """The profile's declared checks; with ``everything`` (``--deep``) every check, the
        undeclared with their defaults. None when there is nothing to run."""

        def pick(given: _L | None, default: _L) -> _L | None:
            return given or (default if everything else None)

        plan = cls(
            lossless=pick(expect.lossless, LosslessLimits()),
            long_output=pick(expect.long_output, LongOutputLimits()),
            acceptance_per_position=pick(
                expect.acceptance_per_position, AcceptancePerPositionLimits()
            ),
            burn_in=pick(expect.burn_in, BurnInLimits()),
            long_context=pick(expect.long_context, LongContextLimits()),
            chat=pick(expect.chat, ChatLimits()),
            reference=reference or ReferenceSource(),
            declared=expect.declared_deep(),
        )
        return plan if plan.checks else None

    @property
    def checks(self) -> tuple[str, ...]:
        """The check names this plan runs, in the order they are reported."""
        return tuple(name for name, attr in DEEP_FIELDS.items() if getattr(self, attr))

    @property
    def ranked(self) -> int:
        """Alternatives per token the smoke's own requests ask for (the lossless run)."""
        return self.lossless.top_logprobs if self.lossless else 0

    @property
    def speculative_phases(self) -> bool:
        """Whether anything runs on the engine after the smoke's own requests."""
        return any(
            (
                self.long_output,
                self.burn_in,
                self.long_context,
                self.chat,
                self.acceptance_per_position,
            )
        )


__all__ = ["DeepPlan", "ReferenceBoot", "ReferenceSource", "reference_url"]
