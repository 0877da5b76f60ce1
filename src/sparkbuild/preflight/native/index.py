"""What a kernel binary provides, read without loading it, and the distributions whose
binaries are stood in for (:class:`Standin`). Standard library only (see the package)."""

from __future__ import annotations

import ast
import json
import mmap
import re
import struct
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


# -- the distributions stood in for ------------------------------------------------------


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
