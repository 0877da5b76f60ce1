"""Loading YAML files for pydantic models, with errors that name file, line and field.

Used for build specs and smoke profiles alike.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from types import UnionType
from typing import Any, TypeVar, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from sparkbuild.errors import SpecError

Model = TypeVar("Model", bound=BaseModel)
Location = tuple[str | int, ...]


def _node_lines(node: yaml.Node, path: Location, lines: dict[Location, int]) -> None:
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value
            lines[(*path, key)] = key_node.start_mark.line + 1
            _node_lines(value_node, (*path, key), lines)
            lines[(*path, key)] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _node_lines(item, (*path, index), lines)


def read_yaml(path: Path) -> tuple[Any, dict[Location, int]]:
    """Parsed data and the line of every key and list item."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise SpecError(f"{path}: no such file") from exc
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError(f"{where}: malformed YAML: {problem}") from exc
    lines: dict[Location, int] = {}
    if node is not None:
        _node_lines(node, (), lines)
    return data, lines


def _line_for(loc: Location, lines: dict[Location, int]) -> int | None:
    for end in range(len(loc), -1, -1):
        if loc[:end] in lines:
            return lines[loc[:end]]
    return None


def _field_name(loc: Location) -> str:
    parts: list[str] = []
    for part in loc:
        if isinstance(part, int):
            parts.append(f"[{part}]")
        else:
            parts.append(("." if parts else "") + str(part))
    return "".join(parts) or "(top level)"


def _unwrap_optional(annotation: Any) -> Any:
    args = [arg for arg in get_args(annotation) if arg is not type(None)]
    if get_origin(annotation) in (Union, UnionType) and len(args) == 1:
        return args[0]
    return annotation


def _known_fields(model: type[BaseModel], loc: Location) -> list[str]:
    """Field names allowed at ``loc`` (the parent of an unknown key), for did-you-mean."""
    annotation: Any = model
    for part in loc:
        annotation = _unwrap_optional(annotation)
        if get_origin(annotation) in (list, dict):
            annotation = get_args(annotation)[-1]  # the part is a list index or a dict key
        elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
            field = annotation.model_fields.get(str(part))
            if field is None:
                return []
            annotation = field.annotation
        else:
            return []
    annotation = _unwrap_optional(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return list(annotation.model_fields)
    return []


def _describe(error: Any, model: type[BaseModel], path: Path, lines: dict[Location, int]) -> str:
    loc: Location = tuple(error["loc"])
    line = _line_for(loc, lines)
    where = f"{path}:{line}" if line else str(path)
    field = _field_name(loc)
    if error["type"] == "extra_forbidden":
        known = _known_fields(model, loc[:-1])
        close = difflib.get_close_matches(str(loc[-1]), known, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        allowed = f" (known: {', '.join(sorted(known))})" if known and not close else ""
        return f"{where}: unknown field '{field}'{hint}{allowed}"
    return f"{where}: {field}: {error['msg']}"


def load_model(path: Path, model: type[Model], context: dict[str, Any] | None = None) -> Model:
    """Validate a YAML file into ``model``; every problem is reported with file and line."""
    data, lines = read_yaml(path)
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping at the top level, found {type(data).__name__}")
    try:
        return model.model_validate(data, context=context)
    except ValidationError as exc:
        problems = [_describe(error, model, path, lines) for error in exc.errors()]
        raise SpecError("\n".join(problems)) from exc
