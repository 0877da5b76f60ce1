"""The escape hatches in ``src/`` stay within their budget (issue 33, "Typing and formatting").

- ``Any`` in annotations (a parameter's, a return's, an annotated assignment's, string
  annotations included) at most :data:`ANY_CEILING` times: a value only passed on or stored is
  ``object``, a read-only mapping ``Mapping[str, object]``.
- ``# fmt: skip`` at most :data:`SKIP_CEILING` times, each on a statement with a comment on
  the line before it saying why the table reads better than the formatter's layout.

The counters are checked on a sample first, so a counter that stopped counting fails too.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "sparkbuild"
ANY_CEILING = 200
SKIP_CEILING = 10
SKIP = "# fmt: skip"


def _anys(annotation: ast.expr | None) -> int:
    """How many times ``Any`` is named in one annotation (a quoted one parsed too)."""
    count = 0
    for node in ast.walk(annotation) if annotation is not None else ():
        named = node.id if isinstance(node, ast.Name) else None
        if named == "Any" or (isinstance(node, ast.Attribute) and node.attr == "Any"):
            count += 1
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                count += _anys(ast.parse(node.value, mode="eval").body)
            except SyntaxError:
                continue
    return count


def any_count(source: str) -> int:
    """``Any`` in the parameter, return and annotated-assignment annotations of ``source``."""
    count = 0
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            arguments = node.args
            every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
            every += [a for a in (arguments.vararg, arguments.kwarg) if a is not None]
            count += sum(_anys(a.annotation) for a in every) + _anys(node.returns)
        elif isinstance(node, ast.AnnAssign):
            count += _anys(node.annotation)
    return count


def skips(source: str) -> tuple[int, list[int]]:
    """How many ``# fmt: skip`` lines ``source`` has, and those whose statement has no
    comment on the line before it (1-based line numbers)."""
    lines = source.splitlines()
    marked = [n for n, line in enumerate(lines, 1) if line.rstrip().endswith(SKIP)]
    starts = {
        node.end_lineno: node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.stmt) and node.end_lineno is not None
    }
    unexplained = [
        n
        for n in marked
        if n not in starts or starts[n] < 2 or not lines[starts[n] - 2].lstrip().startswith("#")
    ]
    return len(marked), unexplained


def _sources() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def test_the_counters_count() -> None:
    sample = textwrap.dedent(
        """
        from typing import Any
        import typing

        def f(a: Any, *b: Any, c: dict[str, Any], **d: "list[Any]") -> typing.Any:
            x: Any = a
            y = 1  # Any in a comment or a body is not counted
            return x

        class C:
            z: tuple[Any, ...] = ()

        # a table: one row per release
        T = {
            "a": 1, "b": 2,
        }  # fmt: skip
        U = {"a": 1, "b": 2}  # fmt: skip
        """
    )
    assert any_count(sample) == 7
    assert skips(sample) == (2, [17])


def test_any_in_annotations_within_budget() -> None:
    counts = {p: any_count(p.read_text()) for p in _sources()}
    total = sum(counts.values())
    worst = sorted(counts.items(), key=lambda item: -item[1])[:5]
    shown = ", ".join(f"{p.relative_to(SRC)}: {n}" for p, n in worst)
    assert total <= ANY_CEILING, (
        f"{total} Any in annotations in src/ (budget {ANY_CEILING}); most in {shown}. "
        "Use object for a value only passed on or stored, Mapping[str, object] for a "
        "read-only input, or a typed shape"
    )


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(SRC)))
def test_each_fmt_skip_says_why(path: Path) -> None:
    _, unexplained = skips(path.read_text())
    assert not unexplained, (
        f"{path.relative_to(SRC)}: # fmt: skip on lines {unexplained} without a comment on "
        "the line before the statement saying why the table reads better"
    )


def test_fmt_skip_within_budget() -> None:
    found = {p: skips(p.read_text())[0] for p in _sources()}
    total = sum(found.values())
    where = ", ".join(f"{p.relative_to(SRC)}: {n}" for p, n in found.items() if n)
    assert total <= SKIP_CEILING, (
        f"{total} # fmt: skip in src/ (budget {SKIP_CEILING}): {where}. Let ruff format lay "
        "the code out; keep a skip only for a table, with its reason on the line before"
    )
