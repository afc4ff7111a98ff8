"""The Rust MoE FFN kernel (`hyserve_kernels.MoeFfn`) against a numpy reference: routing (softmax,
top-k with llama.cpp's tie order, renormalised weights), the routed experts on quantized 3-D expert
tensors, the sigmoid-gated shared expert; plus batch invariance, the fused gate_up layout, cancel
and shape errors."""

from __future__ import annotations

from dataclasses import dataclass

import gguf
import hyserve_kernels as hk
import numpy as np
import pytest

F32, Q8_0 = gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.Q8_0
N_EMBD, N_FF, N_SH = 64, 32, 64


def qmatrix(values: np.ndarray, qt: gguf.GGMLQuantizationType) -> tuple[hk.QMatrix, np.ndarray]:
    """A kernel matrix of `values` (rows x cols, or n_expert x rows x cols) stored as `qt`, and the
    values it really holds (dequantized)."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    flat = values.reshape(-1, values.shape[-1])
    raw = flat if qt == F32 else gguf.quants.quantize(flat, qt)
    held = flat if qt == F32 else gguf.quants.dequantize(raw, qt)
    data = np.frombuffer(np.ascontiguousarray(raw).tobytes(), dtype=np.uint8)
    return hk.QMatrix(data, int(qt), flat.shape[0], flat.shape[1]), held.reshape(values.shape).astype(np.float64)


@dataclass
class Layer:
    moe: hk.MoeFfn
    fused: hk.MoeFfn  # same weights, gate and up in one ffn_gate_up_exps tensor
    w: dict[str, np.ndarray]  # the held values, for the reference


def make_layer(qt: gguf.GGMLQuantizationType, n_expert: int, n_used: int, seed: int = 0) -> Layer:
    rng = np.random.default_rng(seed)
    s = 1.0 / np.sqrt(N_EMBD)
    raw = {
        "router": rng.standard_normal((n_expert, N_EMBD)) * 2 * s,
        "gate": rng.standard_normal((n_expert, N_FF, N_EMBD)) * s,
        "up": rng.standard_normal((n_expert, N_FF, N_EMBD)) * s,
        "down": rng.standard_normal((n_expert, N_EMBD, N_FF)) / np.sqrt(N_FF),
        "sh_gate": rng.standard_normal((N_SH, N_EMBD)) * s,
        "sh_up": rng.standard_normal((N_SH, N_EMBD)) * s,
        "sh_down": rng.standard_normal((N_EMBD, N_SH)) / np.sqrt(N_SH),
        "sh_gate_inp": rng.standard_normal((1, N_EMBD)) * s,
    }
    kept_f32 = ("router", "sh_gate_inp")  # llama.cpp keeps these F32
    mats, held = {}, {}
    for name, v in raw.items():
        mats[name], held[name] = qmatrix(v, F32 if name in kept_f32 else qt)
    gate_up, _ = qmatrix(np.concatenate([raw["gate"], raw["up"]], axis=1), qt)
    shared = {
        "shared_gate": mats["sh_gate"],
        "shared_up": mats["sh_up"],
        "shared_down": mats["sh_down"],
        "shared_gate_inp": mats["sh_gate_inp"],
    }
    moe = hk.MoeFfn(mats["router"], mats["gate"], mats["up"], mats["down"], n_used, **shared)
    fused = hk.MoeFfn(mats["router"], gate_up, None, mats["down"], n_used, **shared)
    return Layer(moe, fused, held)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def reference_route(w: dict[str, np.ndarray], x: np.ndarray, n_used: int) -> tuple[np.ndarray, np.ndarray]:
    logits = x.astype(np.float64) @ w["router"].T
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    ids = np.argsort(-p, axis=-1, kind="stable")[:, :n_used]  # llama.cpp: rows of <= 16 sort stably
    weights = np.take_along_axis(p, ids, -1)
    return ids, weights / weights.sum(-1, keepdims=True)


def reference_ffn(w: dict[str, np.ndarray], x: np.ndarray, n_used: int) -> np.ndarray:
    x = x.astype(np.float64)
    ids, weights = reference_route(w, x, n_used)
    out = np.zeros_like(x)
    for r in range(len(x)):
        for e, wt in zip(ids[r], weights[r]):
            h = silu(w["gate"][e] @ x[r]) * (w["up"][e] @ x[r])
            out[r] += wt * (w["down"][e] @ h)
    gate = 1.0 / (1.0 + np.exp(-(x @ w["sh_gate_inp"].T)))
    shared = (silu(x @ w["sh_gate"].T) * (x @ w["sh_up"].T)) @ w["sh_down"].T
    return out + gate * shared


def inputs(rows: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, N_EMBD)).astype(np.float32)


@pytest.mark.parametrize(("qt", "tol"), [(F32, 2e-5), (Q8_0, 3e-2)], ids=["f32", "q8_0"])
@pytest.mark.parametrize(("n_expert", "n_used"), [(8, 2), (40, 5)])
def test_matches_numpy_reference(qt: gguf.GGMLQuantizationType, tol: float, n_expert: int, n_used: int) -> None:
    layer = make_layer(qt, n_expert, n_used)
    x = inputs(9)
    ids, weights = layer.moe.route(x)
    ref_ids, ref_weights = reference_route(layer.w, x, n_used)
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_allclose(weights, ref_weights, rtol=1e-5)
    out, ref = layer.moe(x), reference_ffn(layer.w, x, n_used)
    assert out.shape == (9, N_EMBD) and out.dtype == np.float32
    # Q8_0 also rounds the activations to 8 bits (as llama.cpp does), hence its looser bound
    err = np.abs(out - ref).max() / np.abs(ref).max()
    assert err < tol, err


def test_equal_probabilities_pick_the_lowest_experts_first() -> None:
    """ggml's argsort is std::sort: rows of at most 16 elements come out stably sorted."""
    layer = make_layer(F32, 8, 3)
    x = np.zeros((2, N_EMBD), np.float32)  # every router logit 0: all probabilities equal
    ids, weights = layer.moe.route(x)
    np.testing.assert_array_equal(ids, [[0, 1, 2], [0, 1, 2]])
    np.testing.assert_array_equal(weights, np.full((2, 3), np.float32(1 / 8) / np.float32(3 / 8)))


@pytest.mark.parametrize("qt", [F32, Q8_0], ids=["f32", "q8_0"])
def test_batch_invariance_and_fused_gate_up(qt: gguf.GGMLQuantizationType) -> None:
    layer = make_layer(qt, 12, 3)
    x = inputs(21)
    batch = layer.moe(x)
    np.testing.assert_array_equal(layer.fused(x), batch)
    for r in (0, 7, 20):
        np.testing.assert_array_equal(layer.moe(x[r : r + 1])[0], batch[r])
    other = np.concatenate([inputs(5, seed=9), x[3:11]])
    np.testing.assert_array_equal(layer.moe(other)[5:], batch[3:11])


def test_cancel_raises() -> None:
    layer = make_layer(F32, 8, 2)
    flag = hk.CancelFlag()
    flag.set()
    with pytest.raises(hk.Cancelled):
        layer.moe(inputs(4), flag)
    assert layer.moe(inputs(4), hk.CancelFlag()).shape == (4, N_EMBD)


def test_shape_errors() -> None:
    layer = make_layer(F32, 8, 2)
    with pytest.raises(ValueError, match="columns"):
        layer.moe(np.zeros((2, N_EMBD + 1), np.float32))
    router, _ = qmatrix(np.zeros((8, N_EMBD)), F32)
    gate, _ = qmatrix(np.zeros((8, N_FF, N_EMBD)), F32)
    down, _ = qmatrix(np.zeros((8, N_EMBD, N_FF)), F32)
    with pytest.raises(ValueError, match="experts used"):
        hk.MoeFfn(router, gate, gate, down, 9)
    with pytest.raises(ValueError, match="down experts"):
        hk.MoeFfn(router, gate, gate, gate, 2)
    with pytest.raises(ValueError, match="shared"):
        hk.MoeFfn(router, gate, gate, down, 2, shared_gate=router)
