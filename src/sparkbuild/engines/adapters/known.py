"""The registry of engines: every engine module in this folder (:mod:`.names`), by name.

Every list of engines sparkbuild keeps (spec validation, ``--repo``, the CLI's choices,
profiles, signatures, claims, the nox sessions) is read from here; an engine is added by
adding its module, and a test suite may :func:`register` an adapter of its own.
"""

from __future__ import annotations

import importlib
from typing import Annotated, Any

from pydantic import BeforeValidator
from pydantic_core import PydanticCustomError

from sparkbuild.engines.adapters.base import EngineAdapter
from sparkbuild.engines.adapters.names import shipped_engines
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


def _registered(value: Any) -> Any:
    if not isinstance(value, str) or value not in ADAPTERS:
        raise PydanticCustomError(
            "literal_error", "Input should be {expected}", {"expected": _quoted(engine_names())}
        )
    return value


#: A field holding an engine's name: any registered engine, refused as a literal would be.
EngineName = Annotated[str, BeforeValidator(_registered)]

for _name in shipped_engines():
    register(importlib.import_module(f"{__package__}.{_name}").ADAPTER)
