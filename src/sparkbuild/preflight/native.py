"""Native stand-ins for CUDA-only kernel packages: their real Python over stand-in binaries.

Kernel packages (sglang-kernel, flashinfer, apache-tvm-ffi, deep-gemm, the CuTe DSL, ...)
cannot load their native parts on a CPU-only machine: the extension modules link the CUDA
driver, and the wheels are built for the Spark's aarch64. Their Python API is plain Python,
though, and what a binary provides can be read from the file without loading it:

- exported dynamic symbols (``.dynsym``), for ``ctypes.CDLL`` users;
- PyTorch operator schemas (``rmsnorm(Tensor! output, ...) -> ()``, the strings a
  ``TORCH_LIBRARY`` block registers), for ``torch.ops.<namespace>.<op>`` users;
- the module-level names of an extension module: its ``.pyi`` where the wheel ships one,
  else the identifier strings of its read-only data (pybind11/nanobind keep each name there).

The probe imports the packages' real ``.py`` files and replaces only the native loads
(extension-module import, ``torch.ops.load_library``, ``ctypes.CDLL``) with stand-ins that
answer to exactly those names: an import of a name the real binary lacks fails, naming the
name and the package version. Stand-ins run no kernel: a call returns a stand-in value.

Standard library only: the probe ships this file beside itself (also into built images),
and the host uses it to index the binaries of the wheels it downloads.
"""

from __future__ import annotations

import abc
import ast
import builtins
import ctypes
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import json
import keyword
import mmap
import re
import struct
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

SIDECAR = ".sparkbuild-native.json"  # the index of a binary the host did not keep
PLACEHOLDER = b"SPARKBUILD-STANDIN: the real binary was indexed, not kept\n"
NATIVE_SUFFIXES = (".so",)
_SKIP_SECTIONS = (".nv_fatbin", "__nv_relfatbin", ".nvFatBinSegment", ".text", ".debug")
_SCHEMA = re.compile(
    rb"(?<=\x00)([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)?)\(([\x20-\x7e\n]*?)\) ?-> ?"
)
# A whole string, or the identifier that ends one: the linker keeps a literal that is the
# tail of another string once ("InsertionPoint" inside "No current InsertionPoint").
_IDENT = re.compile(rb"(?<![A-Za-z0-9_])([A-Za-z_][A-Za-z0-9_]{1,79})(?=\x00)")
# nanobind keeps a binding's name only inside its signature string ("def name(...) -> ...").
_SIGNATURE = re.compile(rb"(?<=\x00)(?:def|class) ([A-Za-z_][A-Za-z0-9_]{0,79})[(:\[]")
INDEX_VERSION = 3  # bump when index_binary reads more: cached indexes are made again
_OPS_NAMESPACE = re.compile(r"torch\.ops\.([A-Za-z_][A-Za-z0-9_]*)|[\"']([a-z_][a-z0-9_]*)::")


# -- reading a binary without loading it ---------------------------------------------------


def is_native(path: str | Path) -> bool:
    name = str(path)
    return name.endswith(NATIVE_SUFFIXES) or ".so." in Path(name).name


def _sections(data: Any) -> list[tuple[str, int, int, int, int, int]]:
    """(name, type, flags, offset, size, link) of each section of a 64-bit ELF file."""
    if data[:4] != b"\x7fELF" or data[4] != 2:
        return []
    endian = "<" if data[5] == 1 else ">"
    shoff = struct.unpack_from(endian + "Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from(endian + "HHH", data, 0x3A)
    raw = []
    for i in range(shnum):
        base = shoff + i * shentsize
        name, kind, flags, _, offset, size, link = struct.unpack_from(
            endian + "IIQQQQI", data, base
        )
        raw.append((name, kind, flags, offset, size, link))
    if not raw or shstrndx >= len(raw):
        return []
    names_at = raw[shstrndx][3]
    out = []
    for name, kind, flags, offset, size, link in raw:
        end = data.find(b"\x00", names_at + name)
        out.append((bytes(data[names_at + name : end]).decode(), kind, flags, offset, size, link))
    return out


def elf_machine(data: Any) -> str:
    machine = struct.unpack_from("<H", data, 0x12)[0] if data[:4] == b"\x7fELF" else 0
    return {183: "aarch64", 62: "x86_64"}.get(machine, str(machine))


def dynamic_symbols(data: Any) -> list[str]:
    """Defined global and weak symbols of ``.dynsym``: what ``dlsym`` can find."""
    sections = _sections(data)
    endian = "<" if data[5] == 1 else ">"
    found: set[str] = set()
    for _, kind, _, offset, size, link in sections:
        if kind != 11:  # SHT_DYNSYM
            continue
        strtab = sections[link][3]
        for pos in range(offset, offset + size, 24):
            name, info, _, shndx = struct.unpack_from(endian + "IBBH", data, pos)
            if name and shndx != 0 and info >> 4 in (1, 2):
                end = data.find(b"\x00", strtab + name)
                found.add(bytes(data[strtab + name : end]).decode("ascii", "replace"))
    return sorted(found)


def _data_ranges(data: Any) -> Iterator[tuple[int, int]]:
    """Read-only data sections: where schema strings and names live (not code, not cubins)."""
    sections = _sections(data)
    if not sections:
        yield 0, len(data)
        return
    for name, kind, flags, offset, size, _ in sections:
        if kind in (1, 3) and not flags & 0x4 and not name.startswith(_SKIP_SECTIONS):
            yield offset, offset + size  # PROGBITS/STRTAB, not executable


def index_binary(path: Path) -> dict[str, Any]:
    """What a binary provides, read from the file: symbols, op schemas, identifier names."""
    with path.open("rb") as handle:
        size = path.stat().st_size
        if size < 64:
            return {"format": "unknown", "symbols": [], "schemas": [], "names": []}
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            schemas: dict[str, str] = {}
            names: set[str] = set()
            for start, end in _data_ranges(data):
                chunk = data[start:end]
                for match in _SCHEMA.finditer(chunk):
                    tail = chunk[match.end() : chunk.find(b"\x00", match.end())]
                    if not tail:
                        continue
                    text = (match.group(0) + tail).decode("ascii", "replace")
                    schemas.setdefault(match.group(1).decode(), " ".join(text.split()))
                names.update(m.group(1).decode() for m in _IDENT.finditer(chunk))
                names.update(m.group(1).decode() for m in _SIGNATURE.finditer(chunk))
            return {
                "format": "elf" if data[:4] == b"\x7fELF" else "unknown",
                "machine": elf_machine(data),
                "symbols": dynamic_symbols(data),
                "schemas": sorted(schemas.values()),
                "names": sorted(n for n in names if not n.startswith("_Z")),
            }


def pyi_names(path: Path) -> list[str] | None:
    """Module-level names a ``.pyi`` stub declares (a Cython module's own description)."""
    if not path.is_file():
        return None
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError):
        return None
    names: set[str] = set()
    pending = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.If | ast.Try):
            pending += [*node.body, *node.orelse]
    return sorted(names)


def ops_namespaces(sources: Iterator[str]) -> set[str]:
    """``torch.ops.<ns>`` / ``"<ns>::op"`` namespaces a package's Python uses."""
    found: set[str] = set()
    for text in sources:
        for match in _OPS_NAMESPACE.finditer(text):
            found.add(match.group(1) or match.group(2))
    return found - {"aten", "prim", "prims", "_ops", "ops", "c10d", "torch"}


# -- the probe side: stand-in binaries ------------------------------------------------------


class Standin:
    """One kernel distribution served from its real Python files with stand-in binaries.

    ``native_files`` lists the distribution's binaries where its root is shared with other
    packages (site-packages in an image); ``None`` means everything under its roots is its
    own (a directory the host extracted for it alone).
    """

    def __init__(
        self,
        dist: str,
        version: str,
        roots: list[Path],
        modules: list[str],
        native_files: set[Path] | None = None,
    ) -> None:
        self.dist, self.version = dist, version
        self.roots = [r.resolve() for r in roots]
        self.modules = modules
        self.native_files = native_files
        self._namespaces: set[str] | None = None

    @property
    def label(self) -> str:
        return f"{self.dist} {self.version}"

    def owns(self, path: str | Path) -> bool:
        resolved = Path(path).resolve()
        if self.native_files is not None:
            return resolved in self.native_files
        return any(root in resolved.parents for root in self.roots)

    def namespaces(self) -> set[str]:
        if self._namespaces is None:
            texts = (
                p.read_text(encoding="utf-8", errors="replace")
                for root in self.roots
                for module in self.modules
                if (root / module).is_dir()
                for p in (root / module).rglob("*.py")
            )
            self._namespaces = ops_namespaces(texts) | set(self.modules)
        return self._namespaces


class NativeIndex:
    """A binary's names: from the host's sidecar file, or read from the binary itself."""

    _cache: ClassVar[dict[str, dict[str, Any]]] = {}

    @classmethod
    def of(cls, path: str | Path) -> dict[str, Any]:
        key = str(Path(path).resolve())
        if key not in cls._cache:
            sidecar = Path(key + SIDECAR)
            if sidecar.is_file():
                cls._cache[key] = json.loads(sidecar.read_text(encoding="utf-8"))
            else:
                cls._cache[key] = index_binary(Path(key))
        return cls._cache[key]


class _NativeMeta(abc.ABCMeta):
    """Stand-in classes: attribute lookups give further stand-ins, iteration is empty. An
    ABCMeta, so a class may derive from a stand-in and an abstract base at once."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return deeper(cls.__qualname__, name)

    def __iter__(cls) -> Iterator[Any]:
        return iter(())

    def __getitem__(cls, key: Any) -> Any:
        return stub(f"{cls.__qualname__}[]")

    def __setitem__(cls, key: Any, value: Any) -> None:
        pass

    def __contains__(cls, key: Any) -> bool:
        return False


class NativeValue(metaclass=_NativeMeta):
    """What a stand-in binary gives back: it can be called, subclassed and passed around,
    and runs nothing."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        return object.__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return deeper(type(self).__qualname__, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and isinstance(args[0], type | types.FunctionType):
            return args[0]  # a decorator (``@register_value_caster(...)``) keeps what it wraps
        return stub(f"{type(self).__qualname__}()")()

    def __iter__(self) -> Iterator[Any]:
        return iter(())

    def __getitem__(self, key: Any) -> Any:
        return stub(f"{type(self).__qualname__}[]")()

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def __contains__(self, key: Any) -> bool:
        return False

    def __len__(self) -> int:
        return 0

    def __enter__(self) -> Any:  # bindings' contexts (MLIR's InsertionPoint, Context)
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


def deeper(qualname: str, name: str) -> Any:
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

    def _sparkbuild_reexport(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return getattr(self, name)

    def _sparkbuild_defines(self, name: str) -> bool:
        if name in self._sparkbuild_names or name in self._sparkbuild_public():
            return True
        # The linker stores a string that ends another one only once ("data_type" inside
        # "io_data_type"): a name read from the binary may be the tail of a longer string.
        return not self._sparkbuild_exact and any(n.endswith(name) for n in self._sparkbuild_names)

    def __getattr__(self, name: str) -> Any:
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

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self[name]

    def __getitem__(self, name: str) -> Any:
        if name not in self._symbols:
            raise AttributeError(
                f"{Path(self._name).name} of {self._owner.label}: undefined symbol: {name}"
            )
        value = stub(f"{Path(self._name).name}.{name}")()
        self.__dict__[name] = value
        return value


def _standin_value(torch: Any, kind: str) -> Any:
    """What a stand-in op returns for one return type of its schema: no kernel ran."""
    if kind.endswith("?") or kind.startswith("Optional"):
        return None
    if kind == "Tensor":
        return torch.empty(0)
    if kind.endswith("[]") or kind.startswith("List"):
        return []
    return {"int": 0, "float": 0.0, "bool": False, "str": "", "SymInt": 0}.get(kind)


def _standin_kernel(torch: Any, schema: str) -> Any:
    """An implementation for a stand-in op: import-time calls (a version query) get values
    of the schema's return types; nothing is computed."""
    returns = [str(r.type) for r in torch._C.parse_schema(schema).returns]

    def kernel(*args: Any, **kwargs: Any) -> Any:
        values = [_standin_value(torch, kind) for kind in returns]
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

    def get_function(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if name not in self._functions:
            raise AttributeError(
                f"{Path(self._name).name} of {self._owner.label} exports no function {name!r}"
            )
        return stub(f"{Path(self._name).name}.{name}")()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self.get_function(name)

    def __getitem__(self, name: str) -> Any:
        return self.get_function(name)

    def __contains__(self, name: str) -> bool:
        return name in self._functions


class AfterImport:
    """Patches a module right after its own code ran (``tvm_ffi``'s module loader)."""

    def __init__(self, patches: dict[str, Any]) -> None:
        self.patches = patches
        self._busy = False

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in self.patches or self._busy:
            return None
        self._busy = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy = False
        if spec is None or spec.loader is None:
            return None
        execute, patch = spec.loader.exec_module, self.patches[fullname]

        def exec_module(module: Any) -> None:
            execute(module)
            patch(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


class SubmoduleLoader(importlib.abc.Loader):
    """Loads a submodule of a stand-in extension module."""

    def __init__(self, parent: NativeModule) -> None:
        self.parent = parent

    def create_module(self, spec: Any) -> NativeModule:
        return self.parent.submodule(spec.name)

    def exec_module(self, module: Any) -> None:
        pass


class ExtensionFinder:
    """Finds a stand-in package's extension modules by any platform's file name: the wheel
    is the Spark's (``core.cpython-311-aarch64-linux-gnu.so``), which this host's own import
    system would not take for an extension module."""

    def __init__(self, hooks: Hooks) -> None:
        self.hooks = hooks

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        parent_name, _, leaf = fullname.rpartition(".")
        parent = sys.modules.get(parent_name)
        if isinstance(parent, NativeModule):
            if not parent._sparkbuild_defines(leaf):
                return None
            return importlib.util.spec_from_loader(fullname, SubmoduleLoader(parent))
        if self.hooks.owner_of_module(fullname) is None:
            return None
        dirs = list(path) if path else [str(r) for s in self.hooks.standins for r in s.roots]
        for directory in dirs:
            folder = Path(directory)
            if (folder / leaf).is_dir() or (folder / f"{leaf}.py").is_file():
                return None  # a package or a Python module: the normal finders take it
            for file in sorted(folder.glob(f"{leaf}.*so")):
                if file.name.split(".")[0] == leaf and self.hooks.owner(file) is not None:
                    loader = importlib.machinery.ExtensionFileLoader(fullname, str(file))
                    return importlib.util.spec_from_file_location(
                        fullname, str(file), loader=loader
                    )
        return None


class Hooks:
    """The three native loads, redirected for stand-in distributions only."""

    def __init__(self, standins: list[Standin]) -> None:
        self.standins = standins
        self.loaded: list[dict[str, Any]] = []
        self.libraries: list[Any] = []  # torch.library.Library objects must stay alive
        self.defined: set[str] = set()

    def owner(self, path: str | Path) -> Standin | None:
        return next((s for s in self.standins if s.owns(path)), None)

    def owner_of_module(self, module: str) -> Standin | None:
        top = module.split(".", maxsplit=1)[0]
        return next((s for s in self.standins if top in s.modules), None)

    def install(self) -> None:
        sys.meta_path.insert(0, ExtensionFinder(self))
        sys.meta_path.insert(0, AfterImport({"tvm_ffi": self._patch_tvm_ffi}))
        self._patch_extension_loader()
        self._patch_ctypes()
        self._patch_torch_load_library()

    def _patch_extension_loader(self) -> None:
        loader = importlib.machinery.ExtensionFileLoader
        create, execute = loader.create_module, loader.exec_module
        hooks = self

        def create_module(self: Any, spec: Any) -> Any:
            owner = hooks.owner(self.path)
            if owner is None:
                return create(self, spec)
            return hooks.extension_module(spec.name, self.path, owner)

        def exec_module(self: Any, module: Any) -> None:
            if not isinstance(module, NativeModule):
                execute(self, module)

        loader.create_module = create_module  # type: ignore[method-assign]
        loader.exec_module = exec_module  # type: ignore[method-assign]

    def extension_module(self, name: str, path: str, owner: Standin) -> NativeModule:
        stem = Path(path).name.split(".")[0]
        declared = pyi_names(Path(path).with_name(stem + ".pyi"))
        how = "names from its .pyi" if declared is not None else "names read from the binary"
        names = set(declared if declared is not None else self.folder_names(path))
        self.register_ops(path, owner)
        self.loaded.append({"module": name, "file": Path(path).name, "package": owner.label})
        return NativeModule(name, path, owner, names, how, exact=declared is not None)

    def folder_names(self, path: str) -> set[str]:
        """Names read from the binaries of an extension's folder: bindings often live in a
        library beside the module (MLIR's ``_mlir_libs``), and the module links it."""
        folder = Path(path).parent
        binaries = [f for f in folder.iterdir() if f.is_file() and is_native(f.name)]
        names: set[str] = set()
        for binary in binaries or [Path(path)]:
            names.update(NativeIndex.of(binary).get("names", []))
        return names

    def register_ops(self, path: str, owner: Standin) -> None:
        """Define the binary's operator schemas under the namespaces its package uses, so
        ``torch.ops.<ns>.<op>`` resolves exactly for the ops the real binary registers."""
        index = NativeIndex.of(path)
        schemas = index.get("schemas", [])
        if not schemas or "torch" not in sys.modules:
            return
        torch = sys.modules["torch"]
        names = set(index.get("names", []))
        for namespace in sorted(owner.namespaces() & names):
            try:
                library = torch.library.Library(namespace, "FRAGMENT")
            except Exception:
                continue
            self.libraries.append(library)
            for schema in schemas:
                op = f"{namespace}::{schema.split('(', 1)[0]}"
                if op in self.defined:
                    continue
                try:
                    library.define(schema)
                    kernel = _standin_kernel(torch, schema)
                    library.impl(schema.split("(", 1)[0], kernel, "CompositeExplicitAutograd")
                except Exception:
                    continue
                self.defined.add(op)

    def _patch_tvm_ffi(self, module: Any) -> None:
        real = module.load_module
        hooks = self

        def load_module(path: Any, *args: Any, **kwargs: Any) -> Any:
            owner = hooks.owner(str(path))
            if owner is None:
                return real(path, *args, **kwargs)
            hooks.loaded.append({"tvm_ffi_module": Path(str(path)).name, "package": owner.label})
            return TvmFfiModule(str(path), owner)

        module.load_module = load_module
        if "tvm_ffi.module" in sys.modules:
            setattr(sys.modules["tvm_ffi.module"], "load_module", load_module)  # noqa: B010

    def _patch_ctypes(self) -> None:
        real = ctypes.CDLL
        hooks = self

        class StandinCDLL(real):  # type: ignore[misc,valid-type]
            def __new__(cls, name: Any, *args: Any, **kwargs: Any) -> Any:
                owner = hooks.owner(name) if isinstance(name, str | Path) else None
                if owner is not None:
                    hooks.loaded.append({"library": Path(str(name)).name, "package": owner.label})
                    return NativeLibrary(str(name), owner)
                return super().__new__(cls)

        ctypes.CDLL = StandinCDLL  # type: ignore[misc]
        ctypes.cdll._dlltype = StandinCDLL  # type: ignore[attr-defined]

    def _patch_torch_load_library(self) -> None:
        try:
            torch = importlib.import_module("torch")
        except ImportError:
            return
        ops = torch.ops
        real = ops.load_library
        hooks = self

        def load_library(path: Any) -> None:
            owner = hooks.owner(str(path))
            if owner is None:
                real(path)
                return
            hooks.loaded.append({"library": Path(str(path)).name, "package": owner.label})
            hooks.register_ops(str(path), owner)

        ops.load_library = load_library


class PlatformStandin:
    """The GPU as the engine's platform checks see it on the target (a GB10, SM 12.1),
    so the engine takes its CUDA branches: the ones that import the kernel packages and
    pick the Spark's backends. Only questions are answered; any CUDA work still fails."""

    def __init__(self, gpu: dict[str, Any]) -> None:
        self.gpu = gpu

    def properties(self) -> Any:
        gpu = self.gpu
        return types.SimpleNamespace(
            name=gpu["name"],
            major=gpu["capability"][0],
            minor=gpu["capability"][1],
            total_memory=gpu["memory_bytes"],
            multi_processor_count=gpu["sms"],
            is_integrated=gpu.get("integrated", False),
            is_multi_gpu_board=False,
            L2_cache_size=gpu.get("l2_bytes", 0),
            warp_size=32,
            uuid="GPU-sparkbuild-standin",
        )

    def install(self) -> None:
        try:
            torch = importlib.import_module("torch")
        except ImportError:  # an interpreter without torch: nothing asks about a GPU
            return
        cuda, gpu = torch.cuda, self.gpu
        capability = tuple(gpu["capability"])
        memory = int(gpu["memory_bytes"])
        answers: dict[str, Any] = {
            "is_available": lambda: True,
            "device_count": lambda: int(gpu.get("count", 1)),
            "current_device": lambda: 0,
            "set_device": lambda device: None,
            "get_device_capability": lambda device=None: capability,
            "get_device_name": lambda device=None: gpu["name"],
            "get_device_properties": lambda device=None: self.properties(),
            "mem_get_info": lambda device=None: (int(memory * 0.95), memory),
            "is_bf16_supported": lambda *args, **kwargs: True,
            "synchronize": lambda device=None: None,
        }
        for name, answer in answers.items():
            setattr(cuda, name, answer)
        torch.version.cuda = gpu.get("cuda", torch.version.cuda)


def installed(dist: str) -> dict[str, Any] | None:
    """A distribution installed in this interpreter (the built image), as a plan entry."""
    try:
        found = importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        return None
    files = [Path(str(found.locate_file(f))) for f in found.files or []]
    site = Path(str(found.locate_file("")))
    top = (found.read_text("top_level.txt") or "").split()
    modules = sorted(
        {
            *top,
            *(
                f.relative_to(site).parts[0].split(".")[0]
                for f in files
                if f.suffix in (".py", ".so") and site in f.parents
            ),
        }
    )
    return {
        "dist": dist,
        "version": found.version,
        "roots": [str(site)],
        "modules": [m for m in modules if m and not m.endswith("-info")],
        "native_files": [str(f) for f in files if is_native(f)],
    }


def install(
    plan: list[dict[str, Any]], gpu: dict[str, Any] | None = None, site: str | None = None
) -> Hooks:
    """Serve each planned distribution's real Python with stand-in binaries. An entry is
    a directory the host extracted (``roots``), or (``installed``) a distribution of this
    interpreter, as in a built image."""
    standins = []
    for planned in plan:
        entry = installed(planned["dist"]) if planned.get("installed") else planned
        if entry is None:
            continue
        if entry.get("real"):  # a CPU dependency, imported for real
            continue
        native = entry.get("native_files")
        standins.append(
            Standin(
                entry["dist"],
                entry["version"],
                [Path(r) for r in entry["roots"]],
                list(entry["modules"]),
                {Path(f).resolve() for f in native} if native is not None else None,
            )
        )
    hooks = Hooks(standins)
    if gpu:
        PlatformStandin(gpu).install()
    hooks.install()
    if site:  # the host's folder of every package, after the hooks: .pth files import
        importlib.import_module("site").addsitedir(site)
    return hooks


__all__ = [
    "INDEX_VERSION",
    "PLACEHOLDER",
    "SIDECAR",
    "Hooks",
    "NativeIndex",
    "PlatformStandin",
    "Standin",
    "dynamic_symbols",
    "index_binary",
    "install",
    "is_native",
    "ops_namespaces",
    "pyi_names",
]
