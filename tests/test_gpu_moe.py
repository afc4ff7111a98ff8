"""The mixture-of-experts FFN on the GPU (`hk.GpuMoeFfn`) against the CPU kernel (`hk.MoeFfn`) on
random data: routing (softmax, libstdc++'s sort order on ties, renormalised weights) on the same
logits, the FFN output, batch invariance, determinism, split bindings, and one MoE layer of a
qwen35moe fixture through both backends. Runs on any wgpu adapter (CI: lavapipe)."""

from __future__ import annotations

from pathlib import Path

import hyserve_kernels as hk
import numpy as np
import pytest
from fixtures.make_models import write_model
from gguf import GGMLQuantizationType as T
from gguf.quants import quantize
from test_gpu_kernels import k_quant_bytes

from hyserve.model.architectures.ffn import MoeBlock, load_moe
from hyserve.model.backend import CPU
from hyserve.model.backend.gpu import GpuBackend
from hyserve.model.gguf_file import GGUFFile
from hyserve.model.weights import WeightLoader


def matrix(t: T, rows: int, cols: int, rng: np.random.Generator, scale: float = 1.0) -> hk.QMatrix:
    if t in (T.Q4_K, T.Q5_K, T.Q6_K):
        data = k_quant_bytes(t, rows, cols, rng)
    else:
        values = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
        data = np.ascontiguousarray(quantize(values, t)).view(np.uint8).reshape(-1)
    return hk.QMatrix(data, int(t), rows, cols)


def make_moe(
    t: T, n_embd: int, n_ff: int, n_expert: int, k: int, *, shared: str = "gated", fused: bool = False, seed: int = 0
) -> hk.MoeFfn:
    """Random expert tensors of type t; router and shared gate F32 (as llama.cpp keeps them).
    shared: "gated", "ungated" or "none"."""
    rng = np.random.default_rng(seed)
    s = 1.0 / np.sqrt(n_embd)
    router = matrix(T.F32, n_expert, n_embd, rng, 2 * s)
    if fused:
        gate, up = matrix(t, n_expert * 2 * n_ff, n_embd, rng, s), None
    else:
        gate, up = matrix(t, n_expert * n_ff, n_embd, rng, s), matrix(t, n_expert * n_ff, n_embd, rng, s)
    down = matrix(t, n_expert * n_embd, n_ff, rng, 1.0 / np.sqrt(n_ff))
    kw: dict[str, hk.QMatrix] = {}
    if shared != "none":
        kw = {
            "shared_gate": matrix(t, n_ff, n_embd, rng, s),
            "shared_up": matrix(t, n_ff, n_embd, rng, s),
            "shared_down": matrix(t, n_embd, n_ff, rng, 1.0 / np.sqrt(n_ff)),
        }
        if shared == "gated":
            kw["shared_gate_inp"] = matrix(T.F32, 1, n_embd, rng, s)
    return hk.MoeFfn(router, gate, up, down, k, True, 0.0, **kw)


def identity_router(n_expert: int, k: int, seed: int = 0) -> hk.MoeFfn:
    """A MoE whose router is the identity: its logits are its input, exactly, on both devices."""
    rng = np.random.default_rng(seed)
    eye = np.eye(n_expert, dtype=np.float32).view(np.uint8).reshape(-1)
    router = hk.QMatrix(eye, int(T.F32), n_expert, n_expert)
    gate = matrix(T.F32, n_expert * 2, n_expert, rng)
    down = matrix(T.F32, n_expert * n_expert, 2, rng)
    return hk.MoeFfn(router, gate, gate, down, k)


# (n_expert, k, ties): rows of <= 16 (insertion sort), longer rows (introsort), the largest router
# the GPU takes; with ties (a few logit levels) the sort's tie order decides. A tail past the groups
# of 8 (37) only without ties: the CPU takes libm's expf there, ggml's exp elsewhere, so its equal
# logits can differ by an ulp in probability, and the tie order with them (no real MoE has a tail).
ROUTERS = [(8, 2, False), (8, 2, True), (37, 5, False), (64, 8, True), (128, 8, False), (128, 8, True), (512, 10, True)]


@pytest.mark.parametrize(("n_expert", "k", "ties"), ROUTERS)
def test_routing_matches_the_cpu_on_the_same_logits(gpu_device, n_expert: int, k: int, ties: bool) -> None:
    rng = np.random.default_rng(n_expert + k)
    rows = 7
    if ties:
        logits = rng.integers(0, 3, (rows, n_expert)).astype(np.float32)
    else:
        logits = (rng.standard_normal((rows, n_expert)) * 3).astype(np.float32)
    cpu = identity_router(n_expert, k)
    gpu = hk.GpuMoeFfn(gpu_device, cpu)
    want_ids, want_w = cpu.route(logits)
    got_ids, got_w = gpu.route_logits(gpu_device.tensor(logits))
    np.testing.assert_array_equal(got_ids, want_ids)
    assert got_ids.dtype == np.int32 and got_w.dtype == np.float32
    # the f64 sums and the divisions are the CPU's (emulated exactly); the exponentials may differ
    # in the last bit (adapters that do not fuse fma; libm's expf on the CPU for a tail past 8)
    np.testing.assert_allclose(got_w, want_w, rtol=1e-6)
    # through the router product (the identity) as well
    np.testing.assert_array_equal(gpu.route(gpu_device.tensor(logits))[0], want_ids)


CASES = [
    # type, n_embd, n_ff, n_expert, k, shared, fused
    (T.F32, 72, 20, 9, 3, "gated", False),
    (T.F16, 64, 48, 16, 4, "ungated", False),
    (T.Q8_0, 96, 64, 40, 5, "gated", True),
    (T.Q4_0, 64, 32, 12, 1, "none", False),
    (T.Q4_K, 256, 256, 8, 2, "gated", False),
    (T.Q6_K, 256, 256, 6, 6, "gated", True),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0].name}-e{c[3]}k{c[4]}-{c[5]}{'-fused' * c[6]}")
def test_moe_output_matches_the_cpu(gpu_device, case: tuple) -> None:
    t, n_embd, n_ff, n_expert, k, shared, fused = case
    cpu = make_moe(t, n_embd, n_ff, n_expert, k, shared=shared, fused=fused)
    gpu = hk.GpuMoeFfn(gpu_device, cpu)
    x = np.random.default_rng(5).standard_normal((11, n_embd)).astype(np.float32)
    xt = gpu_device.tensor(x)
    ids, w = gpu.route(xt)
    want_ids, want_w = cpu.route(x)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(w, want_w, rtol=1e-5)
    got, want = gpu_device.to_host(gpu(xt)), cpu(x)
    assert got.shape == want.shape == (11, n_embd)
    # the products match the CPU's up to their float summation order (as test_gpu_kernels' matmul)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


@pytest.mark.parametrize("t", [T.Q8_0, T.Q4_K], ids=lambda t: t.name)
def test_moe_is_deterministic_and_batch_invariant(gpu_device, t: T) -> None:
    n_embd = 256
    cpu = make_moe(t, n_embd, 256 if t == T.Q4_K else 64, 12, 3)
    gpu = hk.GpuMoeFfn(gpu_device, cpu)
    x = np.random.default_rng(6).standard_normal((21, n_embd)).astype(np.float32)
    whole = gpu_device.to_host(gpu(gpu_device.tensor(x)))
    np.testing.assert_array_equal(gpu_device.to_host(gpu(gpu_device.tensor(x))), whole)
    for lo, hi in [(0, 1), (7, 8), (3, 11), (20, 21)]:
        np.testing.assert_array_equal(gpu_device.to_host(gpu(gpu_device.tensor(x[lo:hi]))), whole[lo:hi])
    other = np.concatenate([np.random.default_rng(9).standard_normal((5, n_embd)).astype(np.float32), x[3:11]])
    np.testing.assert_array_equal(gpu_device.to_host(gpu(gpu_device.tensor(other)))[5:], whole[3:11])


@pytest.mark.parametrize("t", [T.Q8_0, T.Q4_K], ids=lambda t: t.name)
def test_moe_lanes_give_the_same_bits(t: T) -> None:
    """The expert products on one thread per weight row (software adapters) or eight (GPUs, the
    routed tile's activations in workgroup memory): the same bits."""
    try:
        one = hk.GpuDevice(None, None, allow_software=True, lanes=1)
        eight = hk.GpuDevice(None, None, allow_software=True, lanes=8)
    except ValueError as exc:
        pytest.skip(f"no wgpu adapter on this machine: {exc}")
    cpu = make_moe(t, 256, 256 if t == T.Q4_K else 96, 12, 3, shared="gated")
    x = np.random.default_rng(10).standard_normal((13, 256)).astype(np.float32)
    a = one.to_host(hk.GpuMoeFfn(one, cpu)(one.tensor(x)))
    np.testing.assert_array_equal(a, eight.to_host(hk.GpuMoeFfn(eight, cpu)(eight.tensor(x))))


def test_fused_gate_up_gives_the_same_bits(gpu_device) -> None:
    rng = np.random.default_rng(7)
    n_embd, n_ff, n_expert = 96, 32, 10
    gate = rng.standard_normal((n_expert, n_ff, n_embd)).astype(np.float32) * 0.1
    up = rng.standard_normal((n_expert, n_ff, n_embd)).astype(np.float32) * 0.1

    def q(v: np.ndarray) -> hk.QMatrix:
        flat = np.ascontiguousarray(v.reshape(-1, v.shape[-1]))
        return hk.QMatrix(np.ascontiguousarray(quantize(flat, T.Q8_0)).view(np.uint8).reshape(-1), 8, *flat.shape)

    router = matrix(T.F32, n_expert, n_embd, rng)
    down = matrix(T.Q8_0, n_expert * n_embd, n_ff, rng)
    apart = hk.MoeFfn(router, q(gate), q(up), down, 3)
    fused = hk.MoeFfn(router, q(np.concatenate([gate, up], axis=1)), None, down, 3)
    x = gpu_device.tensor(rng.standard_normal((5, n_embd)).astype(np.float32))
    a = gpu_device.to_host(hk.GpuMoeFfn(gpu_device, apart)(x))
    b = gpu_device.to_host(hk.GpuMoeFfn(gpu_device, fused)(x))
    np.testing.assert_array_equal(a, b)


def test_expert_tensors_split_across_bindings() -> None:
    """Expert tensors past the binding limit are cut into row chunks, experts straddling them."""
    try:
        small = hk.GpuDevice(None, None, allow_software=True, max_binding=1024)
        whole = hk.GpuDevice(None, None, allow_software=True)
    except ValueError as exc:
        pytest.skip(f"no wgpu adapter on this machine: {exc}")
    cpu = make_moe(T.Q8_0, 96, 64, 7, 2, fused=True)  # 102 bytes a row: 10 rows a binding
    x = np.random.default_rng(8).standard_normal((6, 96)).astype(np.float32)
    outs = [dev.to_host(hk.GpuMoeFfn(dev, cpu)(dev.tensor(x))) for dev in (small, whole)]
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_allclose(outs[1], cpu(x), rtol=1e-4, atol=1e-4 * float(np.abs(outs[1]).max()))


def test_moe_weights_stay_in_block_formats(gpu_device) -> None:
    cpu = make_moe(T.Q4_K, 256, 256, 8, 2, shared="none")
    gpu = hk.GpuMoeFfn(gpu_device, cpu)
    # router F32 8x256, gate/up/down Q4_K (144 bytes a 256-block): no f32 copy of the experts
    assert gpu.nbytes == 8 * 256 * 4 + 3 * 8 * 256 * 144
    with pytest.raises(ValueError, match="not rows of 256"):
        gpu(gpu_device.tensor(np.zeros((2, 128), np.float32)))


@pytest.mark.parametrize("qtype", ["f32", "q8_0"])
def test_fixture_moe_layer_on_both_backends(gpu_device, tmp_path: Path, qtype: str) -> None:
    """One qwen35moe block's MoE FFN loaded through each backend: the CPU backend is `MoeFfn`
    itself (the bits of today), the GPU backend's output agrees with it."""
    path = write_model(tmp_path / "moe.gguf", "qwen35moe", qtype=qtype, layers=1, n_expert=8, n_expert_used=3)
    gguf = GGUFFile.open(path)
    cpu_block = load_moe(WeightLoader(gguf, CPU), "blk.0.", 8, 3)
    gpu_backend = GpuBackend(gpu_device)
    gpu_block = load_moe(WeightLoader(gguf, gpu_backend), "blk.0.", 8, 3)
    assert isinstance(cpu_block, MoeBlock) and isinstance(cpu_block.moe, hk.MoeFfn)
    x = np.random.default_rng(3).standard_normal((9, 64)).astype(np.float32)
    want = cpu_block(x)
    np.testing.assert_array_equal(want, cpu_block.moe(x))
    got = gpu_backend.to_host(gpu_block(gpu_backend.device.tensor(x)))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
