"""The engines that ship with sparkbuild: one module (or package) each, in this folder.

An engine's module is the one that binds its adapter class to ``ADAPTER`` at its top level
(a package: in its ``__init__.py``); the folder's other modules (the protocol, the values,
the registry) bind none. Standard library only: the noxfile reads it, without the package's
dependencies, to make one ``build-<engine>`` session per engine. :mod:`.known` imports each
and registers its adapter.
"""

from __future__ import annotations

import re
from pathlib import Path

_BINDS_ADAPTER = re.compile(r"^ADAPTER\s*=", re.MULTILINE)


def _binds_adapter(path: Path) -> bool:
    return bool(_BINDS_ADAPTER.search(path.read_text(encoding="utf-8")))


def shipped_engines(folder: Path = Path(__file__).parent) -> list[str]:
    """The names of the engine modules and packages in ``folder``, sorted."""
    modules = {path.stem for path in folder.glob("*.py") if _binds_adapter(path)}
    packages = {path.parent.name for path in folder.glob("*/__init__.py") if _binds_adapter(path)}
    return sorted(modules | packages)
