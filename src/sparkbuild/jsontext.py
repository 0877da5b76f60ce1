"""JSON in and out, strictly: the numbers are finite, the nesting is bounded.

Python's ``json`` reads and writes ``NaN``, ``Infinity`` and ``-Infinity``, which are not JSON:
a figure read that way poisons every comparison it enters, and one written that way breaks
every other consumer (``jq``, browsers, CI). :func:`loads` refuses them (and a document nested
so deeply that parsing it overflows the stack); :func:`dumps` writes a non-finite number as
``null`` (a figure that was not measured) and can never emit one.
"""

from __future__ import annotations

import json
import math
from typing import Any


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def loads(text: str | bytes, *, nonfinite: bool = False) -> Any:
    """Parse JSON; ``ValueError`` for anything that is not strict JSON, including NaN and
    Infinity (unless ``nonfinite``: an engine's NaN logprob is a finding, not garbage) and
    documents nested too deeply to parse."""
    try:
        if nonfinite:
            return json.loads(text)
        return json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def finite(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None (JSON ``null``)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite(item) for item in value]
    return value


def dumps(value: Any, **options: Any) -> str:
    """``json.dumps`` of :func:`finite` ``(value)``: never ``NaN`` or ``Infinity``."""
    return json.dumps(finite(value), allow_nan=False, **options)


__all__ = ["dumps", "finite", "loads"]
