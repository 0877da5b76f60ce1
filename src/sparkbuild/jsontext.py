"""JSON in and out, strictly: the numbers are finite, the nesting is bounded.

Python's ``json`` reads and writes ``NaN``, ``Infinity`` and ``-Infinity``, which are not JSON:
a figure read that way poisons every comparison it enters, and one written that way breaks
every other consumer (``jq``, browsers, CI). :func:`loads` refuses them (and a document nested
so deeply that parsing it overflows the stack); :func:`dumps` writes a non-finite number as
``null`` (a figure that was not measured) and can never emit one.

A result serialises itself one way: :class:`Fields` gives a frozen dataclass the
``to_json()`` every printer calls, made from its fields by :func:`plain` (a field named
otherwise in the JSON, or left out of it, says so in its ``metadata``: :data:`JSON`). A
result whose JSON is shaped otherwise than its fields (a command's documented ``--json``)
writes that shape in its own ``to_json()``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import PurePath
from typing import Any, NoReturn, TypeAlias

from pydantic import BaseModel

# A JSON document as Python holds it. A result's ``to_json()`` is a :data:`JsonObject`: the
# printers, the lock and the reports get a shape mypy checks, not ``Any``. Sequence and
# Mapping (not list and dict) so a result's ``list[str]`` or ``dict[str, int]`` goes in as it is.
JsonValue: TypeAlias = (
    "str | int | float | bool | Sequence[JsonValue] | Mapping[str, JsonValue] | None"
)
JsonObject: TypeAlias = "dict[str, JsonValue]"

JSON = "json"  # a dataclass field's metadata key: the field's name in the JSON, or None: left out


def _refuse_constant(name: str) -> NoReturn:
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


def nonfinite_field(value: object, where: str = "") -> str | None:
    """Where in ``value`` the first number that is not finite is (``cells[0].ttft_s``):
    ``1e999`` is valid JSON, and Python reads it as infinity."""
    if isinstance(value, float):
        return None if math.isfinite(value) else (where or "(top level)")
    items: list[tuple[str, object]] = []
    if isinstance(value, dict):
        items = [(f"{where}.{key}" if where else str(key), item) for key, item in value.items()]
    elif isinstance(value, list):
        items = [(f"{where}[{n}]", item) for n, item in enumerate(value)]
    for place, item in items:
        found = nonfinite_field(item, place)
        if found is not None:
            return found
    return None


def finite(value: object) -> object:
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


def plain(value: object) -> object:
    """``value`` as JSON-ready data: a dataclass as the mapping of its fields in order (see
    :data:`JSON`), a pydantic model as it dumps itself, sequences as lists, mappings as
    dicts, paths as strings; anything else as it is."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            name: plain(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if (name := f.metadata.get(JSON, f.name)) is not None
        }
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, Mapping):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    return str(value) if isinstance(value, PurePath) else value


class Fields:
    """For a frozen dataclass whose JSON is its fields: ``to_json()`` from :func:`plain`."""

    def to_json(self) -> JsonObject:
        data = plain(self)
        assert isinstance(data, dict), f"{type(self).__name__} is not a dataclass"
        return data


__all__ = [
    "JSON",
    "Fields",
    "JsonObject",
    "JsonValue",
    "dumps",
    "finite",
    "loads",
    "nonfinite_field",
    "plain",
]
