"""Memory-mapped GGUF reader.

Uses the `gguf` package's format knowledge (value types, ggml type ids, block sizes) but parses the
header itself: `gguf.GGUFReader` builds a numpy view per array element, which takes ~19 s on a
262k-entry vocabulary. Tensor data stays in the memory map; `TensorInfo.data` is a zero-copy view
that the Rust kernels read directly.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGMLQuantizationType, GGUFValueType
from hyserve_kernels import gguf_string_array


class GGUFError(ValueError):
    """A GGUF file that cannot be used; the message names the file and the problem."""


_SCALAR_FORMATS: dict[GGUFValueType, str] = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}
_NUMPY_DTYPES: dict[GGUFValueType, str] = {
    GGUFValueType.UINT8: "<u1",
    GGUFValueType.INT8: "<i1",
    GGUFValueType.UINT16: "<u2",
    GGUFValueType.INT16: "<i2",
    GGUFValueType.UINT32: "<u4",
    GGUFValueType.INT32: "<i4",
    GGUFValueType.FLOAT32: "<f4",
    GGUFValueType.BOOL: "<u1",
    GGUFValueType.UINT64: "<u8",
    GGUFValueType.INT64: "<i8",
    GGUFValueType.FLOAT64: "<f8",
}
# Sanity limits: a corrupt count must fail fast instead of allocating or looping for minutes.
_MAX_DIMS = 8
_MAX_ELEMENTS = 2**63 - 1  # ggml counts elements in int64
_MAX_ARRAY_DEPTH = 8  # llama.cpp reads no nested arrays at all; allow a few


@dataclass(frozen=True)
class TensorInfo:
    name: str
    ggml_type: GGMLQuantizationType
    shape: tuple[int, ...]  # ggml order: shape[0] is the contiguous axis
    data: np.ndarray  # uint8 view into the file's memory map

    @property
    def n_rows(self) -> int:
        return math.prod(self.shape[1:])

    @property
    def row_len(self) -> int:
        return self.shape[0]


class _Cursor:
    """Bounds-checked little-endian reads from a buffer; errors name the file."""

    def __init__(self, buf: memoryview, path: Path) -> None:
        self.buf = buf
        self.pos = 0
        self.path = path

    def fail(self, problem: str) -> GGUFError:
        return GGUFError(f"{self.path}: {problem}")

    def take(self, n: int) -> memoryview:
        end = self.pos + n
        if n < 0 or end > len(self.buf):
            raise self.fail(f"truncated file (needed {n} bytes at offset {self.pos}, size {len(self.buf)})")
        view = self.buf[self.pos : end]
        self.pos = end
        return view

    def scalar(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise self.fail(f"truncated file (needed {size} bytes at offset {self.pos}, size {len(self.buf)})")
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        n = self.scalar("<Q")
        raw = self.take(n)
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail(f"invalid UTF-8 in a string at offset {self.pos - n}") from exc

    def value_type(self) -> GGUFValueType:
        raw = self.scalar("<I")
        try:
            return GGUFValueType(raw)
        except ValueError:
            raise self.fail(f"unknown metadata value type {raw} at offset {self.pos - 4}") from None

    def value(self, vtype: GGUFValueType) -> Any:
        if vtype == GGUFValueType.STRING:
            return self.string()
        if vtype == GGUFValueType.ARRAY:
            return self.array()
        return self.scalar(_SCALAR_FORMATS[vtype])

    def array(self, depth: int = 1) -> Any:
        if depth > _MAX_ARRAY_DEPTH:  # each level costs 12 bytes: a small file could recurse ~forever
            raise self.fail(f"metadata arrays nested deeper than {_MAX_ARRAY_DEPTH} at offset {self.pos}")
        elem = self.value_type()
        count = self.scalar("<Q")
        if count > len(self.buf):
            raise self.fail(
                f"truncated or corrupt file: an array of {count} elements cannot fit in {len(self.buf)} bytes"
            )
        if elem == GGUFValueType.STRING:
            return self.string_array(count)
        if elem == GGUFValueType.ARRAY:
            return [self.array(depth + 1) for _ in range(count)]
        dtype = np.dtype(_NUMPY_DTYPES[elem])
        raw = self.take(count * dtype.itemsize)
        values = np.frombuffer(raw, dtype=dtype).copy()
        return values.astype(bool) if elem == GGUFValueType.BOOL else values

    def string_array(self, count: int) -> list[str]:
        # Vocabularies: hundreds of thousands of strings, decoded by the kernel wheel in one call
        try:
            out, self.pos = gguf_string_array(np.frombuffer(self.buf, dtype=np.uint8), self.pos, count)
        except ValueError as exc:
            raise self.fail(str(exc)) from None
        return out


class GGUFFile:
    """A parsed GGUF header plus zero-copy tensor views. Keep the object alive while views are used."""

    def __init__(self, path: Path, metadata: dict[str, Any], tensors: dict[str, TensorInfo], mmap: np.ndarray) -> None:
        self.path = path
        self.metadata = metadata
        self.tensors = tensors
        self._mmap = mmap

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise GGUFError(f"{self.path}: missing general.architecture")
        return arch

    def tensor(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise GGUFError(f"{self.path}: missing tensor {name!r}") from None

    @classmethod
    def open(cls, path: str | Path) -> GGUFFile:
        path = Path(path)
        if path.is_dir():
            raise GGUFError(f"{path}: is a directory, not a GGUF file")
        if not path.is_file():
            raise GGUFError(f"{path}: no such file")
        if path.stat().st_size < 24:
            raise GGUFError(f"{path}: too small to be a GGUF file ({path.stat().st_size} bytes)")
        mmap = np.memmap(path, dtype=np.uint8, mode="r")
        cur = _Cursor(memoryview(mmap), path)  # type: ignore[arg-type]
        magic = cur.scalar("<I")
        if magic != GGUF_MAGIC:
            raise cur.fail("not a GGUF file (bad magic)")
        version = cur.scalar("<I")
        if version not in (2, 3):
            raise cur.fail(f"unsupported GGUF version {version}")
        n_tensors = cur.scalar("<Q")
        n_kv = cur.scalar("<Q")
        if n_tensors > len(mmap) or n_kv > len(mmap):
            raise cur.fail(f"corrupt header ({n_tensors} tensors, {n_kv} metadata keys)")

        metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cur.string()
            metadata[key] = cur.value(cur.value_type())

        infos = []
        for _ in range(n_tensors):
            name = cur.string()
            n_dims = cur.scalar("<I")
            if not 1 <= n_dims <= _MAX_DIMS:
                raise cur.fail(f"tensor {name!r} has {n_dims} dimensions")
            shape = tuple(cur.scalar("<Q") for _ in range(n_dims))
            raw_type = cur.scalar("<I")
            offset = cur.scalar("<Q")
            try:
                ggml_type = GGMLQuantizationType(raw_type)
            except ValueError:
                raise cur.fail(f"tensor {name!r} has unknown ggml type {raw_type}") from None
            infos.append((name, ggml_type, shape, offset))

        alignment = metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or isinstance(alignment, bool):
            raise cur.fail(f"general.alignment must be an integer, not {type(alignment).__name__}")
        if alignment <= 0 or alignment & (alignment - 1):
            raise cur.fail(f"general.alignment {alignment} is not a power of two")
        data_start = (cur.pos + alignment - 1) // alignment * alignment

        tensors: dict[str, TensorInfo] = {}
        for name, ggml_type, shape, offset in infos:
            block, type_size = GGML_QUANT_SIZES[ggml_type]
            if shape[0] % block:
                raise cur.fail(f"tensor {name!r}: row length {shape[0]} is not a multiple of {block}")
            # Python ints: an int64 product of a corrupt shape can wrap to a small size and pass
            n_elements = math.prod(shape)
            if n_elements > _MAX_ELEMENTS or max(shape) > _MAX_ELEMENTS:
                raise cur.fail(f"tensor {name!r}: shape {list(shape)} has more elements than any file can hold")
            n_bytes = n_elements // block * type_size
            start = data_start + offset
            if start + n_bytes > len(mmap):
                raise cur.fail(
                    f"truncated file: tensor {name!r} needs bytes {start}..{start + n_bytes}, file has {len(mmap)}"
                )
            tensors[name] = TensorInfo(name, ggml_type, shape, mmap[start : start + n_bytes])
        return cls(path, metadata, tensors, mmap)
