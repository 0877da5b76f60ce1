"""The registry of engines: every engine module in this folder (:mod:`.names`), by name.

Every list of engines sparkbuild keeps (spec validation, ``--repo``, the CLI's choices,
profiles, signatures, claims, the nox sessions) is read from here; an engine is added by
adding its module, and a test suite may :func:`register` an adapter of its own.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import BeforeValidator
from pydantic_core import PydanticCustomError

from sparkbuild.adapters.base import EngineAdapter
from sparkbuild.adapters.names import shipped_engines
from sparkbuild.errors import UsageError

#: Engine name -> its adapter class, in the order they were registered.
ADAPTERS: dict[str, type[EngineAdapter]] = {}


def register(adapter: type[EngineAdapter]) -> type[EngineAdapter]:
    """Add ``adapter`` to the registry under its ``name``; a name taken is a ValueError."""
    if adapter.name in ADAPTERS:
        raise ValueError(f"engine {adapter.name!r} is registered already")
    ADAPTERS[adapter.name] = adapter
    return adapter


def unregister(name: str) -> None:
    ADAPTERS.pop(name, None)


def engine_names() -> list[str]:
    """Every registered engine's name, sorted."""
    return sorted(ADAPTERS)


def launcher_names() -> list[str]:
    """Every multi-node runtime a registered engine takes (a profile's ``parallel.launcher``)."""
    return sorted({name for adapter in ADAPTERS.values() for name in adapter.parallel_launchers})


def adapter_type(engine: str) -> type[EngineAdapter]:
    """The adapter class of ``engine``: its facts, without a running engine."""
    try:
        return ADAPTERS[engine]
    except KeyError:
        known = ", ".join(engine_names())
        raise UsageError(f"unknown engine {engine!r}; known engines: {known}") from None


def adapter_for(engine: str, **kwargs: Any) -> EngineAdapter:
    return adapter_type(engine)(**kwargs)


def _quoted(names: list[str]) -> str:
    """``'a' or 'b'``, ``'a', 'b' or 'c'``: the list as pydantic words a literal's choices."""
    quoted = [repr(name) for name in names]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def _one_of(names: Callable[[], list[str]]) -> BeforeValidator:
    """A field's check that its value is one of ``names()`` (read at each validation, so an
    engine registered later counts), refused as a literal of them would be."""

    def check(value: object) -> object:
        known = names()
        if not isinstance(value, str) or value not in known:
            expected = {"expected": _quoted(known)}
            raise PydanticCustomError("literal_error", "Input should be {expected}", expected)
        return value

    return BeforeValidator(check)


#: A field holding an engine's name: any registered engine.
EngineName = Annotated[str, _one_of(engine_names)]
#: A field holding a multi-node runtime: one a registered engine takes.
LauncherName = Annotated[str, _one_of(launcher_names)]

for _name in shipped_engines():
    register(importlib.import_module(f"{__package__}.{_name}").ADAPTER)
