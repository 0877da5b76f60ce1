"""Option types shared by the commands (after pip's cmdoptions): each check defined once."""

from __future__ import annotations

import math
from typing import Any

import click


class FiniteFloat(click.FloatRange):
    """A float range that also refuses NaN and infinity: ``--boot-timeout nan`` would
    otherwise wait forever, and ``inf`` is never a bound."""

    name = "finite float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if isinstance(number, float) and not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


SECONDS = FiniteFloat(min=1)
