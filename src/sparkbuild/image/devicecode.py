"""CUDA device code read out of one file without running or loading anything.

Three shapes carry it: an ELF of the host (shared library or executable) with fatbin
containers in its ``.nv_fatbin`` (or relocatable ``__nv_relfatbin``) section, a fatbin
shipped as a file, and a cubin shipped as a file (an ELF for ``EM_CUDA``). A fatbin holds
entries, each a cubin (SASS for one arch) or PTX (for one virtual arch), with a header
saying which; the payloads (often compressed) are never read. Names follow cuobjdump's
(``sm_90a``, ``sm_120``; PTX ``sm_120f``), and the tests hold them against cuobjdump's own
listing of the same files. A file is hostile input: every offset and size is checked
against the file, every loop is bounded, and a malformed file is reported, not trusted.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field
from typing import BinaryIO

from elftools.common.exceptions import ELFError
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile

ELF_MAGIC = b"\x7fELF"
FATBIN_MAGIC = 0xBA55ED50
FATBIN_BYTES = struct.pack("<I", FATBIN_MAGIC)
EM_CUDA = 190
#: The sections nvcc puts fatbins in: executable code, then relocatable (``-rdc``) code.
FATBIN_SECTIONS = (".nv_fatbin", "__nv_relfatbin")
_KIND_PTX, _KIND_ELF, _KIND_ELF_ALT = 1, 2, 0x10
# Entry flags (what cuobjdump's names follow): arch-specific ``a`` and family ``f`` code.
_FLAG_ARCH_SPECIFIC = 0x100000
_FLAG_FAMILY = 0x200000
_HEADER = struct.Struct("<IHHQ")  # magic, version, header size, size of what follows
_ENTRY = struct.Struct("<HHIQIIHHIIIQ")  # kind, -, header size, payload size, ..., flags
MAX_ENTRIES = 1_000_000  # per file: libcublasLt carries a few thousand
_SCAN_WINDOW = 1 << 20
_TKINFO_ARCH = re.compile(rb"-arch[= ](sm_\d+[a-z]?)")


@dataclass
class DeviceCode:
    """What one file carries: SASS archs, PTX archs and PTX ISA versions (cuobjdump's
    names), the ELF's dynamic links, and what could not be read."""

    sass: set[str] = field(default_factory=set)
    ptx: set[str] = field(default_factory=set)
    ptx_isa: set[str] = field(default_factory=set)  # e.g. 9.0: the driver must know it
    needed: tuple[str, ...] = ()  # DT_NEEDED
    soname: str | None = None
    problem: str | None = None
    #: ``elf``: a host binary (the dynamic loader maps it, its fatbins are registered);
    #: ``cubin`` or ``fatbin``: a file a library loads by name at run time, per GPU arch.
    shape: str = "elf"

    @property
    def has_code(self) -> bool:
        return bool(self.sass or self.ptx)


def read_device_code(handle: BinaryIO, size: int) -> DeviceCode | None:
    """The device code in ``handle`` (``size`` bytes, seekable); None when the file is
    neither an ELF nor a fatbin."""
    handle.seek(0)
    head = handle.read(4)
    if head == FATBIN_BYTES:
        code = DeviceCode(shape="fatbin")
        _scan_fatbins(handle, 0, size, code)
        return code
    if head != ELF_MAGIC:
        return None
    return _read_elf(handle, size)


def _read_elf(handle: BinaryIO, size: int) -> DeviceCode:
    code = DeviceCode()
    try:
        elf = ELFFile(handle)
        if elf["e_machine"] == "EM_CUDA" or elf["e_machine"] == EM_CUDA:
            code.sass.add(_cubin_arch(elf))
            code.shape = "cubin"
            return code
        fatbins: dict[str, tuple[int, int]] = {}
        for section in elf.iter_sections():
            if section.name in FATBIN_SECTIONS and section["sh_type"] != "SHT_NOBITS":
                fatbins[section.name] = (int(section["sh_offset"]), int(section["sh_size"]))
            elif isinstance(section, DynamicSection):
                _dynamic(section, code)
        # What the runtime registers is the executable fatbin; a relocatable one (input to
        # a device link) counts only when there is no other, as cuobjdump lists them.
        chosen = next((fatbins[name] for name in FATBIN_SECTIONS if name in fatbins), None)
        if chosen is not None:
            start, length = chosen
            if start + length > size:
                code.problem = "a fatbin section runs past the end of the file"
            else:
                _scan_fatbins(handle, start, start + length, code)
    except (ELFError, struct.error, ValueError, OSError, UnicodeDecodeError) as exc:
        code.problem = f"unreadable ELF ({type(exc).__name__}: {str(exc)[:120]})"
    return code


def _dynamic(section: DynamicSection, code: DeviceCode) -> None:
    needed: list[str] = []
    for tag in section.iter_tags():
        if tag.entry.d_tag == "DT_NEEDED":
            needed.append(str(getattr(tag, "needed", "")))
        elif tag.entry.d_tag == "DT_SONAME":
            code.soname = str(getattr(tag, "soname", ""))
        if len(needed) > 4096:
            break
    code.needed = tuple(needed)


def _cubin_arch(elf: ELFFile) -> str:
    """A cubin's arch: ptxas writes its command line (``-arch sm_121a``) into the
    ``.note.nv.tkinfo`` note; older cubins only have it in the ELF flags."""
    note = elf.get_section_by_name(".note.nv.tkinfo")
    if note is not None and note["sh_size"] < 65536:
        found = _TKINFO_ARCH.search(note.data())
        if found:
            return _sass_name(found.group(1).decode())
    flags, abi = int(elf["e_flags"]), int(elf["e_ident"]["EI_ABIVERSION"])
    arch = (flags >> 8) & 0xFF if abi >= 8 else flags & 0xFF
    return f"sm_{arch}"


def _sass_name(arch: str) -> str:
    """cuobjdump names a family (``f``) cubin by its plain arch: it is the same code."""
    return arch[:-1] if arch.endswith("f") else arch


def _scan_fatbins(handle: BinaryIO, start: int, end: int, code: DeviceCode) -> None:
    """Every fatbin container in ``[start, end)``: they follow each other, with padding."""
    position, entries = start, 0
    while position + _HEADER.size <= end:
        found = _find_magic(handle, position, end)
        if found is None:
            return
        handle.seek(found)
        _magic, version, header_size, body = _HEADER.unpack(handle.read(_HEADER.size))
        container_end = found + header_size + body
        if version != 1 or header_size < _HEADER.size or container_end > end:
            code.problem = f"a malformed fatbin header at offset {found}"
            position = found + 4
            continue
        entries += _entries(handle, found + header_size, container_end, code)
        if entries > MAX_ENTRIES:
            code.problem = f"more than {MAX_ENTRIES} fatbin entries; the rest not read"
            return
        position = container_end


def _find_magic(handle: BinaryIO, position: int, end: int) -> int | None:
    while position < end:
        handle.seek(position)
        window = handle.read(min(_SCAN_WINDOW, end - position))
        if not window:
            return None
        at = window.find(FATBIN_BYTES)
        if at >= 0:
            return position + at
        position += max(len(window) - 3, 1)
    return None


def _entries(handle: BinaryIO, position: int, end: int, code: DeviceCode) -> int:
    count = 0
    while position + _ENTRY.size <= end:
        handle.seek(position)
        fields = _ENTRY.unpack(handle.read(_ENTRY.size))
        kind, header_size, payload = fields[0], fields[2], fields[3]
        minor, major, arch, flags = fields[6], fields[7], fields[8], fields[11]
        if header_size < _ENTRY.size or position + header_size + payload > end:
            code.problem = f"a malformed fatbin entry at offset {position}"
            return count
        count += 1
        if kind == _KIND_PTX:
            suffix = "a" if flags & _FLAG_ARCH_SPECIFIC else "f" if flags & _FLAG_FAMILY else ""
            code.ptx.add(f"sm_{arch}{suffix}")
            code.ptx_isa.add(f"{major}.{minor}")
        elif kind in (_KIND_ELF, _KIND_ELF_ALT):
            code.sass.add(f"sm_{arch}{'a' if flags & _FLAG_ARCH_SPECIFIC else ''}")
        position += header_size + payload
        if count > MAX_ENTRIES:
            break
    return count


# --- what runs on a GPU -------------------------------------------------------------------

_SM = re.compile(r"^sm_(\d+)(\d)([af]?)\Z")


def _parts(arch: str) -> tuple[int, int, str] | None:
    match = _SM.match(arch)
    return (int(match.group(1)), int(match.group(2)), match.group(3)) if match else None


def ptx_runs_on(ptx: str, target: str) -> bool:
    """Whether the driver can compile PTX for ``ptx`` (e.g. sm_90) for a ``target`` GPU.

    Plain PTX compiles for any GPU of that compute capability or later; family (``f``)
    PTX for the same major at the same or a later minor; arch-specific (``a``) PTX only
    for exactly that arch.
    """
    have, want = _parts(ptx), _parts(target)
    if have is None or want is None:
        return ptx == target
    if have[2] == "a":
        return have[:2] == want[:2]
    if have[2] == "f":
        return have[0] == want[0] and have[1] <= want[1]
    return (have[0], have[1]) <= (want[0], want[1])
