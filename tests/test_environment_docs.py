"""Every environment variable the code reads is documented in docs/environment.md, and every
variable documented there is read somewhere.

Read means: ``os.environ.get("X")``, ``os.environ["X"]``, ``os.getenv("X")``, click's
``envvar="X"``, any string that is a whole ``SPARKBUILD_*`` name (``WHEELS_ENV =
"SPARKBUILD_WHEELS"``, a build argument's key), and ``${SPARKBUILD_*}`` in the scripts and
Dockerfiles. The code scanned is what users and CI run: the package (with the helpers it
ships into images), the noxfile, the test support and conftest; in test files, only direct
reads (a test may make up a variable name to set).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from sparkbuild import redact

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "environment.md"
OURS = re.compile(r"SPARKBUILD_[A-Z0-9_]+")
READERS = {"os.environ.get", "os.getenv", "environ.get", "os.environ.setdefault"}
NOT_OURS = {"PATH", "HOME"}  # every program's


def _text(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _read_by(node: ast.AST) -> str | None:
    """The variable ``node`` reads, if it is a read of one by a literal name."""
    if isinstance(node, ast.Call) and ast.unparse(node.func) in READERS and node.args:
        return _text(node.args[0])
    if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ":
        return _text(node.slice)
    if isinstance(node, ast.keyword) and node.arg == "envvar":
        return _text(node.value)
    return None


def _reads(tree: ast.AST, *, names_too: bool) -> Iterator[str]:
    for node in ast.walk(tree):
        name = _read_by(node)
        if name is None and names_too:
            text = _text(node)
            name = text if text and OURS.fullmatch(text) else None
        if name is not None:
            yield name


def variables_read() -> dict[str, str]:
    """Variable -> one file that reads it."""
    found: dict[str, str] = {}
    whole = [
        *sorted((ROOT / "src").rglob("*.py")),
        *sorted((ROOT / "tests" / "support").rglob("*.py")),
        ROOT / "tests" / "conftest.py",
        ROOT / "noxfile.py",
    ]
    for path in [*whole, *sorted((ROOT / "tests").glob("test_*.py"))]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for name in _reads(tree, names_too=path in whole):
            found.setdefault(name, str(path.relative_to(ROOT)))
    dockerfiles = sorted((ROOT / "src" / "sparkbuild" / "data").rglob("*.Dockerfile"))
    for path in [*sorted((ROOT / "scripts").glob("*.sh")), ROOT / ".ci" / "run", *dockerfiles]:
        if path.is_file():
            for name in re.findall(r"\$\{?(SPARKBUILD_[A-Z0-9_]+)", path.read_text()):
                found.setdefault(name, str(path.relative_to(ROOT)))
    for name in redact.SECRET_ENV:  # read in a loop, by name
        found.setdefault(name, "src/sparkbuild/redact.py")
    return {name: where for name, where in found.items() if name not in NOT_OURS}


def documented() -> set[str]:
    rows = [line for line in DOC.read_text(encoding="utf-8").splitlines() if line.startswith("|")]
    return {name for row in rows for name in re.findall(r"`([A-Z][A-Z0-9_]+)`", row.split("|")[1])}


def test_every_variable_the_code_reads_is_documented() -> None:
    missing = {name: where for name, where in variables_read().items() if name not in documented()}
    assert not missing, f"read but not in docs/environment.md: {missing}"


def test_every_documented_variable_is_read() -> None:
    stale = documented() - set(variables_read())
    assert not stale, f"in docs/environment.md but read nowhere: {sorted(stale)}"


def test_the_scan_sees_the_ones_the_issue_named() -> None:
    read = variables_read()
    assert {"SPARKBUILD_NET_TIMEOUT", "SPARKBUILD_PREFLIGHT_PYTHON", "SPARKBUILD_DEBUG"} <= set(
        read
    )
    assert read["SPARKBUILD_WHEELS"].startswith("src/")  # through WHEELS_ENV = "..."
