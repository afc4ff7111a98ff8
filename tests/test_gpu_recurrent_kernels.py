"""The recurrent architectures' GPU operations (conv1d with state, gated delta rule, Mamba2 scan,
L2 norm, gates, slicing) against the CPU backend on random data, odd shapes included, and their
chunking invariance and determinism on the device. Runs on any wgpu adapter (CI: lavapipe)."""

from __future__ import annotations

import numpy as np
import pytest

from hyserve.model.backend import CPU

RNG = np.random.default_rng(7)


def rand(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def close(gpu: np.ndarray, cpu: np.ndarray, tol: float = 2e-5) -> None:
    np.testing.assert_allclose(gpu, cpu, rtol=tol, atol=tol * max(1.0, float(np.abs(cpu).max(initial=0.0))))


@pytest.fixture(scope="module")
def gpu(gpu_backend):  # -> GpuBackend
    return gpu_backend


# the recurrences have a kernel per numerics mode: exact gives the CPU's bits where it can, fast
# its own order of operations (32 lanes a state row), within `tol` of the CPU
NUMERICS = [pytest.param("exact", id="exact"), pytest.param("fast", id="fast")]


@pytest.fixture(params=NUMERICS)
def numerics(request, gpu_backend, gpu_fast_backend):  # -> (GpuBackend, tolerance)
    if request.param == "exact":
        return gpu_backend, 2e-5
    return gpu_fast_backend, 2e-4


@pytest.mark.parametrize(
    ("n", "channels", "kernel", "bias", "silu"),
    [
        (5, 37, 4, True, True),
        (1, 24, 3, False, False),
        (9, 13, 6, True, False),
        (2, 128, 4, False, True),
        (0, 24, 4, True, True),
    ],
)
def test_conv1d_matches_the_cpu(gpu, n: int, channels: int, kernel: int, bias: bool, silu: bool) -> None:
    x, w, st = rand(n, channels), rand(channels, kernel, scale=0.5), rand(kernel - 1, channels)
    b = rand(channels) if bias else None
    new_cpu = np.empty_like(st)
    cpu = CPU.conv1d(x, w, st, new_cpu, b, silu)
    new_gpu = gpu.empty(st.shape)
    st_gpu = gpu.vector(st)
    out = gpu.conv1d(gpu.vector(x), gpu.vector(w), st_gpu, new_gpu, None if b is None else gpu.vector(b), silu)
    close(gpu.to_host(out), cpu)
    np.testing.assert_array_equal(gpu.to_host(new_gpu), new_cpu)  # raw inputs: exact
    np.testing.assert_array_equal(gpu.to_host(st_gpu), st)  # the old state is left as it was


def l2_rows(x: np.ndarray, n: int) -> np.ndarray:
    return CPU.l2_norm(x, n, 1e-6)


@pytest.mark.parametrize(
    ("n", "nk", "nv", "dk", "dv", "grouped"),
    [
        (7, 2, 4, 40, 24, False),
        (7, 2, 6, 16, 16, True),
        (7, 1, 1, 67, 5, False),
        # past what one llvmpipe invocation may loop (it ends a loop after 65,535 iterations):
        # software adapters run the tokens in shorter dispatches
        (400, 1, 2, 128, 8, False),
        (600, 1, 1, 16, 4, True),
    ],
)
def test_gated_delta_rule_matches_the_cpu(numerics, n: int, nk: int, nv: int, dk: int, dv: int, grouped: bool) -> None:
    gpu, tol = numerics
    q, k = l2_rows(rand(n, nk * dk), dk), l2_rows(rand(n, nk * dk), dk)
    v = rand(n, nv * dv)
    g, beta = CPU.gdn_gates(rand(n, nv), rand(n, nv), rand(nv), -np.exp(rand(nv, scale=0.5)))
    st = rand(nv, dv, dk, scale=0.1)
    new_cpu = np.empty_like(st)
    cpu = CPU.gated_delta_rule(q, k, v, g, beta, st, new_cpu, nk, nv, grouped)
    t = [gpu.vector(a) for a in (q, k, v, g, beta, st)]
    new_gpu = gpu.empty(st.shape)
    out = gpu.gated_delta_rule(*t, new_gpu, nk, nv, grouped)
    close(gpu.to_host(out), cpu, tol)
    close(gpu.to_host(new_gpu), new_cpu, tol)
    # chunking: 3 + the rest give the same bits as all at once
    mid = gpu.empty(st.shape)
    fin = gpu.empty(st.shape)
    part = [gpu.rows(a, 0, 3) for a in t[:5]]
    o1 = gpu.gated_delta_rule(*part, t[5], mid, nk, nv, grouped)
    part = [gpu.rows(a, 3, n) for a in t[:5]]
    o2 = gpu.gated_delta_rule(*part, mid, fin, nk, nv, grouped)
    whole = gpu.to_host(out)
    np.testing.assert_array_equal(np.concatenate([gpu.to_host(o1), gpu.to_host(o2)]), whole)
    np.testing.assert_array_equal(gpu.to_host(fin), gpu.to_host(new_gpu))
    again = gpu.empty(st.shape)
    np.testing.assert_array_equal(gpu.to_host(gpu.gated_delta_rule(*t, again, nk, nv, grouped)), whole)
    # no tokens: the state is carried over as it is
    carried = gpu.empty(st.shape)
    gpu.gated_delta_rule(*[gpu.rows(a, 0, 0) for a in t[:5]], t[5], carried, nk, nv, grouped)
    np.testing.assert_array_equal(gpu.to_host(carried), st)


@pytest.mark.parametrize(("nk", "nv", "dk", "dv", "grouped"), [(2, 4, 40, 24, False), (2, 6, 16, 16, True)])
@pytest.mark.parametrize("l2_eps", [None, 1e-6])
def test_the_packed_delta_rule_gives_the_bits_of_its_columns_apart(
    gpu, nk: int, nv: int, dk: int, dv: int, grouped: bool, l2_eps: float | None
) -> None:
    """A delta-net layer's convolution output u = [q | k | v] goes to the rule whole (the device
    reads q, k and v from u, normalising q and k straight out of it): the same bits as the three
    columns copied apart, on each backend."""
    n = 5
    u = rand(n, 2 * nk * dk + nv * dv)
    if l2_eps is None:  # the rule's inputs must be normalised then
        u[:, : 2 * nk * dk] = l2_rows(u[:, : 2 * nk * dk], dk)
    g, beta = CPU.gdn_gates(rand(n, nv), rand(n, nv), rand(nv), -np.exp(rand(nv, scale=0.5)))
    st = rand(nv, dv, dk, scale=0.1)
    q, k, v = (np.ascontiguousarray(c) for c in np.split(u, [nk * dk, 2 * nk * dk], axis=1))
    cpu_new, cpu_apart_new = np.empty_like(st), np.empty_like(st)
    cpu = CPU.gated_delta_rule_packed(u, g, beta, st, cpu_new, nk, nv, grouped, l2_eps)
    cpu_apart = CPU.gated_delta_rule(q, k, v, g, beta, st, cpu_apart_new, nk, nv, grouped, l2_eps)
    np.testing.assert_array_equal(cpu, cpu_apart)
    np.testing.assert_array_equal(cpu_new, cpu_apart_new)
    tu, tg, tb, ts = (gpu.vector(a) for a in (u, g, beta, st))
    new, apart_new = gpu.empty(st.shape), gpu.empty(st.shape)
    out = gpu.gated_delta_rule_packed(tu, tg, tb, ts, new, nk, nv, grouped, l2_eps)
    columns = (gpu.columns(tu, 0, nk * dk), gpu.columns(tu, nk * dk, nk * dk), gpu.columns(tu, 2 * nk * dk, nv * dv))
    apart = gpu.gated_delta_rule(*columns, tg, tb, ts, apart_new, nk, nv, grouped, l2_eps)
    np.testing.assert_array_equal(gpu.to_host(out), gpu.to_host(apart))
    np.testing.assert_array_equal(gpu.to_host(new), gpu.to_host(apart_new))
    close(gpu.to_host(out), cpu)
    close(gpu.to_host(new), cpu_new)


@pytest.mark.parametrize(("nk", "nv", "dk", "dv"), [(2, 4, 40, 24), (1, 2, 128, 8), (1, 1, 67, 5)])
def test_fast_numerics_normalise_q_and_k_in_the_rules_own_pass(gpu, gpu_fast_device, nk, nv, dk, dv) -> None:
    """In fast numerics the rule L2-normalises q and k itself (delta_rule.wgsl's `l2`), one pass
    less: close to the norm's pass and then the rule, the same bits run after run and however the
    tokens are chunked, over long sequences too."""
    import hyserve_kernels._native as native

    from hyserve.model.backend.gpu import GpuBackend
    from hyserve.model.backend.recurrent_gpu import l2_constants

    fast = GpuBackend(gpu_fast_device)
    n, width = 300, 2 * nk * dk
    u = rand(n, width + nv * dv)
    g, beta = CPU.gdn_gates(rand(n, nv), rand(n, nv), rand(nv), -np.exp(rand(nv, scale=0.5)))
    tu, tg, tb, ts = (fast.vector(a) for a in (u, g, beta, rand(nv, dv, dk, scale=0.1)))

    def fused(a: int, b: int, state):  # tokens a..b from `state`: (outputs, new state)
        new = fast.empty((nv, dv, dk))
        rows = [fast.rows(t, a, b) for t in (tu, tg, tb)]
        return fast.gated_delta_rule_packed(*rows, state, new, nk, nv, False, 1e-6), new

    whole, whole_new = fused(0, n, ts)
    eps_dk, weight = l2_constants(dk, 1e-6)
    qk = gpu_fast_device.rms_norm(tu, fast.vector(np.full(dk, weight, np.float32)), eps_dk, dk, width)
    apart_new = fast.empty((nv, dv, dk))
    apart = native.gpu_delta_rule(gpu_fast_device, qk, tu, width, tg, tb, ts, apart_new, nk, nv, False)
    close(fast.to_host(whole), fast.to_host(apart), 1e-4)
    close(fast.to_host(whole_new), fast.to_host(apart_new), 1e-4)
    again, _ = fused(0, n, ts)
    np.testing.assert_array_equal(fast.to_host(again), fast.to_host(whole))
    first, mid = fused(0, 137, ts)
    rest, end = fused(137, n, mid)
    np.testing.assert_array_equal(np.concatenate([fast.to_host(first), fast.to_host(rest)]), fast.to_host(whole))
    np.testing.assert_array_equal(fast.to_host(end), fast.to_host(whole_new))
    with pytest.raises(ValueError, match="fast numerics only"):
        native.gpu_delta_rule(gpu.device, tu, tu, width, tg, tb, ts, apart_new, nk, nv, False, (eps_dk, weight))


def test_a_norm_of_leading_columns_reads_them_in_place(gpu) -> None:
    """`rms_norm(..., width=)` normalises the first columns of each row in groups, as a norm of
    those columns copied out would, and refuses widths the rows cannot hold."""
    x, w = rand(4, 3 * 8 + 5), rand(8)
    tx, tw = gpu.vector(x), gpu.vector(w)
    got = gpu.device.rms_norm(tx, tw, 1e-5, 8, 24)
    assert tuple(got.shape) == (4, 24)
    want = gpu.device.rms_norm(gpu.columns(tx, 0, 24), tw, 1e-5, 8)
    np.testing.assert_array_equal(gpu.to_host(got), gpu.to_host(want))
    for width in (0, 20, 40):
        with pytest.raises(ValueError, match="columns"):
            gpu.device.rms_norm(tx, tw, 1e-5, 8, width)
    with pytest.raises(ValueError, match="weight"):
        gpu.device.rms_norm(tx, gpu.vector(rand(7)), 1e-5, 8, 24)


def test_rms_norm_columns_gives_the_bits_of_a_norm_of_the_columns_copied_out(gpu) -> None:
    """The backend op the gated attention's q norm uses ([q_h | gate_h] rows, q_h normalised in
    place): on each device the bits of `rms_norm(columns(x, 0, width))`."""
    heads, w = rand(6, 2 * 16, scale=3), rand(16)
    got = gpu.rms_norm_columns(gpu.vector(heads), gpu.vector(w), 1e-6, 16)
    apart = gpu.rms_norm(gpu.columns(gpu.vector(heads), 0, 16), gpu.vector(w), 1e-6)
    np.testing.assert_array_equal(gpu.to_host(got), gpu.to_host(apart))
    cpu = CPU.rms_norm_columns(heads, w, 1e-6, 16)
    np.testing.assert_array_equal(cpu, CPU.rms_norm(CPU.columns(heads, 0, 16), w, 1e-6))
    close(gpu.to_host(got), cpu, 1e-6)


def test_sigmoid_mul_columns_gives_the_bits_of_a_gate_copied_out(gpu) -> None:
    """The gated attention's output gate read in place from the second half of each head's
    [q_h | gate_h] row: on each device the bits of `sigmoid_mul_` with the columns copied out;
    shapes that do not fit are refused."""
    heads, dst = rand(6, 2 * 16, scale=3), rand(6, 16)
    got, apart = gpu.vector(dst), gpu.vector(dst)
    gpu.sigmoid_mul_columns_(got, gpu.vector(heads), 16)
    gpu.sigmoid_mul_(apart, gpu.columns(gpu.vector(heads), 16, 16))
    np.testing.assert_array_equal(gpu.to_host(got), gpu.to_host(apart))
    cpu, cpu_apart = dst.copy(), dst.copy()
    CPU.sigmoid_mul_columns_(cpu, heads, 16)
    CPU.sigmoid_mul_(cpu_apart, CPU.columns(heads, 16, 16))
    np.testing.assert_array_equal(cpu, cpu_apart)
    close(gpu.to_host(got), cpu, 1e-6)
    for bad_start, bad_x in ((17, heads), (0, heads[:5])):
        with pytest.raises(ValueError, match="sigmoid_mul_columns"):
            gpu.sigmoid_mul_columns_(got, gpu.vector(bad_x), bad_start)


def test_mul_silu_gives_the_bits_of_a_silu_then_a_product(gpu) -> None:
    dst, gate = rand(3, 37, scale=4), rand(3, 37, scale=4)
    t = gpu.vector(dst)
    gpu.mul_silu_(t, gpu.vector(gate))
    apart = gpu.vector(dst)
    gpu.mul_(apart, gpu.silu(gpu.vector(gate)))
    np.testing.assert_array_equal(gpu.to_host(t), gpu.to_host(apart))
    ref, ref_apart = dst.copy(), dst.copy()
    CPU.mul_silu_(ref, gate)
    CPU.mul_(ref_apart, CPU.silu(gate))
    np.testing.assert_array_equal(ref, ref_apart)
    close(gpu.to_host(t), ref, 1e-6)


@pytest.mark.parametrize(
    ("n", "nh", "hd", "ng", "ns"),
    [
        (6, 6, 5, 2, 40),
        (6, 4, 16, 1, 16),
        (6, 3, 7, 3, 33),
        # past what one llvmpipe invocation may loop: software adapters run shorter dispatches
        (600, 2, 3, 1, 128),
    ],
)
def test_mamba2_scan_matches_the_cpu(numerics, n: int, nh: int, hd: int, ng: int, ns: int) -> None:
    gpu, tol = numerics
    x, dt = rand(n, nh * hd), rand(n, nh)
    dt[2, 0] = 25.0  # softplus passes x > 20 through
    a, d, bias = -np.exp(rand(nh, scale=0.5)), rand(nh), rand(nh)
    b, c = rand(n, ng * ns), rand(n, ng * ns)
    st = rand(nh, hd, ns, scale=0.1)
    new_cpu = np.empty_like(st)
    cpu = CPU.mamba2_scan(x, dt, a, b, c, d, bias, st, new_cpu, nh, ng)
    t = [gpu.vector(v) for v in (x, dt, a, b, c, d, bias, st)]
    new_gpu = gpu.empty(st.shape)
    out = gpu.mamba2_scan(*t, new_gpu, nh, ng)
    close(gpu.to_host(out), cpu, tol)
    close(gpu.to_host(new_gpu), new_cpu, tol)
    # token by token gives the same bits as all at once
    state, outs = t[7], []
    for i in range(min(n, 6)):
        nxt = gpu.empty(st.shape)
        xi, dti, bi, ci = (gpu.rows(t[j], i, i + 1) for j in (0, 1, 3, 4))
        outs.append(gpu.to_host(gpu.mamba2_scan(xi, dti, t[2], bi, ci, t[5], t[6], state, nxt, nh, ng)))
        state = nxt
    rest = gpu.empty(st.shape)
    if n > 6:  # and the rest in one call
        xi, dti, bi, ci = (gpu.rows(t[j], 6, n) for j in (0, 1, 3, 4))
        outs.append(gpu.to_host(gpu.mamba2_scan(xi, dti, t[2], bi, ci, t[5], t[6], state, rest, nh, ng)))
        state = rest
    np.testing.assert_array_equal(np.concatenate(outs), gpu.to_host(out))
    np.testing.assert_array_equal(gpu.to_host(state), gpu.to_host(new_gpu))


def test_small_steps_match_the_cpu(gpu) -> None:
    x = rand(5, 3 * 19)
    close(gpu.to_host(gpu.l2_norm(gpu.vector(x), 19, 1e-6)), CPU.l2_norm(x, 19, 1e-6))
    zero = np.zeros((2, 19), np.float32)  # max(|x|, eps) keeps a zero row finite
    np.testing.assert_array_equal(gpu.to_host(gpu.l2_norm(gpu.vector(zero), 19, 1e-6)), zero)
    b, a, bias, neg = rand(4, 6, scale=3), rand(4, 6, scale=3), rand(6), -np.exp(rand(6))
    a[1, 2] = 30.0
    for got, want in zip(gpu.gdn_gates(*(gpu.vector(v) for v in (b, a, bias, neg))), CPU.gdn_gates(b, a, bias, neg)):
        close(gpu.to_host(got), want, 1e-5)
    dst, gate = rand(3, 10), rand(3, 10)
    t = gpu.vector(dst)
    gpu.sigmoid_mul_(t, gpu.vector(gate))
    ref = dst.copy()
    CPU.sigmoid_mul_(ref, gate)
    close(gpu.to_host(t), ref, 1e-6)
    w = rand(10)
    gpu.mul_row_(t, gpu.vector(w))
    ref *= w
    close(gpu.to_host(t), ref, 1e-6)
    close(gpu.to_host(gpu.silu(gpu.vector(x))), CPU.silu(x), 1e-6)
    close(gpu.to_host(gpu.rms_norm_groups(gpu.vector(x), 19, 1e-5)), CPU.rms_norm_groups(x, 19, 1e-5), 1e-5)


def test_slicing_is_exact(gpu) -> None:
    x, y = rand(7, 11), rand(7, 4)
    tx = gpu.vector(x)
    np.testing.assert_array_equal(gpu.to_host(gpu.rows(tx, 2, 5)), x[2:5])
    np.testing.assert_array_equal(gpu.to_host(gpu.columns(tx, 3, 5)), x[:, 3:8])
    np.testing.assert_array_equal(gpu.to_host(gpu.concat_columns([tx, gpu.vector(y)])), np.concatenate([x, y], 1))
    dst = gpu.vector(np.zeros((7, 11), np.float32))
    gpu.put_rows(dst, 4, gpu.vector(x[:3]))
    want = np.zeros((7, 11), np.float32)
    want[4:7] = x[:3]
    np.testing.assert_array_equal(gpu.to_host(dst), want)


def test_device_states_copy_exactly(gpu) -> None:
    st = gpu.recurrent_state((3, 8), (2, 4, 5))
    assert st.on_device and st.nbytes == 4 * (24 + 40)
    conv, ssm = rand(3, 8), rand(2, 4, 5)
    st.put(conv, ssm)  # from the host
    snap = st.copies()  # device to device
    host = st.host_copies()
    np.testing.assert_array_equal(host[0], conv)
    np.testing.assert_array_equal(host[1], ssm)
    st.reset()
    assert not gpu.to_host(st.ssm).any()
    st.put(*snap)
    np.testing.assert_array_equal(gpu.to_host(st.conv), conv)
    np.testing.assert_array_equal(gpu.to_host(st.ssm), ssm)
