"""A GGUF file's header, read without loading it: its version, tensor count and the
``general.*`` and architecture keys (ggml's ``docs/gguf.md``: the magic ``GGUF``, a
little-endian uint32 version, uint64 tensor and key counts, then typed key-value pairs).

The file is hostile input: every count and length is bounded, strings are read only for the
keys kept, and arrays are skipped by their declared size without reading them.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

MAGIC = b"GGUF"
#: At most this many keys are read (llama.cpp's largest models hold a few dozen).
MAX_KEYS = 1 << 16
#: A string value longer than this is not kept (a chat template is the longest kept).
MAX_STRING = 1 << 20
#: GGUF's scalar value types, by number, as struct formats.
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9


class GGUFError(ValueError):
    """The file is not a GGUF file, or its header cannot be what it says."""


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    tensors: int
    values: Mapping[str, object]  # scalar and string keys; arrays as their length

    @property
    def architecture(self) -> str | None:
        found = self.values.get("general.architecture")
        return found if isinstance(found, str) else None

    def context_length(self) -> int | None:
        found = self.values.get(f"{self.architecture}.context_length")
        return found if isinstance(found, int) and not isinstance(found, bool) else None


def read_header(path: Path) -> GGUFHeader:
    """The header of the GGUF file at ``path``; GGUFError naming what is wrong."""
    with path.open("rb") as file:
        if file.read(4) != MAGIC:
            raise GGUFError(f"{path}: not a GGUF file (no GGUF magic at its start)")
        version = _unpack(file, "<I")
        if version not in (2, 3):
            raise GGUFError(f"{path}: GGUF version {version}, not 2 or 3")
        tensors, keys = _unpack(file, "<Q"), _unpack(file, "<Q")
        if keys > MAX_KEYS:
            raise GGUFError(f"{path}: {keys} keys, more than any model holds ({MAX_KEYS})")
        values: dict[str, object] = {}
        for _ in range(keys):
            key = _string(file, MAX_STRING)
            values[key] = _value(file, _unpack(file, "<I"))
    return GGUFHeader(version, tensors, values)


def _unpack(file: BinaryIO, form: str) -> int:
    size = struct.calcsize(form)
    data = file.read(size)
    if len(data) != size:
        raise GGUFError("the header ends early (truncated file)")
    (value,) = struct.unpack(form, data)
    return int(value)


def _string(file: BinaryIO, keep: int) -> str:
    length = _unpack(file, "<Q")
    if length > keep:
        _skip(file, length)
        return ""
    data = file.read(length)
    if len(data) != length:
        raise GGUFError("the header ends early (truncated string)")
    return data.decode("utf-8", errors="replace")


def _skip(file: BinaryIO, length: int) -> None:
    here = file.tell()
    file.seek(0, 2)
    if here + length > file.tell():
        raise GGUFError(f"a value of {length} bytes runs past the end of the file")
    file.seek(here + length)


def _value(file: BinaryIO, kind: int) -> object:
    if kind in _SCALARS:
        form = _SCALARS[kind]
        data = file.read(struct.calcsize(form))
        if len(data) != struct.calcsize(form):
            raise GGUFError("the header ends early (truncated value)")
        return struct.unpack(form, data)[0]
    if kind == _STRING:
        return _string(file, MAX_STRING)
    if kind == _ARRAY:
        item, count = _unpack(file, "<I"), _unpack(file, "<Q")
        if item == _STRING:
            for _ in range(count):
                _skip(file, _unpack(file, "<Q"))
        elif item in _SCALARS:
            _skip(file, count * struct.calcsize(_SCALARS[item]))
        else:
            raise GGUFError(f"an array of value type {item}, which GGUF does not define")
        return count
    raise GGUFError(f"value type {kind}, which GGUF does not define")
