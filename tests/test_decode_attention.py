"""`hk.attention_spans`: several sequences' rows of one batch attend over their own caches in one
call (a decode step of k sequences is one dispatch), each span with the bits of its own
`hk.attention` call and each row with the bits of a call of its own (several rows share a work
item when a span has enough of them); bad spans are refused before anything is written. Also the
cache writes beside it (`hk.store_f16`): numpy's f16 bits, without numpy's slow cast."""

from __future__ import annotations

import hyserve_kernels as hk
import numpy as np
import pytest


def cache(rng: np.random.Generator, n: int, n_kv: int, hd: int) -> tuple[np.ndarray, np.ndarray]:
    k, v = (rng.standard_normal((n, n_kv, hd)).astype(np.float16).view(np.uint16) for _ in range(2))
    return k, v


@pytest.mark.parametrize(("n_head", "n_kv", "hd"), [(4, 1, 256), (8, 2, 64), (6, 3, 40)])
@pytest.mark.parametrize("window", [0, 5])
def test_each_span_has_the_bits_of_its_own_call(n_head: int, n_kv: int, hd: int, window: int) -> None:
    """Spans of 1 row (decode) and several rows (a prompt chunk beside them), caches of different
    lengths, a row left outside every span (an empty segment): untouched."""
    rng = np.random.default_rng(n_head * hd + window)
    lengths, span_rows = [9, 40, 17, 3], [(0, 1), (1, 2), (2, 7), (8, 9)]
    rows = 9
    q = rng.standard_normal((rows, n_head, hd)).astype(np.float32)
    caches = [cache(rng, n, n_kv, hd) for n in lengths]
    jobs = []
    for (r0, r1), n, (k, v) in zip(span_rows, lengths, caches):
        pos = np.arange(n - (r1 - r0), n, dtype=np.int32)  # the span's rows are the cache's last
        jobs.append((r0, r1, k, v, pos))
    out = np.full((rows, n_head * hd), 7.0, np.float32)
    hk.attention_spans(q, jobs, out, window, 1.0)
    for r0, r1, k, v, pos in jobs:
        alone = hk.attention(q[r0:r1], k, v, pos, window)
        np.testing.assert_array_equal(out[r0:r1], alone.reshape(r1 - r0, -1))
        for i in range(r0, r1):  # a row alone (one row per work item) gives the same bits
            one = hk.attention(q[i : i + 1], k, v, pos[i - r0 : i - r0 + 1], window)
            np.testing.assert_array_equal(out[i], one.reshape(-1))
    np.testing.assert_array_equal(out[7], np.full(n_head * hd, 7.0, np.float32))


@pytest.mark.parametrize("window", [0, 100])
@pytest.mark.parametrize(("n_head", "n_kv", "hd"), [(8, 2, 256), (4, 4, 64), (6, 3, 40)])
def test_prompt_blocks_over_several_key_chunks_keep_each_rows_bits(
    n_head: int, n_kv: int, hd: int, window: int
) -> None:
    """A prompt's rows go in blocks of 8 that share each chunk of keys and values (32 KiB of one KV
    head: 64 keys of 256 dims, 256 of 64); a row alone takes its keys in one pass. Across chunk
    boundaries, sliding windows, a last block of fewer rows and rows out of position order, every
    row keeps the bits of its own call, on the SIMD and the scalar path alike."""
    rng = np.random.default_rng(n_head + hd + window)
    n, rows = 300, 27
    q = rng.standard_normal((rows, n_head, hd)).astype(np.float32) * 0.3
    k, v = cache(rng, n, n_kv, hd)
    pos = rng.permutation(np.arange(n - 60, n, dtype=np.int32))[:rows]
    got = hk.attention(q, k, v, pos, window)
    for i in range(rows):
        one = hk.attention(q[i : i + 1], k, v, pos[i : i + 1], window)
        np.testing.assert_array_equal(got[i], one[0])
    try:
        hk.set_force_scalar(True)
        scalar = hk.attention(q, k, v, pos, window)
    finally:
        hk.set_force_scalar(False)
    np.testing.assert_array_equal(got, scalar)


def test_kq_scale_and_no_spans() -> None:
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, 4, 32)).astype(np.float32)
    k, v = cache(rng, 6, 2, 32)
    pos = np.array([4, 5], np.int32)
    out = np.zeros((2, 128), np.float32)
    hk.attention_spans(q, [(0, 2, k, v, pos)], out, 0, 0.25)
    np.testing.assert_array_equal(out, hk.attention(q, k, v, pos, 0, 0.25).reshape(2, -1))
    before = out.copy()
    hk.attention_spans(q, [], out)
    np.testing.assert_array_equal(out, before)


def test_bad_spans_are_refused_and_write_nothing() -> None:
    rng = np.random.default_rng(4)
    q = rng.standard_normal((3, 4, 32)).astype(np.float32)
    k, v = cache(rng, 6, 2, 32)
    k1, v1 = cache(rng, 6, 1, 32)
    pos1, pos2 = np.array([5], np.int32), np.array([4, 5], np.int32)
    out = np.zeros((3, 128), np.float32)
    bad = {
        "overlap": [(0, 2, k, v, pos2), (1, 2, k, v, pos1)],
        "past the batch": [(2, 4, k, v, pos2)],
        "position past the cache": [(0, 1, k, v, np.array([6], np.int32))],
        "positions not one per row": [(0, 2, k, v, pos1)],
        "different KV heads": [(0, 1, k, v, pos1), (1, 2, k1, v1, pos1)],
        "K and V shapes differ": [(0, 1, k, v1, pos1)],
    }
    for why, jobs in bad.items():
        with pytest.raises(ValueError):
            hk.attention_spans(q, jobs, out)
        assert not out.any(), why
    with pytest.raises(ValueError, match="out must be"):
        hk.attention_spans(q, [(0, 1, k, v, pos1)], np.zeros((3, 64), np.float32))


def test_store_f16_rounds_as_numpy() -> None:
    """Cache writes round in the kernel wheel (F16C, to nearest even): the bits of numpy's cast for
    normal, subnormal, tie, overflowing and signed-zero values, at lengths with a scalar tail."""
    rng = np.random.default_rng(6)
    ties = (np.arange(1, 200, dtype=np.float32) * np.float32(2**-11) + np.float32(2**-12)).astype(np.float32)
    special = np.array([0.0, -0.0, 65504.0, 65520.0, 1e6, -1e6, 6e-8, -3e-8, 1e-9, np.inf, -np.inf], np.float32)
    for x in (rng.standard_normal(1003).astype(np.float32) * 300, ties, special, np.ones(7, np.float32)):
        dst = np.empty(len(x), np.float16)
        hk.store_f16(x, dst.view(np.uint16))
        with np.errstate(over="ignore"):  # numpy warns where the value overflows to inf
            want = x.astype(np.float16)
        np.testing.assert_array_equal(dst.view(np.uint16), want.view(np.uint16))
    with pytest.raises(ValueError, match="values"):
        hk.store_f16(np.zeros(4, np.float32), np.zeros(5, np.uint16))


def test_cache_writes_keep_numpy_bits_and_wrap_the_ring() -> None:
    from hyserve.model.memory import KVCache, WindowCache

    rng = np.random.default_rng(7)
    k, v = (rng.standard_normal((13, 2, 16)).astype(np.float32) for _ in range(2))
    flat = KVCache(32, 2, 16)
    flat.write(5, k, v)
    np.testing.assert_array_equal(flat.k[5:18].view(np.uint16), k.astype(np.float16).view(np.uint16))
    np.testing.assert_array_equal(flat.v[5:18].view(np.uint16), v.astype(np.float16).view(np.uint16))
    ring = WindowCache(24, 8, 2, 16)
    ring.write(17, k, v)  # positions 17..29: ring slots 17..23 then 0..5
    got_k, got_v = ring.read(17, 30)
    np.testing.assert_array_equal(got_k.view(np.uint16), k.astype(np.float16).view(np.uint16))
    np.testing.assert_array_equal(got_v.view(np.uint16), v.astype(np.float16).view(np.uint16))
