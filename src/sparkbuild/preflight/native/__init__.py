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

Standard library only, and only relative imports inside the package: the probe ships this
package beside itself as ``sparkbuild_native`` (``preflight.runner.write_native``, also into
built images), and the host uses it to index the binaries of the wheels it downloads.

- ``index``: reading a binary without loading it, and the distributions stood in for;
- ``values``: the stand-in values, modules and libraries;
- ``hooks``: the native loads redirected, the GPU's answers, and :func:`install`.
"""

from .hooks import Hooks, PlatformStandin, install, installed
from .index import (
    INDEX_VERSION,
    NATIVE_SUFFIXES,
    PLACEHOLDER,
    SIDECAR,
    NativeIndex,
    Standin,
    dynamic_symbols,
    elf_machine,
    index_binary,
    is_native,
    ops_namespaces,
    pyi_names,
)
from .values import NativeLibrary, NativeModule, NativeValue, TvmFfiModule, deeper, stub

__all__ = [
    "INDEX_VERSION",
    "NATIVE_SUFFIXES",
    "PLACEHOLDER",
    "SIDECAR",
    "Hooks",
    "NativeIndex",
    "NativeLibrary",
    "NativeModule",
    "NativeValue",
    "PlatformStandin",
    "Standin",
    "TvmFfiModule",
    "deeper",
    "dynamic_symbols",
    "elf_machine",
    "index_binary",
    "install",
    "installed",
    "is_native",
    "ops_namespaces",
    "pyi_names",
    "stub",
]
