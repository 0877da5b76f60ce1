"""The native loads redirected for stand-in distributions only (extension-module import,
``torch.ops.load_library``, ``ctypes.CDLL``, ``tvm_ffi.load_module``), the GPU as the
target's platform checks see it, and :func:`install`, the probe's entry point. Standard
library only (see the package)."""

from __future__ import annotations

import ctypes
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

from .index import NativeIndex, Standin, is_native, pyi_names
from .values import NativeLibrary, NativeModule, TvmFfiModule, standin_kernel


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

    def exec_module(self, module: object) -> None:
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
        self.loaded: list[dict[str, object]] = []
        self.libraries: list[object] = []  # torch.library.Library objects must stay alive
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
                    kernel = standin_kernel(torch, schema)
                    library.impl(schema.split("(", 1)[0], kernel, "CompositeExplicitAutograd")
                except Exception:
                    continue
                self.defined.add(op)

    def _patch_tvm_ffi(self, module: Any) -> None:
        real = module.load_module
        hooks = self

        def load_module(path: object, *args: object, **kwargs: object) -> Any:
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
            def __new__(cls, name: object, *args: object, **kwargs: object) -> Any:
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

        def load_library(path: object) -> None:
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

    def properties(self) -> object:
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
        answers: dict[str, object] = {
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
    plan: list[dict[str, Any]],
    gpu: dict[str, Any] | None = None,
    site: str | None = None,
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
