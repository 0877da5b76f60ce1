"""Where source code writes YAML by hand: the idioms tests/test_yaml_written.py forbids.

sparkbuild writes YAML through one function, ``yamlfile.dump_yaml``: the data through the
YAML library's dumper, and a comment line by line with every line break escaped. Text put
together around a dump is how a recipe field holding a newline wrote
``container.mounts: ['/:/host:rw']`` into an imported profile (issue 34). The idioms:

- ``dump-call``: the YAML library's dumpers called outside ``yamlfile.py`` (and ruamel's
  round-trip dump outside ``bump/specedit.py``, which edits a user's spec in place);
- ``dump-joined``: YAML text put together with other text (``+``, ``%``, an f-string,
  ``str.join``, ``str.format``), directly or through a name or a call holding it. YAML text
  is what a dumper returns: ``dump_yaml``, and every function whose returns all hold YAML
  text (found over the whole package, so ``recipe_claims`` and ``lockfile.dumps`` are).
  A dumper is known by its module and name (``lockfile.dumps``, not ``json.dumps``; a
  method by its name on any object);
- ``yaml-write``: a write to a ``.yaml``/``.yml`` path of anything but YAML text (an
  f-string template, lines joined by hand).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

YAML_DUMPS = {"dump", "safe_dump", "dump_all", "safe_dump_all", "emit", "serialize"}
DUMP_ALLOWED = {"yamlfile.py"}  # the one dumper: its comment lines are escaped
RUAMEL_ALLOWED = {"specedit.py"}  # round-trip edits of a user's spec: comments kept
NOT_YAML = {"json", "jsontext", "pickle", "marshal"}  # their `dumps` write no YAML
WRITERS = {
    "write_text",
    "write_bytes",
    "write",
    "write_output",
    "write_atomic",
    "write_redacted",
    "_write",
}
SUFFIXES = (".yaml", ".yml")
PASS_THROUGH = {"redact", "str"}  # functions that return the text they are given, changed


@dataclass(frozen=True)
class Finding:
    file: str
    line: int
    idiom: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.idiom}"


def _called_name(node: ast.Call) -> str | None:
    func = node.func
    if isinstance(func, ast.Attribute):
        if isinstance(func.value, ast.Name) and func.value.id in NOT_YAML:
            return None
        return func.attr
    return func.id if isinstance(func, ast.Name) else None


def _call_keys(node: ast.Call, module: str, imported: dict[str, str]) -> set[str]:
    """What a call may be, as dumpers are keyed: ``module.function`` (this module's, or one
    imported by name), ``alias.function`` for a module called through its name, and
    ``*.method`` for a call on any other object."""
    func = node.func
    if isinstance(func, ast.Name):
        return {f"{imported.get(func.id, module)}.{func.id}"}
    if isinstance(func, ast.Attribute):
        keys = {f"*.{func.attr}"}
        if isinstance(func.value, ast.Name):
            keys.add(f"{func.value.id}.{func.attr}")
        return keys
    return set()


def _imports(tree: ast.AST) -> dict[str, str]:
    """Names imported from a module (``from sparkbuild.yamlfile import dump_yaml``) -> the
    module's last part (``yamlfile``)."""
    return {
        (alias.asname or alias.name): (node.module or "").rsplit(".", 1)[-1]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }


def _is_library_dump(node: ast.AST, ruamel: bool) -> bool:
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
        return False
    func = node.func
    if isinstance(func.value, ast.Name) and func.value.id == "yaml":
        return func.attr in YAML_DUMPS
    return ruamel and func.attr == "dump"


def _mentions_suffix(node: ast.AST) -> bool:
    return any(
        isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.endswith(SUFFIXES)
        for n in ast.walk(node)
    )


class _Function(ast.NodeVisitor):
    """One function body: which names hold YAML text or a YAML path, and where YAML text
    meets other text or a YAML path gets other text."""

    def __init__(
        self, dumpers: set[str], ruamel: bool, module: str, imported: dict[str, str]
    ) -> None:
        self.dumpers = dumpers
        self.ruamel = ruamel
        self.module = module
        self.imported = imported
        self.tainted: set[str] = set()
        self.yaml_paths: set[str] = set()
        self.found: list[tuple[int, str]] = []
        self.returns: list[ast.expr | None] = []

    def holds_yaml(self, node: ast.AST | None) -> bool:
        if node is None:
            return False
        if _is_library_dump(node, self.ruamel):
            return True
        if isinstance(node, ast.Name):
            return node.id in self.tainted
        if isinstance(node, ast.Call):
            if _call_keys(node, self.module, self.imported) & self.dumpers:
                return True
            # text.strip(), redact(text): still the dump's text
            receiver = node.func.value if isinstance(node.func, ast.Attribute) else None
            passed = _called_name(node) in PASS_THROUGH and any(map(self.holds_yaml, node.args))
            return self.holds_yaml(receiver) or passed
        return False

    def is_yaml_path(self, node: ast.AST) -> bool:
        if isinstance(node, ast.Name):
            return node.id in self.yaml_paths
        return _mentions_suffix(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        self.generic_visit(node)
        names = {t.id for t in node.targets if isinstance(t, ast.Name)}
        if self.holds_yaml(node.value):
            self.tainted |= names
        if _mentions_suffix(node.value):
            self.yaml_paths |= names

    def visit_Return(self, node: ast.Return) -> None:
        self.returns.append(node.value)
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, ast.Add | ast.Mod) and (
            self.holds_yaml(node.left) or self.holds_yaml(node.right)
        ):
            self.found.append((node.lineno, "dump-joined"))
        self.generic_visit(node)

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        if any(isinstance(v, ast.FormattedValue) and self.holds_yaml(v.value) for v in node.values):
            self.found.append((node.lineno, "dump-joined"))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        name = _called_name(node)
        if name in ("join", "format"):
            parts: list[ast.AST] = [*node.args, *(k.value for k in node.keywords)]
            elements = [e for p in parts for e in getattr(p, "elts", [p])]
            elements += [p.elt for p in parts if isinstance(p, ast.GeneratorExp | ast.ListComp)]
            receiver = node.func.value if isinstance(node.func, ast.Attribute) else None
            if any(self.holds_yaml(e) for e in elements) or (
                name == "format" and self.holds_yaml(receiver)
            ):
                self.found.append((node.lineno, "dump-joined"))
        if name in WRITERS:
            self._check_write(node)
        self.generic_visit(node)

    def _check_write(self, node: ast.Call) -> None:
        """``path.write_text(data)`` or ``write_x(path, data, ...)``."""
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in ("write_text", "write_bytes"):
            path, data = func.value, (node.args[0] if node.args else None)
        elif len(node.args) >= 2:
            path, data = node.args[0], node.args[1]
        else:
            return
        if data is not None and self.is_yaml_path(path) and not self.holds_yaml(data):
            self.found.append((node.lineno, "yaml-write"))


def _functions(
    tree: ast.AST,
) -> Iterable[tuple[str | None, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function, with its class's name (None for a module-level one)."""
    classes = {
        id(child): node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        for child in node.body
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield classes.get(id(node)), node


def _visit(
    function: ast.FunctionDef | ast.AsyncFunctionDef,
    dumpers: set[str],
    ruamel: bool,
    module: str,
    imported: dict[str, str],
) -> _Function:
    visitor = _Function(dumpers, ruamel, module, imported)
    for statement in function.body:
        visitor.visit(statement)
    return visitor


def _stem(name: str) -> str:
    return Path(name).stem


def yaml_dumpers(modules: dict[str, str]) -> set[str]:
    """The functions (over every module) whose returns all hold YAML text, keyed as
    ``module.function`` or ``*.method``."""
    dumpers = {"yamlfile.dump_yaml"}
    trees = [(_stem(n), ast.parse(text), "ruamel" in text) for n, text in modules.items()]
    while True:
        found = set(dumpers)
        for module, tree, ruamel in trees:
            imported = _imports(tree)
            for owner, function in _functions(tree):
                visited = _visit(function, dumpers, ruamel, module, imported)
                if visited.returns and all(map(visited.holds_yaml, visited.returns)):
                    found.add(f"{'*' if owner else module}.{function.name}")
        if found == dumpers:
            return dumpers
        dumpers = found


def findings(source: str, name: str, dumpers: set[str] | None = None) -> list[Finding]:
    """Every idiom of writing YAML by hand in ``source`` (a module's text; ``name`` its file
    name, which decides what it may call; ``dumpers``: as :func:`yaml_dumpers` found them,
    by default this module's own)."""
    tree = ast.parse(source)
    ruamel = "ruamel" in source
    dumpers = dumpers if dumpers is not None else yaml_dumpers({name: source})
    module, imported = _stem(name), _imports(tree)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if _is_library_dump(node, ruamel):
            library = _is_library_dump(node, False)
            if name not in (DUMP_ALLOWED if library else RUAMEL_ALLOWED):
                found.append((getattr(node, "lineno", 0), "dump-call"))
    if name not in DUMP_ALLOWED:
        for _, function in _functions(tree):
            found += _visit(function, dumpers, ruamel, module, imported).found
    return [Finding(name, line, idiom) for line, idiom in sorted(set(found))]


def scan(root: Path) -> list[Finding]:
    """Every finding in the package under ``root`` (not its ``data/``: the probe runs in the
    engine's interpreter and writes no file of ours)."""
    paths = [p for p in sorted(root.rglob("*.py")) if "data" not in p.relative_to(root).parts]
    modules = {str(p.relative_to(root)): p.read_text(encoding="utf-8") for p in paths}
    dumpers = yaml_dumpers(modules)
    result = []
    for relative, text in modules.items():
        for finding in findings(text, Path(relative).name, dumpers):
            result.append(Finding(relative, finding.line, finding.idiom))
    return result
