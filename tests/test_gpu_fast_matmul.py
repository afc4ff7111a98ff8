"""The fast-numerics dense matmul (rust_kernels/src/gpu/shaders/matmul_fast.wgsl) in every weight
format: a row's bits are the same whatever the batch or chunk it is computed in and run after run,
with 16 threads per weight row (GPUs) or one (software adapters); close to the CPU kernels; and no
more passes than the exact path (none to quantize F32 weights' activations; the Q8 activations by
a workgroup per 256 values, quantize_fast.wgsl, or by the norm that wrote them)."""

from __future__ import annotations

from collections.abc import Callable

import hyserve_kernels as hk
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gpu_passes import passes_while
from test_gpu_kernels import ALL_TYPES, K_QUANTS, random_matrix

# several steps of 16 sub-blocks, the last one partial
COLS = {t: 768 if t in K_QUANTS else 1056 for t in ALL_TYPES}
ROWS = 37  # not a whole number of workgroups in either thread layout


def open_device(**kw):  # -> hk.GpuDevice
    try:
        return hk.GpuDevice(None, None, allow_software=True, **kw)
    except ValueError as exc:
        pytest.skip(f"no wgpu adapter on this machine: {exc}")


@pytest.fixture(scope="module", params=[1, 8], ids=["one-thread-a-row", "sixteen-threads-a-row"])
def fast_device(request: pytest.FixtureRequest):  # -> hk.GpuDevice
    """`lanes=1`: the software adapters' layout (one thread runs a row's 16 lanes, activations read
    in place); `lanes=8`: the GPUs' (16 threads a row, activations staged in workgroup memory)."""
    return open_device(numerics="fast", lanes=request.param)


def inputs(t: T) -> tuple[hk.QMatrix, np.ndarray]:
    m, _ = random_matrix(t, ROWS, COLS[t], seed=int(t))
    x = np.random.default_rng(200 + int(t)).standard_normal((64, COLS[t])).astype(np.float32)
    return m, x


@pytest.mark.parametrize("t", ALL_TYPES, ids=lambda t: t.name)
def test_fast_matmul_rows_never_depend_on_the_batch(fast_device, t: T) -> None:
    m, x = inputs(t)
    w = fast_device.matrix(m)
    whole = fast_device.to_host(fast_device.matmul(w, fast_device.tensor(x)))
    np.testing.assert_array_equal(fast_device.to_host(fast_device.matmul(w, fast_device.tensor(x))), whole)
    for lo, n in [(0, 1), (0, 3), (0, 8), (0, 9), (5, 1), (7, 3), (13, 8), (30, 9), (55, 9)]:
        part = fast_device.to_host(fast_device.matmul(w, fast_device.tensor(x[lo : lo + n])))
        np.testing.assert_array_equal(part, whole[lo : lo + n], err_msg=f"rows {lo}..{lo + n}")


@pytest.mark.parametrize("t", ALL_TYPES, ids=lambda t: t.name)
def test_fast_matmul_is_close_to_the_cpu(fast_device, t: T) -> None:
    """The same integer products as the CPU (quantized formats), summed in another float order."""
    m, x = inputs(t)
    gpu = fast_device.to_host(fast_device.matmul(fast_device.matrix(m), fast_device.tensor(x[:9])))
    cpu = hk.matmul(m, x[:9])
    np.testing.assert_allclose(gpu, cpu, rtol=1e-5, atol=2e-6 * float(np.abs(cpu).max()))


@pytest.mark.parametrize("t", ALL_TYPES, ids=lambda t: t.name)
def test_thread_layouts_give_the_same_bits(t: T) -> None:
    one, sixteen = open_device(numerics="fast", lanes=1), open_device(numerics="fast", lanes=8)
    m, x = inputs(t)
    a = one.to_host(one.matmul(one.matrix(m), one.tensor(x[:11])))
    np.testing.assert_array_equal(a, sixteen.to_host(sixteen.matmul(sixteen.matrix(m), sixteen.tensor(x[:11]))))


@pytest.mark.parametrize("t", [T.Q8_0, T.Q6_K], ids=lambda t: t.name)
def test_fast_tensors_split_across_bindings_give_the_same_rows(t: T) -> None:
    small, whole = open_device(numerics="fast", max_binding=2048), open_device(numerics="fast")
    m, x = inputs(t)
    assert small.matrix(m).n_bindings > 1
    a = small.to_host(small.matmul(small.matrix(m), small.tensor(x[:5])))
    np.testing.assert_array_equal(a, whole.to_host(whole.matmul(whole.matrix(m), whole.tensor(x[:5]))))


def passes(dev, m: hk.QMatrix, x: np.ndarray) -> dict[str, int]:
    w, xt = dev.matrix(m), dev.tensor(x)
    return passes_while(dev, lambda: dev.to_host(dev.matmul(w, xt)))


@pytest.mark.parametrize("t", ALL_TYPES, ids=lambda t: t.name)
def test_fast_matmul_records_no_more_passes_than_exact(t: T) -> None:
    m, x = inputs(t)
    fast = passes(open_device(numerics="fast"), m, x[:1])
    exact = passes(open_device(numerics="exact"), m, x[:1])
    assert exact == {"quantize_act": 1, "matmul": 1}, exact
    if t == T.F32:
        assert fast == {"matmul_fast": 1}, fast  # f32 activations are read as they are
    elif t in (T.F16, T.BF16):
        assert fast == {"quantize_act": 1, "matmul_fast": 1}, fast  # rounded to f16 / bf16
    else:
        assert fast == {"quantize_act_fast": 1, "matmul_fast": 1}, fast  # Q8_0, Q8_1, Q8_K


def made_then_multiplied(dev, m: hk.QMatrix, make: Callable, hint: bool) -> list[np.ndarray]:
    """`make(dev, feeds)` (a norm or a gated unit, told what it feeds or not), then the matmul:
    the product and every tensor `make` returns."""
    w = dev.matrix(m)
    made = make(dev, [w] if hint else None)
    return [dev.to_host(dev.matmul(w, made[0]))] + [dev.to_host(t) for t in made]


def norm_of(x: np.ndarray, a: np.ndarray | None) -> Callable:
    weight = np.random.default_rng(7).standard_normal(x.shape[1]).astype(np.float32)

    def make(dev, feeds):
        h = dev.tensor(x)
        if a is None:
            return [dev.rms_norm(h, dev.tensor(weight), 1e-6, feeds=feeds), h]
        return [dev.add_rms_norm(h, dev.tensor(a), dev.tensor(weight), 1e-6, feeds=feeds), h]

    return make


def gated_of(op: str, gate: np.ndarray, up: np.ndarray) -> Callable:
    return lambda dev, feeds: [getattr(dev, op)(dev.tensor(gate), dev.tensor(up), feeds=feeds)]


def assert_fused_when_q8(fast_device, t: T, m: hk.QMatrix, make: Callable, plain: str, fused: str) -> None:
    """The hinted path gives the plain path's bits everywhere, and for the Q8 kinds one pass less."""
    for got, want in zip(
        made_then_multiplied(fast_device, m, make, True), made_then_multiplied(fast_device, m, make, False)
    ):
        np.testing.assert_array_equal(got, want)
    dev = open_device(numerics="fast")
    passes = passes_while(dev, lambda: made_then_multiplied(dev, m, make, hint=True))
    if t == T.F32:
        assert passes == {plain: 1, "matmul_fast": 1}, passes  # f32 activations are read as they are
    elif t == T.F16:
        assert passes == {plain: 1, "quantize_act": 1, "matmul_fast": 1}, passes
    else:
        assert passes == {fused: 1, "matmul_fast": 1}, passes


FUSABLE = [T.Q8_0, T.Q4_1, T.Q4_K, T.F32, T.F16]  # act kinds Q8_0, Q8_1, Q8_K, and two without


@pytest.mark.parametrize("add", [False, True], ids=["norm", "add-and-norm"])
@pytest.mark.parametrize("t", FUSABLE, ids=lambda t: t.name)
def test_a_norm_told_its_matmul_quantizes_for_it_in_the_same_pass(fast_device, t: T, add: bool) -> None:
    """A norm given `feeds` quantizes its rows for them as it writes them (norm_quantize_end.wgsl):
    the matmul after it reads those quants and gives the bits it gives after a plain norm."""
    m, x = inputs(t)
    make = norm_of(x[:5], x[5:10] if add else None)
    norm = "add_rms_norm" if add else "rms_norm"
    assert_fused_when_q8(fast_device, t, m, make, norm, f"{norm}_quantize")


@pytest.mark.parametrize("op", ["swiglu", "geglu"])
@pytest.mark.parametrize("t", FUSABLE, ids=lambda t: t.name)
def test_a_gated_unit_told_its_down_projection_quantizes_for_it(fast_device, t: T, op: str) -> None:
    """SwiGLU and GEGLU given `feeds` compute each value as the thread quantizing it reads it
    (gated_in.wgsl): the unit's output and the product after it are the plain path's bits."""
    m, x = inputs(t)
    make = gated_of(op, x[:5] * 4, x[5:10])  # gate values past GELU's +-10 cut-offs too
    assert_fused_when_q8(fast_device, t, m, make, "elementwise", "gated_quantize")


@pytest.mark.parametrize("t", FUSABLE, ids=lambda t: t.name)
def test_a_gated_group_norm_told_its_matmul_quantizes_for_it(fast_device, t: T) -> None:
    """Mamba2's gated norm (x *= silu(z), then the norm times a weight) given `feeds` quantizes
    the rows it writes for them: its output, the gated x and the product are the plain path's."""
    m, x = inputs(t)
    weight = np.random.default_rng(8).standard_normal(x.shape[1]).astype(np.float32)

    def make(dev, feeds):
        h = dev.tensor(x[:5])
        out = dev.gated_rms_norm(h, dev.tensor(x[5:10] * 4), dev.tensor(weight), x.shape[1], 1e-6, feeds=feeds)
        return [out, h]

    assert_fused_when_q8(fast_device, t, m, make, "gated_rms_norm", "gated_rms_norm_quantize")


def test_quants_made_by_a_norm_are_not_read_after_the_tensor_changed(fast_device) -> None:
    """The quants a norm made describe its result only until the device records anything else:
    scaled in place after the norm, the tensor is quantized again by the matmul (its new values)."""
    m, x = inputs(T.Q4_K)
    w, weight = fast_device.matrix(m), fast_device.tensor(np.ones(x.shape[1], np.float32))
    outs = []
    for feeds in ([w], None):
        y = fast_device.rms_norm(fast_device.tensor(x[:3]), weight, 1e-6, feeds=feeds)
        fast_device.scale(y, 3.0)
        outs.append(fast_device.to_host(fast_device.matmul(w, y)))
    np.testing.assert_array_equal(outs[0], outs[1])
    unscaled = fast_device.rms_norm(fast_device.tensor(x[:3]), weight, 1e-6)
    assert not np.array_equal(outs[0], fast_device.to_host(fast_device.matmul(w, unscaled)))


def weights_and_input(t: T, rows: list[int], n: int) -> tuple[list[hk.QMatrix], np.ndarray]:
    ms = [random_matrix(t, r, COLS[t], seed=10 * int(t) + i)[0] for i, r in enumerate(rows)]
    return ms, np.random.default_rng(300 + int(t)).standard_normal((n, COLS[t])).astype(np.float32)


SHARED = [T.Q4_K, T.Q6_K, T.Q8_0, T.Q4_1, T.F32, T.F16]


@pytest.mark.parametrize("n", [1, 9])
@pytest.mark.parametrize("t", SHARED, ids=lambda t: t.name)
def test_weights_of_one_format_share_a_pass_and_keep_their_bits(fast_device, t: T, n: int) -> None:
    """matmul_many over weights of one format (Q/K/V, gate/up) runs them in one pass, four at
    most (matmul_fast_parts.wgsl), and each product has the bits of its own matmul."""
    rows = [37, 5, 64, 1, 130]  # part sizes that end inside a workgroup, and a fifth weight
    ms, x = weights_and_input(t, rows, n)
    xt = fast_device.tensor(x)
    ws = [fast_device.matrix(m) for m in ms]
    for k in (2, 3, 4, 5):
        together = [fast_device.to_host(y) for y in fast_device.matmul_many(ws[:k], xt)]
        for i, (got, w) in enumerate(zip(together, ws[:k])):
            assert got.shape == (n, rows[i])
            np.testing.assert_array_equal(got, fast_device.to_host(fast_device.matmul(w, xt)), err_msg=f"{k}: {i}")
    dev = open_device(numerics="fast")
    dws, dxt = [dev.matrix(m) for m in ms], dev.tensor(x)
    quantize = {T.F32: {}, T.F16: {"quantize_act": 1}}.get(t, {"quantize_act_fast": 1})
    got = passes_while(dev, lambda: [dev.to_host(y) for y in dev.matmul_many(dws[:3], dxt)])
    assert got == {**quantize, "matmul_fast_parts": 1}, got
    got = passes_while(dev, lambda: [dev.to_host(y) for y in dev.matmul_many(dws, dxt)])
    assert got == {**quantize, "matmul_fast_parts": 1, "matmul_fast": 1}, got


def test_a_delta_nets_projections_share_a_pass_by_format(fast_device) -> None:
    """A qwen35 delta net's input projections: QKV in Q6_K, z, beta and alpha in Q4_K. The three
    Q4_K weights share a pass; the activations are quantized once for both formats (Q8_K)."""
    q6, x = weights_and_input(T.Q6_K, [96], 3)
    q4 = [random_matrix(T.Q4_K, r, COLS[T.Q4_K], seed=70 + r)[0] for r in (48, 16, 16)]
    assert COLS[T.Q6_K] == COLS[T.Q4_K]
    ws = [fast_device.matrix(m) for m in q6 + q4]
    xt = fast_device.tensor(x)
    together = [fast_device.to_host(y) for y in fast_device.matmul_many(ws, xt)]
    for got, w in zip(together, ws):
        np.testing.assert_array_equal(got, fast_device.to_host(fast_device.matmul(w, xt)))
    dev = open_device(numerics="fast")
    dws, dxt = [dev.matrix(m) for m in q6 + q4], dev.tensor(x)
    got = passes_while(dev, lambda: [dev.to_host(y) for y in dev.matmul_many(dws, dxt)])
    assert got == {"quantize_act_fast": 1, "matmul_fast": 1, "matmul_fast_parts": 1}, got


def test_a_weight_split_across_bindings_runs_on_its_own() -> None:
    """A weight larger than one binding keeps its dispatch per binding beside a shared pass."""
    small = open_device(numerics="fast", max_binding=2048)
    ms, x = weights_and_input(T.Q8_0, [37, 1, 1], 5)  # one 1,122-byte row per binding
    ws, xt = [small.matrix(m) for m in ms], small.tensor(x)
    assert ws[0].n_bindings > 1 and all(w.n_bindings == 1 for w in ws[1:])
    whole = open_device(numerics="fast")
    for got, m in zip(small.matmul_many(ws, xt), ms):
        want = whole.to_host(whole.matmul(whole.matrix(m), whole.tensor(x)))
        np.testing.assert_array_equal(small.to_host(got), want)
    got = passes_while(small, lambda: [small.to_host(y) for y in small.matmul_many(ws, xt)])
    assert got == {"quantize_act_fast": 1, "matmul_fast": ws[0].n_bindings, "matmul_fast_parts": 1}, got
