"""The project's nox sessions, read once from noxfile.py (nox registers each session as the
file is executed, and warns when one is registered twice)."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import Any

NOXFILE = Path(__file__).resolve().parents[2] / "noxfile.py"


@functools.cache
def nox_sessions() -> dict[str, Any]:
    """Session name -> the session function (nox's ``Func``), as ``nox -l`` lists them."""
    import nox.registry

    spec = importlib.util.spec_from_file_location("noxfile_under_test", NOXFILE)
    assert spec is not None and spec.loader is not None
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    return dict(nox.registry.get())
