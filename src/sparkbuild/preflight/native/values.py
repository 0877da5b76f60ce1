"""The stand-ins themselves: what a stand-in binary gives back (:class:`NativeValue`), an
extension module that answers to exactly its binary's names (:class:`NativeModule`), a
``ctypes`` library (:class:`NativeLibrary`), a ``tvm_ffi`` module, and the kernels of
stand-in ops. Standard library only (see the package)."""

from __future__ import annotations

import abc
import builtins
import keyword
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .index import NativeIndex, Standin


class _NativeMeta(abc.ABCMeta):
    """Stand-in classes: attribute lookups give further stand-ins, iteration is empty. An
    ABCMeta, so a class may derive from a stand-in and an abstract base at once."""

    def __getattr__(cls, name: str) -> object:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return deeper(cls.__qualname__, name)

    def __iter__(cls) -> Iterator[object]:
        return iter(())

    def __getitem__(cls, key: object) -> object:
        return stub(f"{cls.__qualname__}[]")

    def __setitem__(cls, key: object, value: object) -> None:
        pass

    def __contains__(cls, key: object) -> bool:
        return False


class NativeValue(metaclass=_NativeMeta):
    """What a stand-in binary gives back: it can be called, subclassed and passed around,
    and runs nothing."""

    def __new__(cls, *args: object, **kwargs: object) -> Any:
        return object.__new__(cls)

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def __getattr__(self, name: str) -> object:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return deeper(type(self).__qualname__, name)

    def __call__(self, *args: object, **kwargs: object) -> object:
        if len(args) == 1 and not kwargs and isinstance(args[0], type | types.FunctionType):
            return args[0]  # a decorator (``@register_value_caster(...)``) keeps what it wraps
        return stub(f"{type(self).__qualname__}()")()

    def __iter__(self) -> Iterator[object]:
        return iter(())

    def __getitem__(self, key: object) -> object:
        return stub(f"{type(self).__qualname__}[]")()

    def __setitem__(self, key: object, value: object) -> None:
        pass

    def __contains__(self, key: object) -> bool:
        return False

    def __len__(self) -> int:
        return 0

    def __enter__(self) -> object:  # bindings' contexts (MLIR's InsertionPoint, Context)
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __int__(self) -> int:
        return 0

    def __index__(self) -> int:
        return 0

    def __float__(self) -> float:
        return 0.0

    def __repr__(self) -> str:
        return f"<stand-in {type(self).__qualname__}>"


_MAX_DEPTH = 8  # deeper attribute chains end: a loop walking `.parent` must stop


def deeper(qualname: str, name: str) -> object:
    """An attribute of a stand-in value; ``None`` past the depth limit, which ends loops
    such as ``while info is not None: info = info.parent_type_info``."""
    if qualname.count(".") >= _MAX_DEPTH:
        return None
    return stub(f"{qualname}.{name}")


def stub(qualname: str) -> Any:
    if qualname.count(".") > _MAX_DEPTH:
        raise AttributeError(f"{qualname}: a stand-in value has no deeper attributes")
    cls = _NativeMeta(qualname.rsplit(".", 1)[-1], (NativeValue,), {"__module__": "standin"})
    cls.__qualname__ = qualname
    return cls


class NativeModule(types.ModuleType):
    """An extension module's stand-in: the names the real binary defines, and no others."""

    def __init__(
        self,
        name: str,
        path: str,
        owner: Standin,
        names: set[str],
        how: str,
        exact: bool,
        values: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(name)
        self.__file__ = path
        self.__path__: list[str] = []  # bindings may hold submodules (nanobind, MLIR)
        self.__sparkbuild_standin__ = f"{owner.label} ({how})"
        self._sparkbuild_owner = owner
        self._sparkbuild_how = how
        self._sparkbuild_names = names
        self._sparkbuild_exact = exact
        # One binary's values, shared with its submodules: a star import makes each once.
        self._sparkbuild_values: dict[str, Any] = {} if values is None else values

    def submodule(self, name: str) -> NativeModule:
        """A submodule the binary defines (``_cutlass_ir._mlir``), with the same names."""
        return NativeModule(
            name,
            self.__file__ or "",
            self._sparkbuild_owner,
            self._sparkbuild_names,
            self._sparkbuild_how,
            self._sparkbuild_exact,
            self._sparkbuild_values,
        )

    def _sparkbuild_public(self) -> frozenset[str]:
        """The names a star import may bind; from strings, also the class names stored as
        tails of longer ones ("ArrayAttr" in "DenseArrayAttr", "F16Type" in "BF16Type")."""
        public = self._sparkbuild_values.get("\0public")
        if public is None:
            names = set(self._sparkbuild_names)
            if not self._sparkbuild_exact:
                names.update(n[i:] for n in list(names) for i in range(1, len(n)) if n[i].isupper())
            public = frozenset(n for n in names if n.isidentifier() and not n.startswith("_"))
            self._sparkbuild_values["\0public"] = public
        return public

    @property
    def __all__(self) -> list[str]:
        """What ``from <binding> import *`` binds: the binary's public names, less the
        importer's own names and builtins (names read from strings include ``print``-like
        words that a real binding does not export and must not shadow)."""
        caller = sys._getframe(1)  # a star import runs in C: the importer's module body
        if caller.f_code.co_name != "<module>":  # a library reading __all__: no side effects
            return sorted(self._sparkbuild_public())
        importer = caller.f_globals
        if not self._sparkbuild_exact:
            # Names read from strings miss other literals stored as tails: the importer
            # answers the rest by the binding's own rule (PEP 562), as a re-export would.
            importer.setdefault("__getattr__", self._sparkbuild_reexport)
        taken = set(importer) | set(dir(builtins)) | set(keyword.kwlist)
        return sorted(self._sparkbuild_public() - taken)

    def _sparkbuild_reexport(self, name: str) -> object:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return getattr(self, name)

    def _sparkbuild_defines(self, name: str) -> bool:
        if name in self._sparkbuild_names or name in self._sparkbuild_public():
            return True
        # The linker stores a string that ends another one only once ("data_type" inside
        # "io_data_type"): a name read from the binary may be the tail of a longer string.
        return not self._sparkbuild_exact and any(n.endswith(name) for n in self._sparkbuild_names)

    def __getattr__(self, name: str) -> object:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        if name in self._sparkbuild_values:
            return self._sparkbuild_values[name]
        if self._sparkbuild_defines(name):
            value = self._sparkbuild_values[name] = stub(f"{self.__name__}.{name}")
            return value
        raise AttributeError(
            f"module {self.__name__!r} has no attribute {name!r}: the real binary "
            f"{Path(self.__file__ or '').name} of {self.__sparkbuild_standin__} does not "
            "define it"
        )


class NativeLibrary:
    """``ctypes.CDLL`` of a stand-in binary: its exported symbols, and no others."""

    def __init__(self, path: str, owner: Standin) -> None:
        self._name = path
        self._owner = owner
        self._symbols = set(NativeIndex.of(path).get("symbols", []))

    def __getattr__(self, name: str) -> object:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self[name]

    def __getitem__(self, name: str) -> object:
        if name not in self._symbols:
            raise AttributeError(
                f"{Path(self._name).name} of {self._owner.label}: undefined symbol: {name}"
            )
        value = stub(f"{Path(self._name).name}.{name}")()
        self.__dict__[name] = value
        return value


def standin_value(torch: Any, kind: str) -> object:
    """What a stand-in op returns for one return type of its schema: no kernel ran."""
    if kind.endswith("?") or kind.startswith("Optional"):
        return None
    if kind == "Tensor":
        return torch.empty(0)
    if kind.endswith("[]") or kind.startswith("List"):
        return []
    return {"int": 0, "float": 0.0, "bool": False, "str": "", "SymInt": 0}.get(kind)


def standin_kernel(torch: Any, schema: str) -> object:
    """An implementation for a stand-in op: import-time calls (a version query) get values
    of the schema's return types; nothing is computed."""
    returns = [str(r.type) for r in torch._C.parse_schema(schema).returns]

    def kernel(*args: object, **kwargs: object) -> object:
        values = [standin_value(torch, kind) for kind in returns]
        return None if not values else values[0] if len(values) == 1 else tuple(values)

    return kernel


class TvmFfiModule:
    """``tvm_ffi.load_module`` of a stand-in binary: the functions it exports (its
    ``__tvm_ffi_<name>`` symbols), and no others."""

    def __init__(self, path: str, owner: Standin) -> None:
        self._name, self._owner = path, owner
        prefix = "__tvm_ffi_"
        symbols = NativeIndex.of(path).get("symbols", [])
        self._functions = {s[len(prefix) :] for s in symbols if s.startswith(prefix)}

    def get_function(self, name: str, *args: object, **kwargs: object) -> object:
        if name not in self._functions:
            raise AttributeError(
                f"{Path(self._name).name} of {self._owner.label} exports no function {name!r}"
            )
        return stub(f"{Path(self._name).name}.{name}")()

    def __getattr__(self, name: str) -> object:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self.get_function(name)

    def __getitem__(self, name: str) -> object:
        return self.get_function(name)

    def __contains__(self, name: str) -> bool:
        return name in self._functions
