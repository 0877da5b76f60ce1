"""The engines that ship with sparkbuild: one module (or package) each, in this folder.

Standard library only: the noxfile reads it, without the package's dependencies, to make one
``build-<engine>`` session per engine. :mod:`.known` imports each and registers its adapter.
"""

from __future__ import annotations

from pathlib import Path

#: The folder's modules that hold no engine.
NOT_ENGINES = frozenset(
    {"__init__", "answers", "base", "facts", "known", "names", "values", "versions"}
)


def shipped_engines(folder: Path = Path(__file__).parent) -> list[str]:
    """The names of the engine modules and packages in ``folder``, sorted."""
    modules = {path.stem for path in folder.glob("*.py")}
    packages = {path.parent.name for path in folder.glob("*/__init__.py")}
    return sorted((modules | packages) - NOT_ENGINES)
