"""Recurrent-layer kernels (Gated DeltaNet, Mamba2) against float64 numpy references written from the
model reference (§3.4, §5.3-5.4, §6), batch invariance (one call == uneven chunks == token by token,
bit for bit) on the SIMD and scalar paths, and, where llama-cpp-python 0.3.36 is installed, bit-exact
agreement with the ggml ops it ships (called one op at a time through ctypes)."""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator
from pathlib import Path

import hyserve_kernels as hk
import numpy as np
import pytest
from simd_paths import run_on_simd_path

EPS = 1e-6
SPLITS = [[23], [5, 1, 17], [1] * 23]


@pytest.fixture(params=["avx2", "scalar"])
def simd_path(request: pytest.FixtureRequest) -> Iterator[str]:
    """The recurrent kernels' two forms (the AVX-512 VNNI path runs their AVX2 form)."""
    yield from run_on_simd_path(request.param)


def uniform(rng: np.random.Generator, shape: tuple[int, ...], lo: float = -1.0, hi: float = 1.0) -> np.ndarray:
    return rng.uniform(lo, hi, shape).astype(np.float32)


def assert_bits_equal(a: np.ndarray, b: np.ndarray, what: str) -> None:
    assert a.shape == b.shape, what
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), what


# ---- float64 references -----------------------------------------------------------------------


def silu64(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def conv_reference(x, w, state, bias=None, silu=False):
    """y[t, c] = sum_k w[c, k] * X[t + k, c] with X = [state; x] (state: the last K-1 raw inputs)."""
    k = w.shape[1]
    seq = np.concatenate([state, x]).astype(np.float64)
    y = sum(w[:, j].astype(np.float64) * seq[j : j + len(x)] for j in range(k))
    if bias is not None:
        y = y + bias
    if silu:
        y = silu64(y)
    return y, seq[len(x) :]


def l2_reference(x: np.ndarray, eps: float) -> np.ndarray:
    """ggml_l2_norm: x / max(||x||, eps)."""
    x = x.astype(np.float64)
    return x / np.maximum(np.sqrt((x * x).sum(-1, keepdims=True)), eps)


def gdn_l2_reference(x: np.ndarray, eps: float) -> np.ndarray:
    """current llama.cpp's build_gdn_l2_norm: rms_norm(x, eps/n) / sqrt(n) = x / sqrt(sum x^2 + eps)."""
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).sum(-1, keepdims=True) + eps)


def gdn_reference(q, k, v, g, beta, state, l2_eps=None):
    """§5.3 step 7 with HF's per-head S [d_k, d_v]; `state` is the kernel's [nv, d_v, d_k] (= S^T)."""
    n, nk, dk = q.shape
    nv = v.shape[1]
    if l2_eps is not None:
        q, k = gdn_l2_reference(q, l2_eps), gdn_l2_reference(k, l2_eps)
    q, k, v = q.astype(np.float64), k.astype(np.float64), v.astype(np.float64)
    s = state.astype(np.float64).transpose(0, 2, 1).copy()  # [nv, dk, dv]
    out = np.zeros(v.shape)
    for t in range(n):
        for h in range(nv):
            kh = h % nk  # qwen35 GGUFs: V heads in tiled order
            s[h] *= np.exp(g[t, h])
            delta = beta[t, h] * (v[t, h] - s[h].T @ k[t, kh])
            s[h] += np.outer(k[t, kh], delta)
            out[t, h] = s[h].T @ q[t, kh] / np.sqrt(dk)
    return out, s.transpose(0, 2, 1)


def softplus64(x: np.ndarray) -> np.ndarray:
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))


def mamba_reference(x, dt, a, b, c, state, d=None, dt_bias=None):
    """§6 steps 3-4: s = s*exp(dt*A) + B*(x*dt), y = s.C (+ D*x), dt = softplus(dt + dt_bias)."""
    n, nh, _ = x.shape
    ng = b.shape[1]
    s = state.astype(np.float64).copy()
    dt = dt.astype(np.float64) + (0 if dt_bias is None else dt_bias)
    dt = softplus64(dt)
    y = np.zeros(x.shape)
    for t in range(n):
        for h in range(nh):
            grp = h // (nh // ng)
            s[h] = s[h] * np.exp(dt[t, h] * a[h]) + np.outer(x[t, h] * dt[t, h], b[t, grp])
            y[t, h] = s[h] @ c[t, grp].astype(np.float64)
            if d is not None:
                y[t, h] += d[h] * x[t, h]
    return y, s


# ---- test cases (odd sizes on purpose) ---------------------------------------------------------


def conv_case(channels: int, kernel: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "x": uniform(rng, (23, channels), -2, 2),
        "w": uniform(rng, (channels, kernel)),
        "state": uniform(rng, (kernel - 1, channels), -2, 2),
        "bias": uniform(rng, (channels,), -0.5, 0.5),
    }


def gdn_case(nk: int, nv: int, dk: int, dv: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "q": uniform(rng, (23, nk, dk)),
        "k": uniform(rng, (23, nk, dk)),
        "v": uniform(rng, (23, nv, dv)),
        "g": uniform(rng, (23, nv), -1.5, 0.0),
        "beta": uniform(rng, (23, nv), 0.05, 0.95),
        "state": uniform(rng, (nv, dv, dk), -0.5, 0.5),
    }


def mamba_case(nh: int, p: int, ng: int, ns: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    dt = uniform(rng, (23, nh), -3, 3)
    dt[3, 0] = 25.0  # softplus passes x > 20 through
    return {
        "x": uniform(rng, (23, nh, p), -2, 2),
        "dt": dt,
        "a": uniform(rng, (nh,), -2, -0.1),
        "b": uniform(rng, (23, ng, ns)),
        "c": uniform(rng, (23, ng, ns)),
        "d": uniform(rng, (nh,)),
        "dt_bias": uniform(rng, (nh,)),
        "state": uniform(rng, (nh, p, ns)),
    }


CONV_SIZES = [(37, 4), (64, 4), (16, 3), (9, 1), (21, 9)]
GDN_SIZES = [(2, 4, 16, 24), (1, 2, 40, 33), (2, 2, 64, 64), (2, 4, 128, 128)]
MAMBA_SIZES = [(4, 6, 2, 16), (3, 5, 1, 40), (2, 4, 2, 64)]


def run_conv(case: dict, split: list[int], bias: bool, silu: bool) -> tuple[np.ndarray, np.ndarray]:
    state, outs, t0 = case["state"].copy(), [], 0
    for n in split:
        b = case["bias"] if bias else None
        outs.append(hk.conv1d_causal(case["x"][t0 : t0 + n], case["w"], state, bias=b, silu=silu))
        t0 += n
    return np.concatenate(outs), state


def run_gdn(case: dict, split: list[int], l2_eps: float | None) -> tuple[np.ndarray, np.ndarray]:
    state, outs, t0 = case["state"].copy(), [], 0
    for n in split:
        part = {name: case[name][t0 : t0 + n] for name in ("q", "k", "v", "g", "beta")}
        outs.append(hk.gated_delta_rule(**part, state=state, l2_eps=l2_eps))
        t0 += n
    return np.concatenate(outs), state


def run_mamba(case: dict, split: list[int], extras: bool) -> tuple[np.ndarray, np.ndarray]:
    state, outs, t0 = case["state"].copy(), [], 0
    kw = {"d": case["d"], "dt_bias": case["dt_bias"]} if extras else {}
    for n in split:
        part = [case[name][t0 : t0 + n] for name in ("x", "dt")] + [case["a"]]
        part += [case[name][t0 : t0 + n] for name in ("b", "c")]
        outs.append(hk.mamba2_scan(*part, state, **kw))
        t0 += n
    return np.concatenate(outs), state


# ---- references and batch invariance ----------------------------------------------------------


@pytest.mark.parametrize("channels,kernel", CONV_SIZES)
@pytest.mark.parametrize("bias,silu", [(False, False), (True, True)])
def test_conv1d_causal(channels: int, kernel: int, bias: bool, silu: bool, simd_path: str) -> None:
    case = conv_case(channels, kernel, seed=channels + kernel)
    runs = [run_conv(case, split, bias, silu) for split in SPLITS]
    ref_y, ref_state = conv_reference(case["x"], case["w"], case["state"], case["bias"] if bias else None, silu)
    np.testing.assert_allclose(runs[0][0], ref_y, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(runs[0][1], ref_state.astype(np.float32))  # the raw inputs, copied
    for split, (y, state) in zip(SPLITS[1:], runs[1:]):
        assert_bits_equal(y, runs[0][0], f"conv output, chunks {split}")
        assert_bits_equal(state, runs[0][1], f"conv state, chunks {split}")


def test_conv_state_after_fewer_tokens_than_taps() -> None:
    case = conv_case(5, 4, seed=0)
    state = case["state"].copy()
    hk.conv1d_causal(case["x"][:2], case["w"], state)
    np.testing.assert_array_equal(state, np.concatenate([case["state"][2:], case["x"][:2]]))


def test_l2_norms() -> None:
    x = uniform(np.random.default_rng(1), (9, 37), -3, 3)
    x[4] = 0.0
    np.testing.assert_allclose(hk.l2_norm(x, EPS), l2_reference(x, EPS), rtol=1e-6, atol=1e-7)
    assert not hk.l2_norm(x, EPS)[4].any()


@pytest.mark.parametrize("nk,nv,dk,dv", GDN_SIZES)
def test_gated_delta_rule(nk: int, nv: int, dk: int, dv: int, simd_path: str) -> None:
    case = gdn_case(nk, nv, dk, dv, seed=nk + nv + dk + dv)
    runs = [run_gdn(case, split, EPS) for split in SPLITS]
    ref_o, ref_state = gdn_reference(**case, l2_eps=EPS)
    np.testing.assert_allclose(runs[0][0], ref_o, rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(runs[0][1], ref_state, rtol=1e-5, atol=2e-6)
    for split, (o, state) in zip(SPLITS[1:], runs[1:]):
        assert_bits_equal(o, runs[0][0], f"delta-net output, chunks {split}")
        assert_bits_equal(state, runs[0][1], f"delta-net state, chunks {split}")


def test_gated_delta_rule_with_normalised_inputs() -> None:
    """Without l2_eps q and k are used as given; normalising them as llama.cpp's graph does
    (RMSNorm with eps/d_k, then times 1/sqrt(d_k)) is what l2_eps does inside."""
    case = gdn_case(2, 4, 16, 24, seed=5)
    dk = 16

    def norm(x: np.ndarray) -> np.ndarray:
        r = hk.rms_norm(x.reshape(-1, dk), None, float(np.float32(EPS) / np.float32(dk)))
        return (r * (np.float32(1) / np.sqrt(np.float32(dk)))).reshape(x.shape)

    pre = dict(case, q=norm(case["q"]), k=norm(case["k"]))
    o_in, s_in = run_gdn(case, [23], EPS)
    o_pre, s_pre = run_gdn(pre, [23], None)
    assert_bits_equal(o_pre, o_in, "output")
    assert_bits_equal(s_pre, s_in, "state")
    ref_o, _ = gdn_reference(**pre)
    np.testing.assert_allclose(o_pre, ref_o, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("nh,p,ng,ns", MAMBA_SIZES)
@pytest.mark.parametrize("extras", [False, True], ids=["plain", "d+dt_bias"])
def test_mamba2_scan(nh: int, p: int, ng: int, ns: int, extras: bool, simd_path: str) -> None:
    case = mamba_case(nh, p, ng, ns, seed=nh + p + ng + ns)
    runs = [run_mamba(case, split, extras) for split in SPLITS]
    kw = {"d": case["d"], "dt_bias": case["dt_bias"]} if extras else {}
    ref_y, ref_state = mamba_reference(*(case[n] for n in ("x", "dt", "a", "b", "c", "state")), **kw)
    np.testing.assert_allclose(runs[0][0], ref_y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(runs[0][1], ref_state, rtol=1e-5, atol=1e-5)
    for split, (y, state) in zip(SPLITS[1:], runs[1:]):
        assert_bits_equal(y, runs[0][0], f"mamba2 output, chunks {split}")
        assert_bits_equal(state, runs[0][1], f"mamba2 state, chunks {split}")


def test_paths_and_thread_counts_give_the_same_bits() -> None:
    """The scalar path emulates the AVX2 lanes, and work is split by head only."""
    conv, gdn, mamba = conv_case(37, 4, 1), gdn_case(2, 6, 40, 40, 2), mamba_case(4, 6, 2, 40, 3)

    def everything() -> list[np.ndarray]:
        return [*run_conv(conv, [23], True, True), *run_gdn(gdn, [23], EPS), *run_mamba(mamba, [23], True)]

    threads = hk.num_threads()
    try:
        results = []
        for scalar, n_threads in [(False, threads), (True, threads), (False, 1), (False, 3)]:
            hk.set_force_scalar(scalar)
            hk.set_num_threads(n_threads)
            results.append(everything())
    finally:
        hk.set_force_scalar(False)
        hk.set_num_threads(threads)
    for run in results[1:]:
        for got, want in zip(run, results[0]):
            assert_bits_equal(got, want, "path / thread count")


# ---- argument checks ---------------------------------------------------------------------------


def test_bad_arguments_raise_value_error() -> None:
    case = gdn_case(2, 4, 16, 24, seed=0)
    with pytest.raises(ValueError, match="state has shape"):
        hk.gated_delta_rule(**dict(case, state=np.zeros((4, 16, 24), np.float32)))
    with pytest.raises(ValueError, match="bad delta-net heads"):
        hk.gated_delta_rule(**dict(case, v=np.zeros((23, 3, 24), np.float32)))
    with pytest.raises(ValueError, match="beta has shape"):
        hk.gated_delta_rule(**dict(case, beta=case["beta"][:5]))
    with pytest.raises(ValueError, match="C-contiguous"):
        hk.gated_delta_rule(**dict(case, state=np.zeros((4, 16, 24), np.float32).transpose(0, 2, 1)))
    c = conv_case(8, 4, seed=0)
    with pytest.raises(ValueError, match="conv state has shape"):
        hk.conv1d_causal(c["x"], c["w"], np.zeros((4, 8), np.float32))
    with pytest.raises(ValueError, match="conv bias has shape"):
        hk.conv1d_causal(c["x"], c["w"], c["state"], bias=np.zeros(7, np.float32))
    with pytest.raises(ValueError, match="no taps"):
        hk.conv1d_causal(c["x"], np.zeros((8, 0), np.float32), np.zeros((0, 8), np.float32))
    m = mamba_case(4, 6, 2, 16, seed=0)
    with pytest.raises(ValueError, match="bad mamba2 shapes"):
        hk.mamba2_scan(m["x"], m["dt"], m["a"], m["b"][:, :1].repeat(3, 1), m["c"], m["state"])
    with pytest.raises(ValueError, match="dt_bias has shape"):
        hk.mamba2_scan(*(m[n] for n in ("x", "dt", "a", "b", "c", "state")), dt_bias=m["a"][:2])


def test_empty_input_leaves_state_alone() -> None:
    case = gdn_case(2, 4, 16, 24, seed=0)
    state = case["state"].copy()
    out = hk.gated_delta_rule(*(case[n][:0] for n in ("q", "k", "v", "g", "beta")), state)
    assert out.shape == (0, 4, 24)
    np.testing.assert_array_equal(state, case["state"])


# ---- bit-exact against llama.cpp's ggml (llama-cpp-python 0.3.36), one op at a time ------------


class Ggml:
    """ctypes over the libggml that llama-cpp-python ships (signatures of its 0.3.36 ggml)."""

    def __init__(self) -> None:
        llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
        if llama_cpp.__version__ != "0.3.36":
            pytest.skip(f"ggml signatures here are those of llama-cpp-python 0.3.36, not {llama_cpp.__version__}")
        lib = Path(llama_cpp.__file__).parent / "lib"
        self.base = ctypes.CDLL(str(lib / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
        self.cpu = ctypes.CDLL(str(lib / "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
        p, i64, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
        sigs = {
            "ggml_init": ([self.InitParams], p),
            "ggml_free": ([p], None),
            "ggml_new_tensor": ([p, ctypes.c_int, ctypes.c_int, ctypes.POINTER(i64)], p),
            "ggml_get_data": ([p], p),
            "ggml_nbytes": ([p], ctypes.c_size_t),
            "ggml_new_graph": ([p], p),
            "ggml_build_forward_expand": ([p, p], None),
            "ggml_gated_delta_net": ([p] * 7 + [i64], p),
            "ggml_ssm_conv": ([p] * 3, p),
            "ggml_ssm_scan": ([p] * 8 + [i64], p),
            "ggml_silu": ([p] * 2, p),
            "ggml_rms_norm": ([p, p, f32], p),
            "ggml_l2_norm": ([p, p, f32], p),
            "ggml_scale": ([p, p, f32], p),
        }
        for name, (args, res) in sigs.items():
            fn = getattr(self.base, name)
            fn.argtypes, fn.restype = args, res
        self.cpu.ggml_graph_compute_with_ctx.argtypes = [p, p, ctypes.c_int]
        self.cpu.ggml_graph_compute_with_ctx.restype = ctypes.c_int

    class InitParams(ctypes.Structure):
        _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]

    def run(self, build: Callable[..., int]) -> np.ndarray:
        """`build(op, tensor)` makes the graph with `op(name, *args)` and `tensor(array)`."""
        ctx = self.base.ggml_init(self.InitParams(64 << 20, None, False))
        try:

            def tensor(a: np.ndarray) -> int:
                a = np.ascontiguousarray(a)
                ne = (ctypes.c_int64 * 4)(*a.shape[::-1], *[1] * (4 - a.ndim))
                t = self.base.ggml_new_tensor(ctx, 26 if a.dtype == np.int32 else 0, a.ndim, ne)
                ctypes.memmove(self.base.ggml_get_data(t), a.ctypes.data, a.nbytes)
                return t

            out = build(lambda name, *args: getattr(self.base, name)(ctx, *args), tensor)
            graph = self.base.ggml_new_graph(ctx)
            self.base.ggml_build_forward_expand(graph, out)
            assert self.cpu.ggml_graph_compute_with_ctx(ctx, graph, 2) == 0
            res = np.empty(self.base.ggml_nbytes(out) // 4, np.float32)
            ctypes.memmove(res.ctypes.data, self.base.ggml_get_data(out), res.nbytes)
            return res
        finally:
            self.base.ggml_free(ctx)


@pytest.fixture(scope="module")
def ggml() -> Ggml:
    return Ggml()


@pytest.mark.parametrize("channels,kernel", [(64, 4), (37, 4), (21, 9)])
def test_conv_is_llama_cpp_bit_exact(ggml: Ggml, channels: int, kernel: int, simd_path: str) -> None:
    case = conv_case(channels, kernel, seed=7)
    sx = np.concatenate([case["state"], case["x"]]).T[None]  # ggml {K-1+T, C, 1}: time fastest
    want = ggml.run(lambda op, t: op("ggml_silu", op("ggml_ssm_conv", t(sx), t(case["w"]))))
    got, _ = run_conv(case, [23], False, True)
    assert_bits_equal(got, want.reshape(got.shape), "ssm_conv + silu")


@pytest.mark.parametrize("nk,nv,d", [(2, 4, 128), (1, 2, 40), (2, 2, 16)])
def test_gated_delta_rule_is_llama_cpp_bit_exact(ggml: Ggml, nk: int, nv: int, d: int, simd_path: str) -> None:
    case = gdn_case(nk, nv, d, d, seed=11)
    n = len(case["v"])

    def build(op, t):
        def norm(x):  # build_gdn_l2_norm: float eps / n, then 1.0f / sqrtf(n)
            eps_n, inv = np.float32(EPS) / np.float32(d), np.float32(1) / np.sqrt(np.float32(d))
            return op("ggml_scale", op("ggml_rms_norm", t(x[None]), float(eps_n)), float(inv))

        g, beta = case["g"].reshape(1, n, nv, 1), case["beta"].reshape(1, n, nv, 1)
        qkv = [norm(case["q"]), norm(case["k"]), t(case["v"][None])]
        return op("ggml_gated_delta_net", *qkv, t(g), t(beta), t(case["state"][None]), 1)

    want = ggml.run(build)
    for split in SPLITS:
        o, state = run_gdn(case, split, EPS)
        assert_bits_equal(o, want[: o.size].reshape(o.shape), f"output, chunks {split}")
        assert_bits_equal(state, want[o.size :].reshape(state.shape), f"state, chunks {split}")


@pytest.mark.parametrize("nh,p,ng,ns", [(4, 6, 2, 16), (3, 5, 1, 40), (8, 16, 1, 128)])
def test_mamba2_scan_is_llama_cpp_bit_exact(ggml: Ggml, nh: int, p: int, ng: int, ns: int, simd_path: str) -> None:
    case = mamba_case(nh, p, ng, ns, seed=13)
    args = [case[n][None] for n in ("state", "x", "dt")] + [case["a"].reshape(nh, 1)]
    args += [case[n][None] for n in ("b", "c")] + [np.zeros(1, np.int32)]
    want = ggml.run(lambda op, t: op("ggml_ssm_scan", *(t(a) for a in args), 1))
    y, state = run_mamba(case, [23], False)
    assert_bits_equal(y, want[: y.size].reshape(y.shape), "ssm_scan output")
    assert_bits_equal(state, want[y.size :].reshape(state.shape), "ssm_scan state")


def test_l2_norm_is_llama_cpp_bit_exact(ggml: Ggml) -> None:
    x = uniform(np.random.default_rng(17), (40, 128), -3, 3)
    want = ggml.run(lambda op, t: op("ggml_l2_norm", t(x), EPS))
    assert_bits_equal(hk.l2_norm(x, EPS), want.reshape(x.shape), "l2_norm")
