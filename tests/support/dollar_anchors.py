"""Python regular expressions that end in ``$``: the idiom tests/test_hostile_input.py forbids.

In Python's ``re``, ``$`` matches at the end of the text *and before a newline at its end*,
so ``re.match(r"^[a-z]+$", "name\\n")`` accepts a name with a trailing newline (issue 34).
A check of a whole value ends in ``\\Z`` or uses ``fullmatch``. Multi-line patterns
(``re.M``), where ``$`` is each line's end, are what ``$`` is for. Pydantic's ``pattern=``
is matched by Rust's regex engine, whose ``$`` is the end of the text only: not Python's.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

_CALLS = {"compile", "match", "search", "fullmatch", "sub", "subn", "split", "findall"}
_DOLLAR_END = re.compile(r"(?<!\\)(?:\\\\)*\$\)*\Z")


def _flags_multiline(call: ast.Call) -> bool:
    text = ast.unparse(call)
    return "re.M" in text or "MULTILINE" in text or "(?m" in text


def _pattern_text(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str | bytes):
        value = node.value
        return value.decode("latin-1") if isinstance(value, bytes) else value
    if isinstance(node, ast.JoinedStr):  # rf"...$": its literal tail decides
        tail = node.values[-1] if node.values else None
        return _pattern_text(tail) if tail is not None else None
    return None


def dollar_anchored(source: str) -> list[int]:
    """Lines of ``re`` calls whose pattern ends in ``$`` (not multi-line)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        is_re = (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id == "re"
            and func.attr in _CALLS
        )
        pattern = _pattern_text(node.args[0]) if is_re else None
        if pattern is not None and _DOLLAR_END.search(pattern) and not _flags_multiline(node):
            found.append(node.lineno)
    return found


def scan(root: Path) -> list[str]:
    return [
        f"{path.relative_to(root)}:{line}"
        for path in sorted(root.rglob("*.py"))
        for line in dollar_anchored(path.read_text(encoding="utf-8"))
    ]
