"""A GGUF writer that can also write wrong files, and hypothesis strategies over GGUF structure.

The writer takes the parts of a file as plain values (header counts may disagree with the lists,
value types may disagree with the values, strings may be invalid UTF-8), so the strategies reach
every branch of a parser: the header, metadata of every value type (arrays of every element type,
nested arrays), the tensor table, alignment and data; then byte-level damage on top (truncation,
bit flips, a count or offset overwritten with an extreme value).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace
from typing import Any

from gguf import GGUF_MAGIC, GGMLQuantizationType, GGUFValueType
from hypothesis import strategies as st

V = GGUFValueType
_SCALAR = {
    V.UINT8: "<B",
    V.INT8: "<b",
    V.UINT16: "<H",
    V.INT16: "<h",
    V.UINT32: "<I",
    V.INT32: "<i",
    V.FLOAT32: "<f",
    V.BOOL: "<B",
    V.UINT64: "<Q",
    V.INT64: "<q",
    V.FLOAT64: "<d",
}
_RANGE = {"B": (0, 255), "b": (-128, 127), "H": (0, 2**16 - 1), "h": (-(2**15), 2**15 - 1)}
_RANGE |= {"I": (0, 2**32 - 1), "i": (-(2**31), 2**31 - 1), "Q": (0, 2**64 - 1), "q": (-(2**63), 2**63 - 1)}
EXTREME_U64 = [0, 1, 2, 3, 31, 32, 255, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**62, 2**63 - 1, 2**63, 2**64 - 1]

# keys a loader reads (so values of the wrong type or range reach real code), plus random ones
KNOWN_KEYS = [
    "general.architecture",
    "general.alignment",
    "general.name",
    "general.file_type",
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.scores",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.add_bos_token",
    "tokenizer.chat_template",
]


@dataclass(frozen=True)
class KV:
    key: bytes
    vtype: int  # a GGUFValueType, or any u32 for an unknown type
    value: Any  # scalars; bytes for STRING; (elem_type, [items]) for ARRAY


@dataclass(frozen=True)
class TensorEntry:
    name: bytes
    dims: tuple[int, ...]
    ggml_type: int
    offset: int


@dataclass(frozen=True)
class GGUFParts:
    kvs: tuple[KV, ...] = ()
    tensors: tuple[TensorEntry, ...] = ()
    data: bytes = b""
    magic: int = GGUF_MAGIC
    version: int = 3
    n_tensors: int | None = None  # None: the real count
    n_kv: int | None = None
    alignment: int = 32  # where the data section starts (the file's general.alignment, if any, is a kv)


def _u32(n: int) -> bytes:
    return struct.pack("<I", n & 0xFFFFFFFF)


def _u64(n: int) -> bytes:
    return struct.pack("<Q", n & 0xFFFFFFFFFFFFFFFF)


def _string(raw: bytes) -> bytes:
    return _u64(len(raw)) + raw


def encode_value(vtype: int, value: Any) -> bytes:
    if vtype == V.STRING:
        return _string(value)
    if vtype == V.ARRAY:
        elem, items = value
        return _u32(elem) + _u64(len(items)) + b"".join(encode_value(elem, item) for item in items)
    try:
        fmt = _SCALAR[V(vtype)]
    except ValueError:  # an unknown type: whatever bytes were drawn
        return bytes(value)
    return struct.pack(fmt, value)


def gguf_bytes(parts: GGUFParts) -> bytes:
    out = bytearray(_u32(parts.magic) + _u32(parts.version))
    out += _u64(len(parts.tensors) if parts.n_tensors is None else parts.n_tensors)
    out += _u64(len(parts.kvs) if parts.n_kv is None else parts.n_kv)
    for kv in parts.kvs:
        out += _string(kv.key) + _u32(kv.vtype) + encode_value(kv.vtype, kv.value)
    for t in parts.tensors:
        out += _string(t.name) + _u32(len(t.dims)) + b"".join(_u64(d) for d in t.dims)
        out += _u32(t.ggml_type) + _u64(t.offset)
    align = max(1, parts.alignment)
    out += b"\0" * (-len(out) % align)
    return bytes(out + parts.data)


# --- strategies ------------------------------------------------------------------------------------


def scalar(vtype: V) -> st.SearchStrategy[Any]:
    fmt = _SCALAR[vtype][1]
    if vtype == V.BOOL:
        return st.integers(0, 255)  # a GGUF bool byte that is neither 0 nor 1 included
    if fmt in "fd":
        return st.floats(width=32 if fmt == "f" else 64, allow_nan=True, allow_infinity=True)
    lo, hi = _RANGE[fmt]
    return st.one_of(st.integers(lo, hi), st.sampled_from([lo, hi, 0, 1]))


strings = st.one_of(
    st.text(max_size=24).map(lambda s: s.encode()),
    st.text(max_size=24).map(lambda s: s.encode()),
    st.text(max_size=24).map(lambda s: s.encode()),
    st.binary(max_size=24),  # invalid UTF-8 too
)


def value(vtype: V, depth: int = 0) -> st.SearchStrategy[Any]:
    if vtype == V.STRING:
        return strings
    if vtype == V.ARRAY:
        elems = [t for t in V if t != V.ARRAY or depth < 2]
        return st.sampled_from(elems).flatmap(
            lambda e: st.tuples(st.just(int(e)), st.lists(value(e, depth + 1), max_size=6))
        )
    return scalar(vtype)


@st.composite
def kvs(draw: st.DrawFn) -> KV:
    key = draw(st.one_of(st.sampled_from(KNOWN_KEYS).map(str.encode), strings))
    if draw(st.integers(0, 40)) == 40:  # an unknown value type
        return KV(key, draw(st.integers(13, 2**32 - 1)), draw(st.binary(max_size=8)))
    vtype = draw(st.sampled_from(list(V)))
    return KV(key, int(vtype), draw(value(vtype)))


ggml_types = st.one_of(
    st.sampled_from([int(t) for t in GGMLQuantizationType]),
    st.integers(0, 2**32 - 1),
)
dims = st.one_of(st.sampled_from([0, 1, 2, 8, 32, 64, 256]), st.sampled_from(EXTREME_U64), st.integers(0, 2**64 - 1))


@st.composite
def tensor_entries(draw: st.DrawFn) -> TensorEntry:
    n_dims = draw(st.one_of(st.integers(1, 4), st.sampled_from([0, 5, 8, 9, 2**31, 2**32 - 1])))
    shape = tuple(draw(dims) for _ in range(min(n_dims, 9)))
    offset = draw(st.one_of(st.sampled_from([0, 32, 64, 2**63]), st.integers(0, 2**64 - 1)))
    return TensorEntry(draw(strings), shape, draw(ggml_types), offset)


@st.composite
def sane_tensors(draw: st.DrawFn) -> tuple[tuple[TensorEntry, ...], bytes]:
    """A valid tensor table and its data (offsets aligned, sizes right), to be damaged later."""
    from gguf import GGML_QUANT_SIZES

    entries, offset = [], 0
    for i in range(draw(st.integers(1, 4))):
        qtype = draw(st.sampled_from(SANE_TYPES))
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
        shape = (block * draw(st.integers(1, 4)), *draw(st.lists(st.integers(1, 4), max_size=2)))
        n_bytes = type_size * (shape[0] // block)
        for d in shape[1:]:
            n_bytes *= d
        entries.append(TensorEntry(f"t{i}.weight".encode(), shape, qtype, offset))
        offset += n_bytes + (-n_bytes % 32)
    return tuple(entries), draw(st.binary(min_size=offset, max_size=offset))


SANE_TYPES = [int(t) for t in (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.Q8_0)]
SANE_TYPES += [int(GGMLQuantizationType.Q4_K), int(GGMLQuantizationType.Q6_K), int(GGMLQuantizationType.BF16)]


@st.composite
def gguf_parts(draw: st.DrawFn) -> GGUFParts:
    if draw(st.integers(0, 3)) < 3:
        tensors, data = draw(sane_tensors())
    else:
        tensors, data = tuple(draw(st.lists(tensor_entries(), max_size=4))), draw(st.binary(max_size=256))
    parts = GGUFParts(kvs=tuple(draw(st.lists(kvs(), max_size=8))), tensors=tensors, data=data)
    odd = draw(st.integers(0, 19))  # hypothesis favours small numbers: 0 is the plain case
    if odd == 19:
        parts = replace(parts, magic=draw(st.integers(0, 2**32 - 1)))
    elif odd == 18:
        parts = replace(parts, version=draw(st.sampled_from([0, 1, 4, 2**32 - 1])))
    elif odd == 17:
        parts = replace(parts, version=2)
    elif odd in (15, 16):
        parts = replace(parts, n_kv=draw(st.sampled_from(EXTREME_U64)))
    elif odd in (13, 14):
        parts = replace(parts, n_tensors=draw(st.sampled_from(EXTREME_U64)))
    return parts


@dataclass(frozen=True)
class Damage:
    truncate_at: int | None  # a fraction of the length, in 1/1000
    flips: tuple[int, ...]  # bit positions past the magic and version, in 1/100000 of the rest
    overwrites: tuple[tuple[int, int], ...]  # (byte position past the magic, in 1/1000 of the rest; u64 written)


no_damage = Damage(None, (), ())
some_damage = st.builds(
    Damage,
    truncate_at=st.one_of(st.none(), st.integers(0, 999)),
    flips=st.lists(st.integers(0, 99_999), max_size=4).map(tuple),
    overwrites=st.lists(st.tuples(st.integers(0, 999), st.sampled_from(EXTREME_U64)), max_size=2).map(tuple),
)
damage = st.one_of(st.just(no_damage), some_damage)  # half the files stay as drawn


def apply_damage(raw: bytes, d: Damage) -> bytes:
    buf = bytearray(raw)
    # magic and version damage is drawn in gguf_parts: here it would hide everything behind them
    for pos, val in d.overwrites:
        if len(buf) >= 12:
            at = 4 + pos * (len(buf) - 11) // 1000
            buf[at : at + 8] = _u64(val)
    for frac in d.flips:
        if len(buf) > 8:
            b = 64 + frac * (len(buf) * 8 - 64) // 100_000
            buf[b // 8] ^= 1 << (b % 8)
    if d.truncate_at is not None:
        del buf[len(buf) * d.truncate_at // 1000 :]
    return bytes(buf)
