"""Every GPU shader against the CPU kernels on random data, odd shapes included. Runs on any wgpu
adapter (in CI: Mesa's software Vulkan driver); skips only where no adapter exists at all."""

from __future__ import annotations

import hyserve_kernels as hk
import hyserve_kernels._native as native
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.quants import quantize
from gpu_passes import passes_while

FLOAT_AND_LEGACY = [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]
K_QUANTS = [T.Q4_K, T.Q5_K, T.Q6_K]
ALL_TYPES = FLOAT_AND_LEGACY + K_QUANTS


def k_quant_bytes(t: T, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Random K-quant blocks (gguf can only dequantize these) with small, finite f16 scales."""
    size = {T.Q4_K: 144, T.Q5_K: 176, T.Q6_K: 210}[t]
    blocks = rng.integers(0, 256, size=(rows * cols // 256, size), dtype=np.uint8)

    def put_f16(at: int, lo: float, hi: float) -> None:
        blocks[:, at : at + 2] = rng.uniform(lo, hi, len(blocks)).astype(np.float16).view(np.uint8).reshape(-1, 2)

    if t == T.Q6_K:
        put_f16(208, 0.001, 0.01)
    else:
        put_f16(0, 0.001, 0.01)  # d
        put_f16(2, 0.0, 0.01)  # dmin
    return blocks.reshape(-1)


def random_matrix(t: T, rows: int, cols: int, seed: int = 0) -> tuple[hk.QMatrix, np.ndarray]:
    rng = np.random.default_rng(seed)
    if t in K_QUANTS:
        data = k_quant_bytes(t, rows, cols, rng)
    else:
        values = rng.standard_normal((rows, cols)).astype(np.float32)
        data = np.ascontiguousarray(quantize(values, t)).view(np.uint8).reshape(-1)
    m = hk.QMatrix(data, int(t), rows, cols)
    return m, data


def cols_for(t: T) -> int:
    return 512 if t in K_QUANTS else 96


@pytest.mark.parametrize("t", ALL_TYPES, ids=lambda t: t.name)
def test_get_rows_dequantizes_like_the_cpu(gpu_device, t: T) -> None:
    m, _ = random_matrix(t, 37, cols_for(t))
    ids = np.asarray([0, 36, 5, 5, 17], dtype=np.int32)
    gpu = gpu_device.to_host(gpu_device.get_rows(gpu_device.matrix(m), gpu_device.ids(ids)))
    np.testing.assert_allclose(gpu, hk.get_rows(m, ids), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("t", ALL_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n", [1, 3, 9])
def test_matmul_matches_the_cpu(gpu_device, t: T, n: int) -> None:
    cols = cols_for(t)
    m, _ = random_matrix(t, 37, cols, seed=n)
    x = np.random.default_rng(100 + n).standard_normal((n, cols)).astype(np.float32)
    gpu = gpu_device.to_host(gpu_device.matmul(gpu_device.matrix(m), gpu_device.tensor(x)))
    cpu = hk.matmul(m, x)
    if t in (T.F32, T.F16, T.BF16):
        # the CPU sums float formats in f64, the shader in f32 lanes: close, not identical
        np.testing.assert_allclose(gpu, cpu, rtol=2e-5, atol=2e-5 * float(np.abs(cpu).max()))
    else:
        # quantized formats: exact integer block sums and the CPU's fused multiply-adds
        np.testing.assert_array_equal(gpu, cpu)


def test_matmul_is_batch_invariant_and_deterministic(gpu_device) -> None:
    m, _ = random_matrix(T.Q4_K, 70, 512)
    w = gpu_device.matrix(m)
    x = np.random.default_rng(1).standard_normal((11, 512)).astype(np.float32)
    whole = gpu_device.to_host(gpu_device.matmul(w, gpu_device.tensor(x)))
    again = gpu_device.to_host(gpu_device.matmul(w, gpu_device.tensor(x)))
    np.testing.assert_array_equal(whole, again)
    for lo, hi in [(0, 1), (3, 4), (2, 9), (10, 11)]:
        part = gpu_device.to_host(gpu_device.matmul(w, gpu_device.tensor(x[lo:hi])))
        np.testing.assert_array_equal(part, whole[lo:hi])


def test_tensors_split_across_bindings_give_the_same_rows() -> None:
    """Adapters limit one binding (128 MiB on some): big tensors are cut into row chunks."""
    try:
        small = hk.GpuDevice(None, None, allow_software=True, max_binding=1024)
        whole = hk.GpuDevice(None, None, allow_software=True)
    except ValueError as exc:
        pytest.skip(f"no wgpu adapter on this machine: {exc}")
    m, _ = random_matrix(T.Q8_0, 101, 96)  # 102 bytes a row: 10 rows a binding
    assert small.matrix(m).n_bindings == 11 and whole.matrix(m).n_bindings == 1
    x = np.random.default_rng(2).standard_normal((3, 96)).astype(np.float32)
    ids = np.asarray([100, 0, 57, 9, 10], dtype=np.int32)
    for dev in (small, whole):
        w = dev.matrix(m)
        np.testing.assert_array_equal(dev.to_host(dev.get_rows(w, dev.ids(ids))), hk.get_rows(m, ids))
    a = small.to_host(small.matmul(small.matrix(m), small.tensor(x)))
    b = whole.to_host(whole.matmul(whole.matrix(m), whole.tensor(x)))
    np.testing.assert_array_equal(a, b)


def test_rms_norm_over_rows_and_heads(gpu_device) -> None:
    x = np.random.default_rng(3).standard_normal((5, 48)).astype(np.float32)
    for n in (48, 16):
        w = np.random.default_rng(n).standard_normal(n).astype(np.float32)
        gpu = gpu_device.to_host(gpu_device.rms_norm(gpu_device.tensor(x), gpu_device.tensor(w), 1e-6))
        cpu = hk.rms_norm(x.reshape(-1, n), w, 1e-6).reshape(x.shape)
        assert_norm_bits(gpu_device, gpu, cpu)


@pytest.mark.parametrize("fast", [False, True])
def test_a_residual_add_and_its_norm_in_one_pass(gpu_device, gpu_fast_device, fast: bool) -> None:
    """`add_rms_norm`: h += a written back, and the norm of the new h, as `add` then `rms_norm`
    give them on the same device, bit for bit, in both numerics; the exact mode equals the CPU."""
    dev = gpu_fast_device if fast else gpu_device
    rng = np.random.default_rng(21)
    h, a = rng.standard_normal((2, 7, 200)).astype(np.float32)
    w = rng.standard_normal(200).astype(np.float32)
    fused_h, apart_h = dev.tensor(h), dev.tensor(h)
    fused = dev.to_host(dev.add_rms_norm(fused_h, dev.tensor(a), dev.tensor(w), 1e-6))
    dev.add(apart_h, dev.tensor(a))
    apart = dev.to_host(dev.rms_norm(apart_h, dev.tensor(w), 1e-6))
    np.testing.assert_array_equal(dev.to_host(fused_h), dev.to_host(apart_h))
    np.testing.assert_array_equal(fused, apart)
    if not fast:
        assert_norm_bits(dev, fused, hk.rms_norm(h + a, w, 1e-6))
    with pytest.raises(ValueError, match="same tensor"):
        dev.add_rms_norm(fused_h, fused_h, dev.tensor(w), 1e-6)
    with pytest.raises(ValueError, match="add_rms_norm"):
        dev.add_rms_norm(fused_h, dev.tensor(a[:3]), dev.tensor(w), 1e-6)


def assert_norm_bits(dev, gpu: np.ndarray, cpu: np.ndarray) -> None:
    """The norm's sum, 1/sqrt and products round as the CPU's on every adapter (math.wgsl's
    div_rn/sqrt_rn: hardware `/` and `sqrt` may be ulps off); only a subnormal result may be
    flushed to zero, which WGSL allows and real GPUs do (an H100 did)."""
    flushed = (gpu == 0) & (np.abs(cpu) < np.finfo(np.float32).tiny) & (not dev.is_software)
    np.testing.assert_array_equal(np.where(flushed, 0.0, gpu), np.where(flushed, 0.0, cpu))


def test_norm_and_silu_divide_and_take_roots_like_the_cpu(gpu_device) -> None:
    """Many rows (one sqrt and one division each) and SiLU's x / (1 + exp(-x)) over a wide range:
    math.wgsl's correctly rounded division and square root give the CPU's bits."""
    rng = np.random.default_rng(12)
    x = (rng.standard_normal((3000, 8)) * np.exp2(rng.uniform(-40, 40, (3000, 1)))).astype(np.float32)
    gpu = gpu_device.to_host(gpu_device.rms_norm(gpu_device.tensor(x), None, 1e-6, 8))
    assert_norm_bits(gpu_device, gpu, hk.rms_norm(x, None, 1e-6))
    g = (rng.standard_normal((64, 512)) * np.exp2(rng.uniform(-30, 5, (64, 512)))).astype(np.float32)
    u = rng.standard_normal((64, 512)).astype(np.float32)
    got = gpu_device.to_host(gpu_device.swiglu(gpu_device.tensor(g), gpu_device.tensor(u)))
    np.testing.assert_array_equal(got, hk.swiglu(g, u))


def test_rms_norm_sums_exactly_over_wide_ranges(gpu_device) -> None:
    # squares from 2^-140 to 2^120 in one row: the f64 sum of the CPU, the exact integer sum here
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((6, 640)) * np.exp2(rng.integers(-70, 60, (6, 640)))).astype(np.float32)
    x[1, :] = 0.0
    x[2, ::2] = 0.0
    x[3, 5] = np.float32(3e-39)  # a subnormal input
    gpu = gpu_device.to_host(gpu_device.rms_norm(gpu_device.tensor(x), None, 1e-6, 640))
    assert_norm_bits(gpu_device, gpu, hk.rms_norm(x, None, 1e-6))


@pytest.mark.parametrize("fast", [False, True], ids=["exact", "fast"])
@pytest.mark.parametrize("neox", [False, True])
def test_a_norm_turns_its_heads_by_rope_in_the_same_pass(gpu_device, gpu_fast_device, neox: bool, fast: bool) -> None:
    """`rms_norm(..., rope=)`: the heads normalised and turned in one pass are the bits of the
    norm and then `rope`, for whole rows of heads and for the q halves of [q_h | gate_h] rows (the
    gated attention's layout, normalised in place); groups that are not the heads are refused."""
    dev = gpu_fast_device if fast else gpu_device
    rng = np.random.default_rng(31)
    n_head, hd, pos = 3, 16, np.asarray([0, 1, 7, 300, 4095], dtype=np.int32)
    rows = len(pos)
    x = rng.standard_normal((rows, n_head * hd)).astype(np.float32)
    heads = rng.standard_normal((rows * n_head, 2 * hd)).astype(np.float32)
    w = rng.standard_normal(hd).astype(np.float32)
    rot = (n_head, dev.ids(pos), 8, 10000.0, 0.5, neox)
    fused = dev.rms_norm(dev.tensor(x), dev.tensor(w), 1e-6, rope=rot)
    apart = dev.rms_norm(dev.tensor(x), dev.tensor(w), 1e-6)
    dev.rope(apart, *rot)
    np.testing.assert_array_equal(dev.to_host(fused), dev.to_host(apart))
    fused = dev.rms_norm(dev.tensor(heads), dev.tensor(w), 1e-6, hd, hd, rope=rot)
    apart = dev.rms_norm(dev.tensor(heads), dev.tensor(w), 1e-6, hd, hd).reshape(rows, -1)
    dev.rope(apart, *rot)
    np.testing.assert_array_equal(dev.to_host(fused).reshape(rows, -1), dev.to_host(apart))
    with pytest.raises(ValueError, match="RoPE"):
        dev.rms_norm(dev.tensor(x), dev.tensor(w[:8]), 1e-6, rope=rot)


@pytest.mark.parametrize("fast", [False, True], ids=["exact", "fast"])
def test_a_norm_gates_its_output_in_the_same_pass(gpu_device, gpu_fast_device, fast: bool) -> None:
    """`rms_norm(..., gate=)`: the groups normalised and multiplied by silu(gate) in one pass
    are the bits of the norm and then `mul_silu` (the delta net's output: heads of d_v, the gate
    as rows of all heads), in one pass where the two took two; other gates are refused."""
    dev = gpu_fast_device if fast else gpu_device
    rng = np.random.default_rng(37)
    rows, heads, dv = 5, 4, 32
    o = rng.standard_normal((rows, heads, dv)).astype(np.float32)
    z = (rng.standard_normal((rows, heads * dv)) * 4).astype(np.float32)
    w = rng.standard_normal(dv).astype(np.float32)
    o_t, z_t, w_t = dev.tensor(o), dev.tensor(z), dev.tensor(w)
    fused: list = []
    passes = passes_while(dev, lambda: fused.append(dev.rms_norm(o_t, w_t, 1e-6, gate=z_t)))
    assert passes == {"rms_norm_gate": 1}
    apart = dev.rms_norm(o_t, w_t, 1e-6).reshape(rows, heads * dv)
    dev.mul_silu(apart, z_t)
    np.testing.assert_array_equal(dev.to_host(fused[0]).reshape(rows, -1), dev.to_host(apart))
    if not fast:  # exact numerics: the CPU's bits too
        cpu = hk.rms_norm(o.reshape(-1, dv), w, 1e-6).reshape(rows, -1)
        cpu *= hk.silu(z.reshape(-1)).reshape(rows, -1)
        np.testing.assert_array_equal(dev.to_host(apart), cpu)
    for bad in (
        dict(gate=dev.tensor(np.ascontiguousarray(z[:, :dv]))),
        dict(gate=z_t, rope=(heads, dev.ids(np.arange(rows, dtype=np.int32)), 8, 1e4, 1.0, True)),
    ):
        with pytest.raises(ValueError, match="gate"):
            dev.rms_norm(o_t, w_t, 1e-6, **bad)


@pytest.mark.parametrize("fast", [False, True], ids=["exact", "fast"])
@pytest.mark.parametrize("n_groups", [1, 3])
def test_a_gated_group_norm_is_one_pass_with_the_bits_of_three(
    gpu_device, gpu_fast_device, n_groups: int, fast: bool
) -> None:
    """`gated_rms_norm` (Mamba2's output: y *= silu(z), RMSNorm over groups, times a weight that
    spans the row) leaves x gated and returns the bits of `mul_silu`, the norm over groups and
    `mul_row` in one pass; a weight or gate that does not fit is refused."""
    dev = gpu_fast_device if fast else gpu_device
    rng = np.random.default_rng(41)
    rows, n = 5, 24
    x = rng.standard_normal((rows, n * n_groups)).astype(np.float32)
    z = (rng.standard_normal(x.shape) * 4).astype(np.float32)
    w = rng.standard_normal(n * n_groups).astype(np.float32)
    xt, zt, wt = dev.tensor(x), dev.tensor(z), dev.tensor(w)
    fused: list = []
    assert passes_while(dev, lambda: fused.append(dev.gated_rms_norm(xt, zt, wt, n, 1e-5))) == {"gated_rms_norm": 1}
    apart_x = dev.tensor(x)
    dev.mul_silu(apart_x, zt)
    apart = dev.rms_norm(apart_x, None, 1e-5, n)
    native.gpu_mul_row(dev, apart, wt)
    np.testing.assert_array_equal(dev.to_host(xt), dev.to_host(apart_x))
    np.testing.assert_array_equal(dev.to_host(fused[0]), dev.to_host(apart))
    if not fast:  # exact numerics: the CPU's bits too
        gated = x * hk.silu(z.reshape(-1)).reshape(x.shape)
        cpu = hk.rms_norm(gated.reshape(-1, n), None, 1e-5).reshape(x.shape) * w
        np.testing.assert_array_equal(dev.to_host(fused[0]), cpu)
    for bad in ((zt, dev.tensor(w[:n]) if n_groups > 1 else dev.tensor(w[:8])), (dev.tensor(z[:2]), wt)):
        with pytest.raises(ValueError, match="gated_rms_norm"):
            dev.gated_rms_norm(dev.tensor(x), *bad, n, 1e-5)


@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("n_rot", [16, 8])
def test_rope(gpu_device, neox: bool, n_rot: int) -> None:
    n_head, head_dim = 3, 16
    x = np.random.default_rng(4).standard_normal((6, n_head * head_dim)).astype(np.float32)
    pos = np.asarray([0, 1, 7, 300, 4095, 2], dtype=np.int32)
    t = gpu_device.tensor(x)
    gpu_device.rope(t, n_head, gpu_device.ids(pos), n_rot, 10000.0, 0.5, neox)
    cpu = x.copy()
    hk.rope(cpu, n_head, pos, n_rot, 10000.0, 0.5, neox)
    np.testing.assert_array_equal(gpu_device.to_host(t), cpu)


def test_rope_rotations_fuse_like_the_cpu_over_wide_ranges(gpu_device) -> None:
    # x0*cos - x1*sin with cancellation, huge and tiny magnitudes: the fused multiply-add's
    # single rounding, computed in integers where the adapter's fma is not fused
    rng = np.random.default_rng(12)
    x = (rng.standard_normal((64, 128)) * np.exp2(rng.integers(-60, 60, (64, 128)))).astype(np.float32)
    x[::3, 1::2] = x[::3, ::2]  # equal pairs: cancellation at 45-degree angles
    pos = rng.integers(0, 100_000, 64).astype(np.int32)
    t = gpu_device.tensor(x)
    gpu_device.rope(t, 2, gpu_device.ids(pos), 64, 1_000_000.0, 1.0, True)
    cpu = x.copy()
    hk.rope(cpu, 2, pos, 64, 1_000_000.0, 1.0, True)
    np.testing.assert_array_equal(gpu_device.to_host(t), cpu)


def test_elementwise_ops(gpu_device) -> None:
    rng = np.random.default_rng(5)
    a, b = (rng.standard_normal((4, 40)).astype(np.float32) * 4 for _ in range(2))
    bias = rng.standard_normal(40).astype(np.float32)
    dev = gpu_device
    np.testing.assert_array_equal(dev.to_host(dev.geglu(dev.tensor(a), dev.tensor(b))), hk.geglu(a, b))
    np.testing.assert_allclose(dev.to_host(dev.swiglu(dev.tensor(a), dev.tensor(b))), hk.swiglu(a, b), rtol=1e-5)
    t = dev.tensor(a)
    dev.add(t, dev.tensor(b))
    dev.scale(t, 0.5)
    dev.add_row(t, dev.tensor(bias))
    np.testing.assert_allclose(dev.to_host(t), (a + b) * np.float32(0.5) + bias, rtol=1e-6)
    dev.softcap(t, 3.0)
    np.testing.assert_allclose(
        dev.to_host(t), 3.0 * np.tanh(((a + b) * np.float32(0.5) + bias) / 3.0), rtol=1e-5, atol=1e-6
    )
    rows = np.asarray([3, 0, 0], dtype=np.int32)
    np.testing.assert_array_equal(dev.to_host(dev.take_rows(dev.tensor(a), dev.ids(rows))), a[rows])
    np.testing.assert_array_equal(dev.to_host(dev.columns(dev.tensor(a), 7, 9)), a[:, 7:16])


@pytest.mark.parametrize(("n_head", "n_kv", "window"), [(4, 2, 0), (2, 2, 5), (4, 1, 0)])
def test_attention_over_a_device_cache(gpu_device, n_head: int, n_kv: int, window: int) -> None:
    dev, hd, n = gpu_device, 16, 13
    rng = np.random.default_rng(6)
    q = rng.standard_normal((n, n_head * hd)).astype(np.float32)
    k = rng.standard_normal((n, n_kv * hd)).astype(np.float32)
    v = rng.standard_normal((n, n_kv * hd)).astype(np.float32)
    pos = np.arange(n, dtype=np.int32)
    cache = dev.kv_cache(32, n_kv, hd)
    out = dev.empty([n, n_head * hd])
    # two calls: a prompt of 9 rows, then 4 more rows of the same sequence
    for lo, hi in [(0, 9), (9, n)]:
        dev.attention(cache, dev.tensor(q), dev.tensor(k), dev.tensor(v), dev.ids(pos), out, lo, hi - lo, lo,
                      n_head, window, 0.25)  # fmt: skip
    kb = k.reshape(n, n_kv, hd).astype(np.float16).view(np.uint16)
    vb = v.reshape(n, n_kv, hd).astype(np.float16).view(np.uint16)
    cpu = hk.attention(q.reshape(n, n_head, hd), kb, vb, pos, window, 0.25).reshape(n, -1)
    np.testing.assert_allclose(dev.to_host(out), cpu, rtol=1e-4, atol=1e-4)
    k_back, v_back = dev.kv_read(cache, n)
    np.testing.assert_array_equal(k_back, kb)
    np.testing.assert_array_equal(v_back, vb)


@pytest.mark.parametrize("window", [0, 37])
def test_attention_gives_the_cpu_bits_over_many_keys(gpu_device, window: int) -> None:
    """Past 8 keys the softmax sum has several groups of 8, which the CPU adds in f64 (emulated
    exactly on the device): an f32 sum missed by an ulp on some rows (llama Q4_K_M's top-1)."""
    dev, hd, n, n_head, n_kv = gpu_device, 64, 150, 4, 2
    rng = np.random.default_rng(16)
    q, k, v = (rng.standard_normal((n, h * hd)).astype(np.float32) for h in (n_head, n_kv, n_kv))
    pos = np.arange(n, dtype=np.int32)
    cache = dev.kv_cache(n, n_kv, hd)
    out = dev.empty([n, n_head * hd])
    dev.attention(cache, dev.tensor(q), dev.tensor(k), dev.tensor(v), dev.ids(pos), out, 0, n, 0,
                  n_head, window, 0.125)  # fmt: skip
    kb, vb = (t.reshape(n, n_kv, hd).astype(np.float16).view(np.uint16) for t in (k, v))
    cpu = hk.attention(q.reshape(n, n_head, hd), kb, vb, pos, window, 0.125).reshape(n, -1)
    np.testing.assert_array_equal(dev.to_host(out), cpu)


def test_kv_cache_host_and_device_copies(gpu_device) -> None:
    dev = gpu_device
    bits = np.random.default_rng(7).integers(0, 0x7BFF, size=(2, 10, 2, 8), dtype=np.uint16)
    a, b = dev.kv_cache(16, 2, 8), dev.kv_cache(16, 2, 8)
    dev.kv_write(a, 3, bits[0][3:], bits[1][3:])
    dev.kv_write(a, 0, bits[0][:3], bits[1][:3])
    dev.kv_copy(a, b, 10)
    for cache in (a, b):
        k, v = dev.kv_read(cache, 10)
        np.testing.assert_array_equal(k, bits[0])
        np.testing.assert_array_equal(v, bits[1])


def test_bad_shapes_are_value_errors(gpu_device) -> None:
    dev = gpu_device
    m, _ = random_matrix(T.Q8_0, 4, 64)
    with pytest.raises(ValueError, match="matmul"):
        dev.matmul(dev.matrix(m), dev.tensor(np.zeros((2, 32), np.float32)))
    with pytest.raises(ValueError, match="reshape"):
        dev.tensor(np.zeros((2, 32), np.float32)).reshape(3, -1)
    with pytest.raises(ValueError, match="adapter"):
        hk.GpuDevice(None, "no such adapter name", allow_software=True)


@pytest.mark.parametrize("t", ALL_TYPES, ids=lambda t: t.name)
def test_matmul_lanes_give_the_same_bits(t: T) -> None:
    """One thread per weight row (software adapters) or eight (GPUs, with the tile's activations
    in workgroup memory): the CPU's eight float lanes either way, so the same bits. 320 columns:
    a full step of 8 sub-blocks and a partial one."""
    try:
        one = hk.GpuDevice(None, None, allow_software=True, lanes=1)
        eight = hk.GpuDevice(None, None, allow_software=True, lanes=8)
    except ValueError as exc:
        pytest.skip(f"no wgpu adapter on this machine: {exc}")
    cols = 512 if t in K_QUANTS else 320
    m, _ = random_matrix(t, 37, cols)
    x = np.random.default_rng(8).standard_normal((9, cols)).astype(np.float32)
    a = one.to_host(one.matmul(one.matrix(m), one.tensor(x)))
    np.testing.assert_array_equal(a, eight.to_host(eight.matmul(eight.matrix(m), eight.tensor(x))))
