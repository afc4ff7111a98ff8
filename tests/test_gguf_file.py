"""GGUF loading: fast, zero-copy, and clear errors for broken or unsupported files."""

from __future__ import annotations

import time
from pathlib import Path

import gguf
import numpy as np
import pytest

from hyserve.model.gguf_file import GGUFError, GGUFFile
from hyserve.model.loader import load_model
from hyserve.model.weights import WeightLoader


def write_gguf(path: Path, arch: str, tensors: dict[str, tuple[np.ndarray, gguf.GGMLQuantizationType | None]]) -> Path:
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    for name, (data, raw_type) in tensors.items():
        w.add_tensor(name, data, raw_dtype=raw_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_default_model_loads_fast_with_zero_copy_tensors(gemma_path: Path) -> None:
    start = time.perf_counter()
    f = GGUFFile.open(gemma_path)
    seconds = time.perf_counter() - start
    assert f.architecture == "gemma3"
    assert len(f.metadata["tokenizer.ggml.tokens"]) == 262144
    emb = f.tensor("token_embd.weight")
    assert emb.ggml_type == gguf.GGMLQuantizationType.Q8_0 and emb.shape == (640, 262144)
    assert not emb.data.flags.owndata  # a view into the memory map, not a copy
    assert seconds < 3.0, f"header parse took {seconds:.2f} s"


def test_metadata_agrees_with_gguf_reader(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "small.gguf", "llama", {"w": (np.arange(64, dtype=np.float32).reshape(2, 32), None)})
    ours = GGUFFile.open(path)
    theirs = gguf.GGUFReader(path)
    for field in theirs.fields.values():
        if field.name.startswith("GGUF."):
            continue
        assert field.name in ours.metadata
    assert ours.metadata["general.architecture"] == "llama"
    np.testing.assert_array_equal(ours.tensor("w").data.view(np.float32), np.arange(64, dtype=np.float32))
    assert ours.tensor("w").shape == (32, 2)


def test_truncated_file_names_file_and_problem(gemma_path: Path, tmp_path: Path) -> None:
    for size in (10, 1000, 5_000_000):
        cut = tmp_path / f"cut{size}.gguf"
        with open(gemma_path, "rb") as src:
            cut.write_bytes(src.read(size))
        with pytest.raises(GGUFError, match=r"cut\d+\.gguf: (truncated|too small)"):
            GGUFFile.open(cut)


def test_corrupt_headers(tmp_path: Path) -> None:
    bad_magic = tmp_path / "magic.gguf"
    bad_magic.write_bytes(b"GGML" + bytes(100))
    with pytest.raises(GGUFError, match="magic.gguf: not a GGUF file"):
        GGUFFile.open(bad_magic)
    huge_count = tmp_path / "count.gguf"
    huge_count.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (2**60).to_bytes(8, "little") + bytes(8) + bytes(64))
    with pytest.raises(GGUFError, match="count.gguf: corrupt header"):
        GGUFFile.open(huge_count)
    bad_type = write_gguf(tmp_path / "vtype.gguf", "llama", {})
    raw = bytearray(bad_type.read_bytes())
    # the first KV's value type follows magic, version, counts and the key string
    key_len = int.from_bytes(raw[24:32], "little")
    raw[32 + key_len : 36 + key_len] = (99).to_bytes(4, "little")
    bad_type.write_bytes(bytes(raw))
    with pytest.raises(GGUFError, match="unknown metadata value type 99"):
        GGUFFile.open(bad_type)
    with pytest.raises(GGUFError, match="no such file"):
        GGUFFile.open(tmp_path / "missing.gguf")


def test_random_garbage_never_crashes(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    for i in range(50):
        junk = tmp_path / f"junk{i}.gguf"
        body = rng.integers(0, 256, size=int(rng.integers(0, 4000)), dtype=np.uint8).tobytes()
        junk.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + body)
        with pytest.raises(GGUFError, match=f"junk{i}.gguf"):
            GGUFFile.open(junk)


def test_unknown_architecture(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "arch.gguf", "frobnicator", {"w": (np.zeros((2, 32), np.float32), None)})
    with pytest.raises(GGUFError, match=r"arch.gguf: architecture 'frobnicator' is not supported"):
        load_model(path)


def test_unsupported_tensor_type(tmp_path: Path) -> None:
    q2k = np.zeros((2, 84), dtype=np.uint8)  # two Q2_K blocks of 256 elements
    path = write_gguf(tmp_path / "q2k.gguf", "gemma3", {"w": (q2k, gguf.GGMLQuantizationType.Q2_K)})
    with pytest.raises(GGUFError, match=r"q2k.gguf: tensor 'w' has type Q2_K, which hyserve does not support"):
        WeightLoader(GGUFFile.open(path)).matrix("w")
