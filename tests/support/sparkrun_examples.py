"""sparkrun 0.4.2's own example recipes, read from its released sources
(``sparkrun_peer.sparkrun_sources``): every YAML block of its documentation that is a whole
recipe, and every recipe its tests' shared fixtures (``tests/conftest.py``) write or return.

Read as data, never run: Markdown code blocks through the YAML library, and conftest.py's
literal mappings through Python's ``ast`` (``literal_eval``), each written to a file of its
own so that sparkrun and sparkbuild read the same bytes.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import yaml

#: A recipe has a model and at least one of these (RECIPES.md, "Field Reference").
_RECIPE_KEYS = {"runtime", "recipe_version", "sparkrun_version", "command", "container"}
_BLOCK = re.compile(r"^```ya?ml[^\n]*\n(.*?)^```", re.S | re.M)


def _is_recipe(data: object) -> bool:
    return isinstance(data, dict) and "model" in data and bool(_RECIPE_KEYS & set(data))


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()


def doc_recipes(sources: Path) -> dict[str, dict[str, object]]:
    """Each whole recipe in a YAML block of the Markdown files under ``sources``, named
    ``doc-<file>-<line>``; a block repeated word for word (the plugins' copies of one skill)
    is kept once."""
    found: dict[str, dict[str, object]] = {}
    seen: set[str] = set()
    for page in sorted(sources.rglob("*.md")):
        text = page.read_text(encoding="utf-8")
        for block in _BLOCK.finditer(text):
            try:
                data = yaml.safe_load(block[1])
            except yaml.YAMLError:
                continue  # a fragment with placeholders, not a file
            if not _is_recipe(data) or block[1] in seen:
                continue
            seen.add(block[1])
            line = text[: block.start()].count("\n") + 2
            found[f"doc-{_slug(str(page.relative_to(sources).with_suffix('')))}-{line}"] = data
    return found


def _literal_recipes(node: ast.AST, name: str) -> dict[str, dict[str, object]]:
    """The recipe mappings written literally in a fixture: a variable's value (named by the
    variable) or what it returns (named by the fixture)."""
    found: dict[str, dict[str, object]] = {}
    for child in ast.walk(node):
        value, label = None, name
        if isinstance(child, ast.Assign) and isinstance(child.targets[0], ast.Name):
            value, label = child.value, child.targets[0].id
        elif isinstance(child, ast.Return):
            value = child.value
        if isinstance(value, ast.Dict):
            try:
                data = ast.literal_eval(value)
            except ValueError:
                continue  # computed, not a literal recipe
            if _is_recipe(data):
                found[f"fixture-{_slug(label)}"] = data
    return found


def fixture_recipes(conftest: Path) -> dict[str, dict[str, object]]:
    """Each recipe a ``@pytest.fixture`` of ``conftest`` makes from a literal mapping."""
    tree = ast.parse(conftest.read_text(encoding="utf-8"))
    found: dict[str, dict[str, object]] = {}
    for function in tree.body:
        if isinstance(function, ast.FunctionDef) and any(
            "fixture" in ast.unparse(d) for d in function.decorator_list
        ):
            found.update(_literal_recipes(function, function.name))
    return found


def write_examples(sources: Path, folder: Path) -> dict[str, Path]:
    """Every example recipe of sparkrun's sources, each written to ``folder/<name>.yaml``."""
    folder.mkdir(parents=True, exist_ok=True)
    examples = {
        **doc_recipes(sources),
        **fixture_recipes(sources / "tests" / "conftest.py"),
    }
    paths: dict[str, Path] = {}
    for name, data in examples.items():
        paths[name] = folder / f"{name}.yaml"
        paths[name].write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return paths
