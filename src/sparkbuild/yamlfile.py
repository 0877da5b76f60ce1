"""Loading YAML files for pydantic models, with errors that name file, line and field, and
the one way sparkbuild writes YAML (:func:`dump_yaml`).

Used for build specs, smoke profiles, claims and cluster files alike.
"""

from __future__ import annotations

import contextlib
import difflib
import gc
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from types import UnionType
from typing import TypeVar, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from sparkbuild import fileio
from sparkbuild.errors import BadYAMLError, SpecError, UsageError

Model = TypeVar("Model", bound=BaseModel)
Location = tuple[str | int, ...]


def node_lines(node: yaml.Node, path: Location, lines: dict[Location, int]) -> None:
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value
            lines[(*path, key)] = key_node.start_mark.line + 1
            node_lines(value_node, (*path, key), lines)
            lines[(*path, key)] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            node_lines(item, (*path, index), lines)


class _NoAliasLoader(yaml.SafeLoader):
    """SafeLoader that refuses aliases: ``*name`` is how a 600-byte file becomes gigabytes
    (an alias bomb) or a structure that contains itself. Our files never need them."""

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise yaml.composer.ComposerError(
                None,
                None,
                f"aliases (*{event.anchor}) are not allowed in sparkbuild files",
                event.start_mark,
            )
        return super().compose_node(parent, index)


def _check_duplicate_keys(node: yaml.Node) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: dict[object, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            line = key_node.start_mark.line + 1
            if key is not None and key in seen:
                raise BadYAMLError(
                    f"duplicate key '{key}' (first defined on line {seen[key]})", line
                )
            if key is not None:
                seen[key] = line
            _check_duplicate_keys(value_node)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _check_duplicate_keys(item)


# Deeper than any file sparkbuild reads; deeper documents take the pure-Python path, which
# stops at Python's recursion limit instead of libyaml's C stack.
_FAST_DEPTH = 64


def _plain_for_libyaml(text: str) -> bool:
    """Whether libyaml may compose ``text``: no aliases, nesting bounded. One pass over the
    events, in C, so a lock of 50 builds parses about 5x faster than in pure Python."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.CSafeLoader):
        if isinstance(event, yaml.AliasEvent):
            return False
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > _FAST_DEPTH:
                return False
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
    return True


def _parse_with_libyaml(text: str) -> tuple[object, yaml.Node | None] | None:
    """The document through libyaml, or None when the pure-Python loader must decide (no
    libyaml, an alias, deep nesting, or any error: its messages and lines are the ones we show)."""
    if not yaml.__with_libyaml__:
        return None
    try:
        if not _plain_for_libyaml(text):
            return None
        loader = yaml.CSafeLoader(text)
        try:
            node = loader.get_single_node()
            if node is not None:
                _check_duplicate_keys(node)
            return (loader.construct_document(node) if node is not None else None), node
        finally:
            loader.dispose()
    except (yaml.YAMLError, BadYAMLError, RecursionError):
        return None


@contextlib.contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """A parse allocates a node, two marks and a value per scalar, all alive until it returns:
    the cyclic collector would walk that growing heap again and again for nothing (a third
    of a 50-build lock's parse). Any cycle the parse leaves is collected once it is back on."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def parse_yaml(raw: bytes) -> tuple[object, yaml.Node | None]:
    """Data and node tree of a YAML document: UTF-8 only, no aliases, no duplicate keys."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise BadYAMLError(f"not UTF-8 text (byte 0x{raw[exc.start]:02x})", line) from exc
    with _no_cyclic_gc():
        return _parse(text)


def _parse(text: str) -> tuple[object, yaml.Node | None]:
    parsed = _parse_with_libyaml(text)
    if parsed is not None:
        return parsed
    try:
        loader = _NoAliasLoader(text)  # its reader refuses a control character (NUL) at once
    except yaml.reader.ReaderError as exc:  # the position of the character, as a line
        line = text.count("\n", 0, exc.position) + 1
        raise BadYAMLError(f"malformed YAML: {exc.reason} (#x{exc.character:04x})", line) from exc
    try:
        node = loader.get_single_node()
        if node is not None:
            _check_duplicate_keys(node)
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        raise BadYAMLError(f"malformed YAML: {problem}", mark.line + 1 if mark else None) from exc
    except RecursionError as exc:
        raise BadYAMLError("malformed YAML: nested too deeply") from exc
    finally:
        loader.dispose()
    return data, node


def read_yaml(path: Path) -> tuple[object, dict[Location, int]]:
    """Parsed data and the line of every key and list item."""
    try:
        raw = fileio.read_bytes(path)  # a FIFO, a device or a huge file is refused, not read
    except FileNotFoundError as exc:
        raise SpecError(f"{path}: no such file") from exc
    except IsADirectoryError as exc:
        raise SpecError(f"{path}: is a directory, not a YAML file", "rename or remove it") from exc
    except OSError as exc:
        raise SpecError(
            f"{path}: cannot read: {fileio.reason(exc)}", "point it at a YAML file"
        ) from exc
    try:
        data, node = parse_yaml(raw)
    except BadYAMLError as exc:
        where = f"{path}:{exc.line}" if exc.line else str(path)
        raise SpecError(f"{where}: {exc.problem}", f"fix {path.name} and re-run") from exc
    lines: dict[Location, int] = {}
    if node is not None:
        node_lines(node, (), lines)
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


def _unwrap_optional(annotation: object) -> object:
    args = [arg for arg in get_args(annotation) if arg is not type(None)]
    if get_origin(annotation) in (Union, UnionType) and len(args) == 1:
        return args[0]
    return annotation


def _known_fields(model: type[BaseModel], loc: Location) -> list[str]:
    """Field names allowed at ``loc`` (the parent of an unknown key), for did-you-mean."""
    annotation: object = model
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


def describe_error(
    error: ErrorDetails, model: type[BaseModel], path: Path, lines: dict[Location, int]
) -> str:
    loc: Location = tuple(error["loc"])
    line = _line_for(loc, lines)
    where = f"{path}:{line}" if line else str(path)
    field = _field_name(loc)
    if loc and loc[-1] == "[key]":  # pydantic's marker for a bad mapping key
        field = f"{_field_name(loc[:-2])}: key {loc[-2]!r}"
    if error["type"] == "extra_forbidden":
        known = _known_fields(model, loc[:-1])
        close = difflib.get_close_matches(str(loc[-1]), known, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        allowed = f" (known: {', '.join(sorted(known))})" if known and not close else ""
        return f"{where}: unknown field '{field}'{hint}{allowed}"
    message = str(error["msg"]).removeprefix("Value error, ")  # our validators say why
    if error["type"] == "string_pattern_mismatch":  # say what is there, not only the rule
        message = f"{str(error['input'])[:80]!r} is not allowed here ({message})"
    return f"{where}: {field}: {message}"


def load_model(
    path: Path, model: type[Model], context: Mapping[str, object] | None = None
) -> Model:
    """Validate a YAML file into ``model``; every problem is reported with file and line."""
    data, lines = read_yaml(path)
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping at the top level, found {type(data).__name__}")
    try:
        return model.model_validate(data, context=context)
    except ValidationError as exc:
        problems = [describe_error(error, model, path, lines) for error in exc.errors()]
        raise SpecError("\n".join(problems)) from exc


def named_file(
    directory: Path,
    name_or_path: str,
    *,
    file_kind: str,
    name_kind: str,
    known: str,
    otherwise: str,
) -> Path:
    """A YAML file by path (it has a .yaml/.yml suffix or a '/'), else by name in
    ``directory``; a UsageError naming what is missing (``file_kind`` for a path, ``name_kind``
    for a name) and, as its hint, the ``known`` names there or ``otherwise``."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") or "/" in name_or_path:
        candidate = candidate if candidate.is_absolute() else Path.cwd() / candidate
        # exists(), not is_file(): a FIFO or a device is refused by the reader, saying so
        if not candidate.exists():
            raise UsageError(f"{file_kind} {candidate} does not exist")
        return candidate
    for suffix in (".yaml", ".yml"):
        path = directory / f"{name_or_path}{suffix}"
        if path.exists():
            return path
    names = sorted(p.stem for p in directory.glob("*.y*ml"))
    raise UsageError(
        f"no {name_kind} {name_or_path!r} in {directory}",
        f"{known}: {', '.join(names)}" if names else otherwise,
    )


# --- writing -------------------------------------------------------------------------------


class SafeDumper(yaml.SafeDumper):
    """Plain data only, and never an anchor or alias: every file sparkbuild writes is read
    back by a loader that refuses aliases."""

    def ignore_aliases(self, data: object) -> bool:
        return True


#: Line breaks YAML 1.1 knows beside \n and \r. PyYAML writes them as they are in a
#: plain or single-quoted scalar, which reads back as a space: double quotes escape them.
OTHER_BREAKS = ("\x85", "\u2028", "\u2029")


def represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = '"' if any(b in value for b in OTHER_BREAKS) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


SafeDumper.add_representer(str, represent_str)


def comment_line(text: str) -> str:
    """``text`` as one YAML comment line. Every character that is not printable is written
    as its escape (``\\n``, ``\\r``, ``\\x85``, ``\\u2028``: the line breaks YAML knows, and
    the rest), so nothing in ``text`` can end the comment and start YAML of its own."""
    escaped = "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)
    return f"# {escaped}" if escaped else "#"


def dump_yaml(
    data: object,
    *,
    comment: Iterable[str] = (),
    dumper: type[yaml.SafeDumper] = SafeDumper,
    sort_keys: bool = False,
    width: int = 100,
) -> str:
    """The one way sparkbuild writes YAML: ``data`` through the YAML library's dumper, after
    ``comment``'s lines, each one comment line (:func:`comment_line`). Text is never
    assembled into YAML anywhere else (tests/test_yaml_written.py reads the source)."""
    body = yaml.dump(
        data,
        Dumper=dumper,
        sort_keys=sort_keys,
        allow_unicode=True,
        width=width,
        default_flow_style=False,
    )
    return "".join(f"{comment_line(line)}\n" for line in comment) + body


def peer_yaml(data: object) -> str:
    """``data`` as PyYAML's ``safe_dump`` writes it with its defaults but key order kept:
    the exact text a peer hashes (sparkrun's ``effective_hash`` over its recipe text), which
    :func:`dump_yaml`'s choices (unicode kept, 100 columns) would change."""
    return yaml.safe_dump(data, sort_keys=False)
