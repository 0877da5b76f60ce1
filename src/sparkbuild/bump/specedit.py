"""Round-trip edits of a spec file: comments, order and flow style survive (ruamel.yaml)."""

from __future__ import annotations

import copy
import io
from pathlib import Path

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.scalarstring import DoubleQuotedScalarString

from sparkbuild.errors import SpecError


def _yaml() -> YAML:
    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.width = 4096  # never re-wrap a long line the author wrote on one line
    yaml.indent(mapping=2, sequence=4, offset=2)
    return yaml


def load(text: str, path: Path) -> CommentedMap:
    try:
        data = _yaml().load(text)
    except Exception as exc:  # ruamel raises many types; the spec loader named the line already
        raise SpecError(f"{path}: cannot be edited: {exc}") from exc
    if not isinstance(data, CommentedMap):
        raise SpecError(f"{path}: expected a mapping at the top level")
    return data


def dump(data: CommentedMap) -> str:
    buffer = io.StringIO()
    _yaml().dump(data, buffer)
    return buffer.getvalue()


def flow_map(**items: object) -> CommentedMap:
    """``{file: ..., when: ...}`` on one line, as the shipped specs write list items."""
    entry = CommentedMap(
        (k, quoted(v) if k == "when" else v) for k, v in items.items() if v is not None
    )
    entry.fa.set_flow_style()
    return entry


def quoted(value: object) -> object:
    """Strings double-quoted, as the shipped specs write `when` ranges."""
    return DoubleQuotedScalarString(value) if isinstance(value, str) else value


def item_list(parent: CommentedMap, key: str) -> CommentedSeq:
    value = parent.get(key)
    if value is None:
        value = CommentedSeq()
        parent[key] = value
    if not isinstance(value, CommentedSeq):
        raise SpecError(f"'{key}' is not a list")
    return value


def set_when(entry: object, when: str | None) -> None:
    if not isinstance(entry, CommentedMap):
        raise SpecError(f"cannot set `when` on {entry!r}")
    if when is None:
        entry.pop("when", None)
    else:
        entry["when"] = quoted(when)


def copy_build(entry: CommentedMap) -> CommentedMap:
    """A deep copy that carries every key, known or not (``requirements`` and the like)."""
    copied = copy.deepcopy(entry)
    assert isinstance(copied, CommentedMap)
    return copied
