"""A GGUF file's header read in one pass: its metadata as plain values and its tensors as
views into the memory-mapped file.

gguf's own GGUFReader builds a numpy memmap slice for every part of every field,
which for a tokenizer's 32k-160k strings and merges takes seconds at each start; this
reader walks the same bytes with struct and gives the tensors the same fields and
views (`GGUFTensor` has ReaderTensor's names). The format (little-endian, versions 2
and 3): magic, version, tensor count, key-value count; the key-value pairs (a string
key, a value type, the value; arrays carry their element type and count); the tensor
infos (name, dimensions, type, offset); the data, aligned to `general.alignment`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

DEFAULT_ALIGNMENT = 32
# GGUF value types -> struct formats of the scalar ones
_SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
_NUMPY = {0: "u1", 1: "i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8"}
_NUMPY.update({11: "<i8", 12: "<f8"})
_STRING, _ARRAY = 8, 9
_LENGTH = struct.Struct("<Q")  # a string's byte count
_FLOATS = {6, 12}
# Unquantized tensor types and how numpy holds them; the rest are bytes of blocks.
_ITEMS = {
    GGMLQuantizationType.F32: np.float32,
    GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.F64: np.float64,
    GGMLQuantizationType.I8: np.int8,
    GGMLQuantizationType.I16: np.int16,
    GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}


class HeaderError(ValueError):
    """The bytes are not a GGUF header this reader understands (the caller words it)."""


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor: gguf's ReaderTensor fields the engine reads."""

    name: str
    tensor_type: GGMLQuantizationType
    shape: np.ndarray  # dimensions in GGUF order (fastest first), as gguf gives them
    n_elements: int
    n_bytes: int
    data_offset: int
    data: np.ndarray  # a view into the mapped file: numpy order, blocks as bytes


class _Cursor:
    def __init__(self, buffer, offset: int = 0):
        self.buffer, self.offset = buffer, offset

    def unpack(self, fmt: str):
        values = struct.unpack_from("<" + fmt, self.buffer, self.offset)
        self.offset += struct.calcsize("<" + fmt)
        return values[0] if len(values) == 1 else values

    def string(self) -> str:
        length = self.unpack("Q")
        end = self.offset + length
        if end > len(self.buffer):
            raise HeaderError("a string runs past the end of the file")
        text = bytes(self.buffer[self.offset : end]).decode("utf-8")
        self.offset = end
        return text

    def value(self, kind: int) -> Any:
        """A value of GGUF type `kind`; None for an array of arrays (read past, not kept)."""
        if kind == _STRING:
            return self.string()
        if kind in _SCALARS:
            value = self.unpack(_SCALARS[kind])
            # Through float32's shortest repr, so 1e-05 stays 1e-05 and not 9.99e-06.
            return float(str(np.float32(value))) if kind == 6 else value
        if kind != _ARRAY:
            raise HeaderError(f"unknown GGUF value type {kind}")
        element, count = self.unpack("I"), self.unpack("Q")
        if element in _NUMPY:
            size = np.dtype(_NUMPY[element]).itemsize
            if self.offset + count * size > len(self.buffer):
                raise HeaderError("an array runs past the end of the file")
            values = np.frombuffer(self.buffer, _NUMPY[element], count, self.offset)
            self.offset += count * size
            if element in _FLOATS:
                return [float(str(v)) for v in values.astype(np.float32 if element == 6 else None)]
            return values.tolist()
        if element == _STRING:
            return self.strings(count)
        items = [self.value(element) for _ in range(count)]
        return None if element == _ARRAY else items

    def strings(self, count: int) -> list[str]:
        """`count` strings in a row (a vocabulary, its merges): one tight loop over a
        memoryview, where a value() call per string took 7 us (0.23 s for 32k tokens and
        their merges at every start, five times that for a 160k vocabulary)."""
        view, offset, end = memoryview(self.buffer), self.offset, len(self.buffer)
        unpack, texts = _LENGTH.unpack_from, []
        for _ in range(count):
            (length,) = unpack(view, offset)
            offset += 8
            if offset + length > end:
                raise HeaderError("a string runs past the end of the file")
            texts.append(str(view[offset : offset + length], "utf-8"))
            offset += length
        self.offset = offset
        return texts


class GGUFFile:
    """The file's metadata (`metadata`, plain values; arrays of arrays left out), its
    tensors, and the mapping (`data`, a read-only uint8 memmap of the whole file)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.data = np.memmap(self.path, dtype=np.uint8, mode="r")
        try:
            self._parse(_Cursor(self.data))
        except (struct.error, UnicodeDecodeError, OverflowError) as error:
            raise HeaderError(str(error)) from error

    def _parse(self, cursor: _Cursor) -> None:
        if bytes(cursor.buffer[:4]) != b"GGUF":
            raise HeaderError("no GGUF magic")
        cursor.offset = 4
        version = cursor.unpack("I")
        if version not in (2, 3):
            raise HeaderError(f"GGUF version {version} (this reader knows 2 and 3, little-endian)")
        n_tensors, n_kv = cursor.unpack("Q"), cursor.unpack("Q")
        self.metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cursor.string()
            value = cursor.value(cursor.unpack("I"))
            if value is not None:
                self.metadata[key] = value
        infos = []
        for _ in range(n_tensors):
            name = cursor.string()
            dims = [cursor.unpack("Q") for _ in range(cursor.unpack("I"))]
            infos.append((name, dims, cursor.unpack("I"), cursor.unpack("Q")))
        alignment = int(self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        if alignment <= 0 or alignment & (alignment - 1):
            raise HeaderError(f"general.alignment {alignment} is not a power of two")
        start = -(-cursor.offset // alignment) * alignment
        self.tensors = [self._tensor(start, *info) for info in infos]
        if len({t.name for t in self.tensors}) != len(self.tensors):
            raise HeaderError("two tensors share a name")

    def _tensor(self, start: int, name: str, dims: list[int], raw_type: int, offset: int):
        try:
            kind = GGMLQuantizationType(raw_type)
        except ValueError:
            raise HeaderError(f"tensor {name} has unknown type {raw_type}") from None
        block, type_size = GGML_QUANT_SIZES[kind]
        elements = int(np.prod(dims, dtype=np.int64))
        if dims and dims[0] % block:
            raise HeaderError(f"tensor {name}: a row of {dims[0]} is not whole blocks of {block}")
        n_bytes = elements * type_size // block
        at = start + offset
        if at + n_bytes > self.data.size:
            raise HeaderError(f"tensor {name} is cut off")
        numpy_dims = tuple(reversed(dims))
        item = _ITEMS.get(kind)
        if item is None:  # blocks: the last dimension in bytes
            numpy_dims = (*numpy_dims[:-1], numpy_dims[-1] // block * type_size)
            view = self.data[at : at + n_bytes]
        else:
            view = self.data[at : at + n_bytes].view(item)
        return GGUFTensor(
            name,
            kind,
            np.array(dims, dtype=np.uint64),
            elements,
            n_bytes,
            at,
            np.asarray(view).reshape(numpy_dims),
        )
