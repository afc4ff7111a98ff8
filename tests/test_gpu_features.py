"""Optional adapter features (subgroups, shader-f16): reported, switchable, refused by unknown name,
and giving the same bits as the plain shaders they replace, kernel by kernel and end to end."""

from __future__ import annotations

from pathlib import Path

import hyserve_kernels as hk
import numpy as np
import pytest
from fixtures import make_models
from test_gpu_kernels import ALL_TYPES, K_QUANTS, random_matrix

from hyserve.model.architectures.base import Segment
from hyserve.model.backend.gpu import GpuBackend
from hyserve.model.backend.select import FEATURES_ENV, features_from_env
from hyserve.model.gguf_file import GGUFFile
from hyserve.model.loader import ARCHITECTURES


def open_device(**kw) -> hk.GpuDevice:
    try:
        return hk.GpuDevice(None, None, allow_software=True, numerics="exact", **kw)
    except ValueError as exc:
        pytest.skip(f"no wgpu adapter on this machine: {exc}")


def with_and_without(feature: str, **kw) -> tuple[hk.GpuDevice, hk.GpuDevice]:
    """A device using `feature` and one using no optional feature; skips where the adapter lacks
    it (or it failed its probe: the device then falls back, which the test above covers)."""
    on = open_device(features=[feature], **kw)
    if feature not in on.features:
        pytest.skip(f"{on.name} has no usable {feature}")
    return on, open_device(features=[], **kw)


def test_features_in_use_are_reported_and_chosen_by_name() -> None:
    full = open_device()
    assert set(full.features) <= {"subgroups", "f16"}
    assert open_device(features=[]).features == []
    for name in ("subgroups", "f16"):
        assert open_device(features=[name]).features == [f for f in full.features if f == name]
    with pytest.raises(ValueError, match=r'unknown GPU feature "tensor-cores" \(known: subgroups, f16\)'):
        hk.GpuDevice(None, None, allow_software=True, features=["tensor-cores"])


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("", None),
        ("all", None),
        ("none", []),
        ("f16", ["f16"]),
        (" subgroups , f16 ", ["subgroups", "f16"]),
    ],
)
def test_features_from_the_environment(monkeypatch: pytest.MonkeyPatch, value: str | None, expected) -> None:
    if value is None:
        monkeypatch.delenv(FEATURES_ENV, raising=False)
    else:
        monkeypatch.setenv(FEATURES_ENV, value)
    assert features_from_env() == expected


@pytest.mark.parametrize("t", ALL_TYPES, ids=lambda t: t.name)
def test_subgroup_lane_join_gives_the_same_bits(t) -> None:
    """Eight threads per weight row: their lanes joined by subgroup shuffles or through workgroup
    memory, the same bits (a full step of sub-blocks and a partial one; 9 activation rows: a full
    tile and one more)."""
    on, off = with_and_without("subgroups", lanes=8)
    cols = 512 if t in K_QUANTS else 320
    m, _ = random_matrix(t, 37, cols)
    x = np.random.default_rng(3).standard_normal((9, cols)).astype(np.float32)
    np.testing.assert_array_equal(
        on.to_host(on.matmul(on.matrix(m), on.tensor(x))), off.to_host(off.matmul(off.matrix(m), off.tensor(x)))
    )


def test_native_f16_rounding_gives_the_same_bits() -> None:
    """GEGLU looks GELU up by the f16 bits of its input: the hardware's rounding and the integer one
    pick the same entries, ties and subnormals included."""
    on, off = with_and_without("f16")
    rng = np.random.default_rng(5)
    a = np.concatenate([rng.standard_normal(4096) * 4, rng.standard_normal(1024) * 1e-6]).astype(np.float32)
    a[:4] = [1.0 + 2.0**-11, -(1.0 + 3 * 2.0**-11), 2.0**-25, 65520.0]
    b = rng.standard_normal(a.size).astype(np.float32)
    got_on = on.to_host(on.geglu(on.tensor(a), on.tensor(b)))
    np.testing.assert_array_equal(got_on, off.to_host(off.geglu(off.tensor(a), off.tensor(b))))


@pytest.mark.parametrize("arch", ["llama", "qwen35moe"])
def test_models_give_the_same_bits_with_and_without_features(tmp_path: Path, arch: str) -> None:
    """A forward pass (f16 KV cache, f16-rounded activations, the matmul at eight lanes, MoE experts
    on qwen35moe) with every feature the adapter has and with none."""
    on, off = open_device(lanes=8), open_device(lanes=8, features=[])
    if not on.features:
        pytest.skip(f"{on.name} has no usable optional feature")
    path = make_models.write_model(tmp_path / f"{arch}.gguf", arch, qtype="q8_0")
    results = []
    for device in (on, off):
        model = ARCHITECTURES[arch](GGUFFile.open(path), GpuBackend(device))
        tokens = np.arange(3, 40, dtype=np.int32)
        memory = model.new_memory(64)
        first = model.forward([Segment(memory, tokens[:30])])[0]
        results.append(np.concatenate([first, model.forward([Segment(memory, tokens[30:])])[0]]))
    np.testing.assert_array_equal(results[0], results[1])
