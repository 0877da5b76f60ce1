"""A binding's stand-in under ``from <binding> import *``, as the CuTe DSL's MLIR layer uses it.

``cutlass/_mlir/ir.py`` (nvidia-cutlass-dsl 4.8.0) star-imports its nanobind module and then
uses ``AttrBuilder`` bare; ``extras/types.py`` imports ``F16Type`` from ``ir.py``. The real
binary stores the literal "F16Type" only as the tail of "BF16Type" and "InsertionPoint" only
as the tail of "No current InsertionPoint" (the linker keeps a string that ends another one
once), so names read from strings must cover tails. These tests use the names as the real
``_cutlass_ir`` binary holds them; ``test_preflight_shipped.py`` runs the real DSL.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from sparkbuild.preflight import native
from sparkbuild.preflight.native import NativeModule, NativeValue, Standin, index_binary
from sparkbuild.preflight.runner import write_native

NATIVE = Path(native.__file__).parent

# Strings as they sit in the real binary's read-only data, NUL-separated.
BINARY_STRINGS = [b"AttrBuilder", b"BF16Type", b"No current InsertionPoint", b"print"]


@pytest.fixture
def binding(tmp_path: Path) -> Any:
    blob = tmp_path / "_cutlass_ir.so"
    blob.write_bytes(b"\x00" * 64 + b"\x00".join([b"", *BINARY_STRINGS, b""]))
    names = set(index_binary(blob)["names"])
    owner = Standin("nvidia-cutlass-dsl-libs-cu13", "4.8.0", [tmp_path], ["cutlass"])
    module = NativeModule("_ir_binding", str(blob), owner, names, "names read", exact=False)
    sys.modules["_ir_binding"] = module
    yield module
    sys.modules.pop("_ir_binding", None)


def test_names_that_end_a_string_are_indexed(tmp_path: Path) -> None:
    blob = tmp_path / "b.so"
    blob.write_bytes(b"\x00" * 64 + b"\x00".join([b"", *BINARY_STRINGS, b""]))
    names = index_binary(blob)["names"]
    assert "InsertionPoint" in names and "AttrBuilder" in names
    assert "current" not in names  # a word inside a sentence is not a name


def test_star_import_binds_the_binding_names_but_not_over_the_importer(binding: Any) -> None:
    importer = types.ModuleType("cutlass_ir_py")
    importer.contextmanager = "the importer's own"  # type: ignore[attr-defined]
    exec("from _ir_binding import *", importer.__dict__)
    bound = importer.__dict__
    assert isinstance(bound["AttrBuilder"], type)  # used bare after the star import
    assert "InsertionPoint" in bound and "F16Type" in bound  # tails: class names kept short
    assert "print" not in bound  # a builtin word from the strings does not shadow print
    assert bound["contextmanager"] == "the importer's own"
    # What a star import cannot list, the importer re-exports by the binding's rule.
    assert importer.Type is bound["Type"]
    with pytest.raises(AttributeError, match="does not define it"):
        importer.NoSuchAttr  # noqa: B018


def test_stand_in_decorators_keep_what_they_wrap(binding: Any) -> None:
    register = binding.AttrBuilder  # any binding callable, used as ``@register(...)``

    @register("ArithValue")
    class ArithValue:
        pass

    assert ArithValue.__name__ == "ArithValue"
    assert int | ArithValue  # a union in an annotation, as cutlass/base_dsl/pointer.py has
    with binding.InsertionPoint() as point:  # bindings' contexts enter and leave
        assert isinstance(point, NativeValue)


def foreign_imports(package: Path) -> list[str]:
    """Each import in ``package`` that is neither the standard library nor relative: the
    package is shipped beside the probe, into interpreters that have nothing else."""
    found = []
    for path in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level:
                continue
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                )
                found += [
                    f"{path.name}:{node.lineno}: {name}"
                    for name in names
                    if name.split(".")[0] not in sys.stdlib_module_names
                ]
    return found


def test_the_stand_in_package_needs_only_the_standard_library(tmp_path: Path) -> None:
    assert foreign_imports(NATIVE) == []
    copy = shutil.copytree(NATIVE, tmp_path / "native", ignore=shutil.ignore_patterns("*.pyc"))
    (copy / "values.py").write_text(
        (copy / "values.py").read_text() + "from sparkbuild import errors\n"
    )
    lines = len((copy / "values.py").read_text().splitlines())
    assert foreign_imports(copy) == [f"values.py:{lines}: sparkbuild"]


def test_the_probe_imports_the_shipped_package_by_its_own_name(tmp_path: Path) -> None:
    """As the probe runs it: ``python -I`` beside a copy, with no sparkbuild to import."""
    write_native(tmp_path)
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); import sparkbuild_native as n; "
        "print(n.install.__module__, n.index_binary.__module__, 'sparkbuild' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", script, str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["sparkbuild_native.hooks", "sparkbuild_native.index", "False"]
