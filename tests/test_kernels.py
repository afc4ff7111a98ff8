"""Rust kernels against numpy references (gguf's quantizers/dequantizers), on the SIMD and scalar paths."""

from __future__ import annotations

import ctypes
import functools
import os
import time
from collections.abc import Iterator
from pathlib import Path

import hyserve_kernels as hk
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants
from simd_paths import run_on_simd_path

Q = GGMLQuantizationType
LEGACY = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0]
KQUANTS = [Q.Q4_K, Q.Q5_K, Q.Q6_K]
FLOATS = [Q.F32, Q.F16, Q.BF16]
ALL_TYPES = FLOATS + LEGACY + KQUANTS


@pytest.fixture(params=["avx512vnni", "avx2", "scalar"])
def simd_path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each kernel path this CPU has (all give the same bits)."""
    yield from run_on_simd_path(request.param)


def test_simd_ceiling_caps_the_path_and_refuses_unknown_names() -> None:
    best = hk.simd_path()
    try:
        assert hk.set_simd_ceiling("scalar") == "scalar" == hk.simd_path()
        assert hk.set_simd_ceiling("avx2") in ("avx2", "scalar")
        with pytest.raises(ValueError, match="unknown kernel path"):
            hk.set_simd_ceiling("avx1024")
        assert hk.simd_path() in ("avx2", "scalar")  # a refused name leaves the cap as it was
    finally:
        hk.set_force_scalar(False)
    assert hk.simd_path() == best


def random_weight_bytes(t: GGMLQuantizationType, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Quantized weight bytes: through gguf's quantizer where it has one, else random valid blocks."""
    if t in FLOATS or t in LEGACY:
        w = rng.standard_normal((rows, cols)).astype(np.float32)
        return np.ascontiguousarray(quants.quantize(w, t)).reshape(-1).view(np.uint8)
    block, size = GGML_QUANT_SIZES[t]
    raw = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    scale = (rng.random((rows, cols // block)) * 0.01 + 0.001).astype(np.float16).view(np.uint8)
    if t == Q.Q6_K:
        raw[..., 208:210] = scale.reshape(rows, cols // block, 2)
    else:
        raw[..., 0:2] = scale.reshape(rows, cols // block, 2)
        mins = (rng.random((rows, cols // block)) * 0.01).astype(np.float16).view(np.uint8)
        raw[..., 2:4] = mins.reshape(rows, cols // block, 2)
    return raw.reshape(-1)


def dequantize(t: GGMLQuantizationType, data: np.ndarray, rows: int, cols: int) -> np.ndarray:
    return quants.dequantize(data.reshape(rows, -1), t).astype(np.float64).reshape(rows, cols)


def f16_round(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float64)


def reference_activations(t: GGMLQuantizationType, x: np.ndarray) -> np.ndarray:
    """The activations as llama.cpp's x86 path converts them for weight type t, dequantized."""
    if t == Q.F32:
        return x.astype(np.float64)
    if t == Q.F16:
        return f16_round(x)
    if t == Q.BF16:
        return quants.dequantize(quants.quantize(x, Q.BF16), Q.BF16).astype(np.float64)
    if t in KQUANTS:  # Q8_K: signed max, iscale = -127/max, round half to even
        blocks = x.reshape(-1, 256).astype(np.float32)
        idx = np.argmax(np.abs(blocks), axis=1)
        signed_max = blocks[np.arange(len(blocks)), idx]
        with np.errstate(divide="ignore"):
            iscale = np.where(signed_max != 0, np.float32(-127.0) / signed_max, 0).astype(np.float32)
        q = np.minimum(np.rint(blocks * iscale[:, None]), 127)
        with np.errstate(divide="ignore"):
            d = np.where(iscale != 0, np.float32(1.0) / iscale, 0).astype(np.float32)
        return (q * d[:, None].astype(np.float64)).reshape(x.shape)
    blocks = x.reshape(-1, 32).astype(np.float32)  # Q8_0 / Q8_1: id = 127/amax, round half even
    amax = np.abs(blocks).max(axis=1)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127.0) / amax, 0).astype(np.float32)
    q = np.rint(blocks * inv[:, None])
    d = f16_round((amax / np.float32(127.0)).astype(np.float32))
    return (q * d[:, None]).reshape(x.shape)


def q8_1_min_correction(t: GGMLQuantizationType, data: np.ndarray, rows: int, x: np.ndarray) -> np.ndarray:
    """Q4_1/Q5_1 add `m * s` per block, where Q8_1 stores s = f16(d * sum(q)) rounded to f16."""
    blocks = x.reshape(len(x), -1, 32).astype(np.float32)
    amax = np.abs(blocks).max(axis=2)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127.0) / amax, 0).astype(np.float32)
    qsum = np.rint(blocks * inv[..., None]).sum(axis=2)
    s_rounded = f16_round((amax / np.float32(127.0) * qsum).astype(np.float32))
    exact = qsum * f16_round((amax / np.float32(127.0)).astype(np.float32))
    mins = data.reshape(rows, -1, GGML_QUANT_SIZES[t][1])[..., 2:4].copy().view(np.float16)[..., 0]
    return (s_rounded - exact) @ mins.astype(np.float64).T


def weight_and_input(t: GGMLQuantizationType, rows: int, cols: int, m: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    data = random_weight_bytes(t, rows, cols, rng)
    x = rng.standard_normal((m, cols)).astype(np.float32)
    return hk.QMatrix(data, int(t), rows, cols), data, x


def cols_for(t: GGMLQuantizationType) -> int:
    return {1: 45, 32: 96, 256: 512}[GGML_QUANT_SIZES[t][0]]


@pytest.mark.parametrize("t", ALL_TYPES, ids=lambda t: t.name)
def test_dequantize_matches_gguf(t: GGMLQuantizationType) -> None:
    rows, cols = 5, cols_for(t)
    w, data, _ = weight_and_input(t, rows, cols, 1)
    np.testing.assert_array_equal(hk.get_rows(w), dequantize(t, data, rows, cols).astype(np.float32))
    ids = np.array([4, 0, 4], dtype=np.int32)
    np.testing.assert_array_equal(hk.get_rows(w, ids), hk.get_rows(w)[ids])


@pytest.mark.parametrize("t", ALL_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("rows,m", [(37, 1), (70, 3), (16, 7)])
def test_matmul_matches_reference(t: GGMLQuantizationType, rows: int, m: int, simd_path: str) -> None:
    cols = cols_for(t)
    w, data, x = weight_and_input(t, rows, cols, m, seed=rows + m)
    ref = reference_activations(t, x) @ dequantize(t, data, rows, cols).T
    if t in (Q.Q4_1, Q.Q5_1):
        ref += q8_1_min_correction(t, data, rows, x)
    got = hk.matmul(w, x)
    scale = np.abs(reference_activations(t, x)) @ np.abs(dequantize(t, data, rows, cols)).T
    assert got.shape == (m, rows)
    assert np.max(np.abs(got - ref) / (scale + 1e-6)) < 2e-5


@pytest.mark.parametrize("t", ALL_TYPES, ids=lambda t: t.name)
def test_matmul_is_batch_invariant(t: GGMLQuantizationType, simd_path: str) -> None:
    """Every decode batch size k = 1..16 (the multi-row streaming path's register blocks and their
    remainders) and prompt-sized batches give each row the bits of its one-row product."""
    cols = cols_for(t)
    w, _, x = weight_and_input(t, 33, cols, 21)
    full = hk.matmul(w, x)
    for i in range(len(x)):
        np.testing.assert_array_equal(hk.matmul(w, x[i : i + 1])[0], full[i])
    for k in range(2, 18):
        np.testing.assert_array_equal(hk.matmul(w, x[3 : 3 + k]), full[3 : 3 + k], err_msg=f"k={k}")


def test_matmul_many_equals_separate_calls(simd_path: str) -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 512)).astype(np.float32)
    ws = [
        hk.QMatrix(random_weight_bytes(t, r, 512, rng), int(t), r, 512)
        for t, r in [(Q.Q5_0, 20), (Q.Q8_0, 7), (Q.Q4_K, 9), (Q.F16, 3)]
    ]
    for w, y in zip(ws, hk.matmul_many(ws, x)):
        np.testing.assert_array_equal(y, hk.matmul(w, x))


Q8K_BYTES = 4 + 256 + 2 * 16  # block_q8_K: f32 d, 256 x i8, 16 x i16 block sums
GGML_K_DOTS = {Q.Q4_K: "ggml_vec_dot_q4_K_q8_K", Q.Q5_K: "ggml_vec_dot_q5_K_q8_K", Q.Q6_K: "ggml_vec_dot_q6_K_q8_K"}


@functools.cache
def ggml_cpu() -> ctypes.CDLL | None:
    """llama.cpp's CPU backend from the oracle wheel (llama-cpp-python), or None where it is absent
    or does not export the K-quant dot products and the Q8_K quantizer."""
    try:
        import llama_cpp
    except ImportError:
        return None
    lib = Path(llama_cpp.__file__).parent / "lib"
    try:
        ctypes.CDLL(str(lib / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
        cpu = ctypes.CDLL(str(lib / "libggml-cpu.so"))
    except OSError:
        return None
    if not all(hasattr(cpu, name) for name in [*GGML_K_DOTS.values(), "quantize_row_q8_K", "ggml_cpu_init"]):
        return None
    cpu.ggml_cpu_init()
    cpu.quantize_row_q8_K.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    for name in GGML_K_DOTS.values():
        getattr(cpu, name).argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        getattr(cpu, name).argtypes += [ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return cpu


@pytest.fixture
def ggml() -> ctypes.CDLL:
    cpu = ggml_cpu()
    if cpu is None:
        pytest.skip("llama.cpp's CPU library (llama-cpp-python) with K-quant vec_dot symbols is not available")
    return cpu


def ggml_quantize_q8k(cpu: ctypes.CDLL, x: np.ndarray) -> np.ndarray:
    """One row through llama.cpp's `quantize_row_q8_K`: raw block_q8_K bytes."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.zeros(len(x) // 256 * Q8K_BYTES, np.uint8)
    cpu.quantize_row_q8_K(x.ctypes.data, out.ctypes.data, len(x))
    return out


def ggml_matmul(cpu: ctypes.CDLL, t: GGMLQuantizationType, data: np.ndarray, rows: int, x: np.ndarray) -> np.ndarray:
    """`x @ W.T` as llama.cpp's plain (not repacked) CPU matmul computes it: each activation row
    quantized to Q8_K, then one `ggml_vec_dot_*_q8_K` per output."""
    cols = x.shape[1]
    data = np.ascontiguousarray(data)
    row_bytes = cols // 256 * GGML_QUANT_SIZES[t][1]
    dot, s = getattr(cpu, GGML_K_DOTS[t]), ctypes.c_float()
    out = np.zeros((len(x), rows), np.float32)
    for i, xr in enumerate(x):
        yq = ggml_quantize_q8k(cpu, xr)
        for r in range(rows):
            dot(cols, ctypes.byref(s), 0, data.ctypes.data + r * row_bytes, 0, yq.ctypes.data, 0, 1)
            out[i, r] = s.value
    return out


def k_test_activations(rng: np.random.Generator, m: int, cols: int) -> np.ndarray:
    """Rows at very different scales, heavy-tailed (large integer lanes), one all-zero block."""
    x = rng.standard_normal((m, cols)) * rng.random((m, cols)) ** 3 * rng.choice([1e-3, 1.0, 40.0], size=(m, 1))
    x[0, :256] = 0.0
    return x.astype(np.float32)


@pytest.mark.parametrize("t", KQUANTS, ids=lambda t: t.name)
@pytest.mark.parametrize("rows,m", [(37, 1), (24, 6), (9, 13)])
def test_kquant_matmul_is_bit_identical_to_llama_cpp(
    t: GGMLQuantizationType, rows: int, m: int, simd_path: str, ggml: ctypes.CDLL
) -> None:
    """Q4_K/Q5_K/Q6_K x Q8_K give llama.cpp's AVX2 `vec_dot` bits on both of our paths (the scalar
    reference emulates its 8 float lanes, FMA per super-block and final reduction order), through
    the multi-row register blocks too."""
    rng = np.random.default_rng(rows * 10 + m)
    cols = 2048
    data = random_weight_bytes(t, rows, cols, rng)
    x = k_test_activations(rng, m, cols)
    got = hk.matmul(hk.QMatrix(data, int(t), rows, cols), x)
    ref = ggml_matmul(ggml, t, data, rows, x)
    np.testing.assert_array_equal(got.view(np.int32), ref.view(np.int32))


def q4k_identity(cols: int) -> np.ndarray:
    """A Q4_K matrix whose row j is the unit vector e_j (d = 1, dmin = 0, all scales 1, mins 0)."""
    blocks = np.zeros((cols, cols // 256, 144), np.uint8)
    blocks[..., 0:2] = np.array([1.0], np.float16).view(np.uint8)
    blocks[..., 4:8] = 1  # scales 0..3 (mins 0..3 stay 0)
    blocks[..., 12:16] = 1  # low nibbles: scales 4..7; high nibbles: mins 4..7 = 0
    for j in range(cols):
        r = j % 256
        blocks[j, j // 256, 16 + 32 * (r // 64) + r % 32] = 1 if r % 64 < 32 else 0x10
    return blocks.reshape(-1)


def test_q8k_activation_quantizer_is_bit_identical_to_llama_cpp(simd_path: str, ggml: ctypes.CDLL) -> None:
    """Our Q8_K activations equal llama.cpp's `quantize_row_q8_K` (d and every quant): through a Q4_K
    identity matrix, where one integer lane is non-zero, every output is exactly f32(d * q)."""
    rng = np.random.default_rng(5)
    cols = 512
    x = k_test_activations(rng, 4, cols)
    x[1, 7] = -np.abs(x[1]).max() * 2  # the signed maximum is negative
    x[2, ::9] = np.float32(0.5) * np.abs(x[2]).max()  # many ties with the maximum's half
    w = hk.QMatrix(q4k_identity(cols), int(Q.Q4_K), cols, cols)
    np.testing.assert_array_equal(hk.get_rows(w), np.eye(cols, dtype=np.float32))
    got = hk.matmul(w, x)
    for row, xr in zip(got, x):
        blocks = ggml_quantize_q8k(ggml, xr).reshape(-1, Q8K_BYTES)
        d = blocks[:, :4].copy().view(np.float32)
        qs = blocks[:, 4:260].view(np.int8).astype(np.float32)
        np.testing.assert_array_equal(row, (d * qs).reshape(-1))  # (+0.0 == -0.0 where q = 0)


def test_qmatrix_rejects_bad_shapes() -> None:
    data = np.zeros(34 * 4, dtype=np.uint8)
    with pytest.raises(ValueError, match="needs"):
        hk.QMatrix(data, int(Q.Q8_0), 5, 32)
    with pytest.raises(ValueError, match="multiple"):
        hk.QMatrix(data, int(Q.Q8_0), 4, 33)
    with pytest.raises(ValueError, match="unsupported"):
        hk.QMatrix(data, 16, 4, 32)
    w = hk.QMatrix(data, int(Q.Q8_0), 4, 32)
    with pytest.raises(ValueError, match="columns"):
        hk.matmul(w, np.zeros((1, 64), np.float32))


def test_rms_norm(simd_path: str) -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 77)).astype(np.float32)
    w = rng.standard_normal(77).astype(np.float32)
    ms = (x.astype(np.float64) ** 2).mean(axis=1).astype(np.float32)
    scale = (1.0 / np.sqrt(ms + np.float32(1e-6))).astype(np.float32)
    np.testing.assert_allclose(hk.rms_norm(x, w, 1e-6), (x * scale[:, None]) * w, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(hk.rms_norm(x, None, 1e-6), x * scale[:, None], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("neox", [True, False])
def test_rope(neox: bool) -> None:
    rng = np.random.default_rng(2)
    n_head, hd, n_rot = 3, 16, 12
    x = rng.standard_normal((4, n_head * hd)).astype(np.float32)
    pos = np.array([0, 1, 17, 1000], dtype=np.int32)
    got = x.copy()
    hk.rope(got, n_head, pos, n_rot, 10000.0, 0.5, neox)
    ref = x.reshape(4, n_head, hd).astype(np.float64).copy()
    inv = 10000.0 ** (-np.arange(0, n_rot, 2) / n_rot)
    for r, p in enumerate(pos):
        ang = p * 0.5 * inv
        c, s = np.cos(ang), np.sin(ang)
        a = np.arange(n_rot // 2) if neox else np.arange(0, n_rot, 2)
        b = a + n_rot // 2 if neox else a + 1
        x0, x1 = ref[r, :, a].copy(), ref[r, :, b].copy()
        ref[r, :, a] = (x0.T * c - x1.T * s).T
        ref[r, :, b] = (x0.T * s + x1.T * c).T
    np.testing.assert_allclose(got.reshape(4, n_head, hd), ref, rtol=1e-3, atol=2e-3)
    np.testing.assert_array_equal(got.reshape(4, n_head, hd)[..., n_rot:], x.reshape(4, n_head, hd)[..., n_rot:])


def test_gelu_uses_fp16_table_and_silu() -> None:
    x = np.concatenate([np.linspace(-12, 12, 2001), [-10.0, 10.0, 0.0]]).astype(np.float32)
    xh = x.astype(np.float16).astype(np.float64)
    table = (0.5 * xh * (1 + np.tanh(np.sqrt(2 / np.pi) * xh * (1 + 0.044715 * xh * xh)))).astype(np.float16)
    ref = np.where(x <= -10, 0.0, np.where(x >= 10, x, table.astype(np.float32)))
    np.testing.assert_allclose(hk.gelu(x), ref, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(hk.silu(x), x / (1 + np.exp(-x.astype(np.float64))), rtol=1e-5, atol=1e-6)
    g, u = np.random.default_rng(0).standard_normal((2, 3, 10)).astype(np.float32)
    np.testing.assert_array_equal(hk.geglu(g, u), (hk.gelu(g.ravel()) * u.ravel()).reshape(3, 10))
    np.testing.assert_array_equal(hk.swiglu(g, u), (hk.silu(g.ravel()) * u.ravel()).reshape(3, 10))


@pytest.mark.parametrize("window", [0, 3])
def test_attention_matches_numpy_and_is_batch_invariant(window: int, simd_path: str) -> None:
    rng = np.random.default_rng(4)
    n_head, n_kv, hd, ctx = 4, 2, 40, 9
    k = rng.standard_normal((ctx, n_kv, hd)).astype(np.float16)
    v = rng.standard_normal((ctx, n_kv, hd)).astype(np.float16)
    q = rng.standard_normal((ctx, n_head, hd)).astype(np.float32) * 0.3
    pos = np.arange(ctx, dtype=np.int32)
    got = hk.attention(q, k.view(np.uint16), v.view(np.uint16), pos, window)
    qh = q.astype(np.float16).astype(np.float64)
    for i, p in enumerate(pos):
        first = max(0, p - window + 1) if window else 0
        for h in range(n_head):
            kv = h // (n_head // n_kv)
            s = k[first : p + 1, kv].astype(np.float64) @ qh[i, h]
            w = np.exp(s - s.max())
            w = (w / w.sum()).astype(np.float16).astype(np.float64)  # llama.cpp multiplies V by f16 probabilities
            np.testing.assert_allclose(got[i, h], w @ v[first : p + 1, kv].astype(np.float64), rtol=1e-4, atol=1e-5)
    for i in range(ctx):  # one row at a time gives identical bits
        one = hk.attention(q[i : i + 1], k.view(np.uint16), v.view(np.uint16), pos[i : i + 1], window)
        np.testing.assert_array_equal(one[0], got[i])


def test_thread_count_does_not_change_results() -> None:
    w, _, x = weight_and_input(Q.Q4_K, 300, 512, 3)
    before = hk.num_threads()
    try:
        hk.set_num_threads(1)
        one = hk.matmul(w, x)
        hk.set_num_threads(2)
        np.testing.assert_array_equal(hk.matmul(w, x), one)
    finally:
        hk.set_num_threads(before)
    with pytest.raises(ValueError):
        hk.set_num_threads(0)


def kernel_threads_cpu_s() -> float:
    """CPU seconds used so far by this process's kernel pool threads (`hyserve-kernel-*`)."""
    total = 0
    for task in Path("/proc/self/task").iterdir():
        try:
            if not (task / "comm").read_text().startswith("hyserve-kernel"):
                continue
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (stat fields 14 and 15)
    return total / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads per-thread CPU time from /proc")
def test_kernel_threads_park_when_idle() -> None:
    """After a kernel call the pool's other threads spin for the next call only briefly
    (`threads.rs::keep_warm`, 300 us), then park: idle, they burn no CPU."""
    w, _, x = weight_and_input(Q.Q4_K, 300, 512, 3)
    before = hk.num_threads()
    try:
        hk.set_num_threads(2)
        hk.matmul(w, x)
        cpu = kernel_threads_cpu_s()
        time.sleep(0.5)
        assert kernel_threads_cpu_s() - cpu < 0.2
    finally:
        hk.set_num_threads(before)


def test_attention_paths_are_bit_identical() -> None:
    """The scalar attention emulates the AVX2 lane order exactly (f16 products are exact in f32)."""
    rng = np.random.default_rng(5)
    k = rng.standard_normal((40, 1, 64)).astype(np.float16)
    v = rng.standard_normal((40, 1, 64)).astype(np.float16)
    q = rng.standard_normal((40, 4, 64)).astype(np.float32)
    pos = np.arange(40, dtype=np.int32)
    try:
        hk.set_force_scalar(True)
        scalar = hk.attention(q, k.view(np.uint16), v.view(np.uint16), pos, 16)
    finally:
        hk.set_force_scalar(False)
    np.testing.assert_array_equal(hk.attention(q, k.view(np.uint16), v.view(np.uint16), pos, 16), scalar)


@pytest.mark.parametrize(
    ("n_head", "n_kv", "hd", "q_scale"),
    [(8, 1, 72, 1.0), (8, 2, 64, 1.0), (6, 3, 40, 1.0), (4, 4, 24, 1.0), (4, 1, 256, 1.0), (4, 2, 256, 12.0)],
)
def test_grouped_heads_give_each_head_its_own_bits(n_head: int, n_kv: int, hd: int, q_scale: float) -> None:
    """Query heads sharing a KV head are computed together (4 or 2 per work item when there are
    enough rows, one alone otherwise), softmax 8 scores at a time; each head's bits equal the
    scalar one-head loop's, for a whole prompt and for each of its rows alone (where the grouping
    differs). `q_scale` 12 spreads the scores past exp's underflow range (its slow lanes)."""
    rng = np.random.default_rng(n_head * hd + n_kv)
    ctx = 37
    k = rng.standard_normal((ctx, n_kv, hd)).astype(np.float16)
    v = rng.standard_normal((ctx, n_kv, hd)).astype(np.float16)
    q = rng.standard_normal((ctx, n_head, hd)).astype(np.float32) * np.float32(q_scale)
    pos = np.arange(ctx, dtype=np.int32)
    ku, vu = k.view(np.uint16), v.view(np.uint16)
    for window in (0, 11):
        try:
            hk.set_force_scalar(True)
            scalar = hk.attention(q, ku, vu, pos, window)
        finally:
            hk.set_force_scalar(False)
        np.testing.assert_array_equal(hk.attention(q, ku, vu, pos, window), scalar)
        for i in (0, 8, 17, ctx - 1):
            np.testing.assert_array_equal(hk.attention(q[i : i + 1], ku, vu, pos[i : i + 1], window)[0], scalar[i])


def test_cancel_flag_stops_a_matmul_and_is_per_flag() -> None:
    w, _, x = weight_and_input(Q.Q5_0, 300, 96, 8)
    mine, other = hk.CancelFlag(), hk.CancelFlag()
    np.testing.assert_array_equal(hk.matmul(w, x, cancel=mine), hk.matmul(w, x))
    mine.set()
    assert mine.is_set() and bool(mine) and not other.is_set()
    with pytest.raises(hk.Cancelled):
        hk.matmul(w, x, cancel=mine)
    with pytest.raises(hk.Cancelled):
        hk.matmul_many([w, w], x, cancel=mine)
    np.testing.assert_array_equal(hk.matmul(w, x, cancel=other), hk.matmul(w, x))
