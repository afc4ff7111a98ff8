"""Choosing the device: the flags make one `DeviceRequest`, and `build_on_device` owns every fallback
to the CPU: `--device auto` runs on the CPU what the GPU path refuses, `--device gpu` names the
refusal. Real models and, where the GPU path is taken, the real wgpu device (a software adapter
where no GPU exists)."""

from __future__ import annotations

import argparse
from pathlib import Path

import hyserve_kernels as hk
import numpy as np
import pytest
from fixtures import make_models

from hyserve.device_flags import add_device_arguments, device_request
from hyserve.model.architectures.base import Architecture, Logits, Segment
from hyserve.model.backend import CPU, DeviceError, DeviceRequest, GpuUnsupported
from hyserve.model.backend.base import Backend
from hyserve.model.backend.select import build_on_device
from hyserve.model.gguf_file import GGUFFile
from hyserve.model.loader import ARCHITECTURES, load_model, probe


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_device_arguments(p)
    return p.parse_args(list(argv))


def builder(path: Path):
    """The loader's build step for `path`: the architecture on a backend, one token through it."""

    def build(ops: Backend) -> Architecture:
        gguf = GGUFFile.open(path)
        arch = ARCHITECTURES[gguf.architecture](gguf, ops)
        probe(arch)
        return arch

    return build


@pytest.fixture(scope="module")
def unrotated_imrope(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A qwen35 whose IMROPE sections leave rotary pairs unrotated: no GPU kernel handles that."""
    tmp = tmp_path_factory.mktemp("imrope")
    return make_models.write_model(tmp / "imrope.gguf", "qwen35", qtype="q8_0", rope_sections=[1, 1, 1, 1])


def test_the_flags_make_one_request() -> None:
    assert device_request(parse()) == DeviceRequest("cpu", None, None, "fast", None)
    args = parse("--device", "gpu", "--gpu-backend", "vulkan", "--gpu-adapter", "llvm", "--gpu-numerics", "exact")
    assert device_request(args, cpu_only="ring") == DeviceRequest("gpu", "vulkan", "llvm", "exact", "ring")
    with pytest.raises(SystemExit):
        parse("--gpu-numerics", "bitwise")


def test_unknown_devices_and_numerics_are_refused() -> None:
    with pytest.raises(DeviceError, match="unknown device 'tpu'"):
        DeviceRequest("tpu")
    with pytest.raises(DeviceError, match="unknown GPU numerics 'bitwise'"):
        DeviceRequest("gpu", gpu_numerics="bitwise")
    with pytest.raises(ValueError, match="unknown GPU numerics"):
        hk.GpuDevice(None, None, allow_software=True, numerics="bitwise")


def test_the_device_opens_in_the_numerics_asked_for(gpu_device, gpu_fast_device) -> None:
    assert (gpu_device.numerics, gpu_fast_device.numerics) == ("exact", "fast")


def test_auto_runs_on_the_cpu_what_the_gpu_path_refuses(unrotated_imrope: Path, gpu_fast_backend) -> None:
    build = builder(unrotated_imrope)
    with pytest.raises(GpuUnsupported, match="IMROPE"):
        build_on_device(DeviceRequest("gpu"), build, True, opener=lambda _: gpu_fast_backend)
    arch = build_on_device(DeviceRequest("auto"), build, True, opener=lambda _: gpu_fast_backend)
    assert arch.ops is CPU
    tokens = np.arange(3, 12, dtype=np.int32)
    np.testing.assert_array_equal(logits(arch, tokens), logits(build(CPU), tokens))


def logits(arch: Architecture, tokens: np.ndarray) -> np.ndarray:
    return arch.forward([Segment(arch.new_memory(32), tokens, Logits.ALL)])[0]


def test_cpu_only_options_and_architectures_without_a_gpu_path(tmp_path: Path, gpu_fast_backend) -> None:
    path = make_models.write_model(tmp_path / "llama.gguf", "llama", qtype="q8_0")
    build = builder(path)
    ring = DeviceRequest("gpu", cpu_only="--swa-cache ring (ring caches are CPU-only)")
    with pytest.raises(DeviceError, match="--swa-cache ring"):
        build_on_device(ring, build, True, opener=lambda _: gpu_fast_backend)
    assert build_on_device(DeviceRequest("auto", cpu_only="ring"), build, True).ops is CPU
    with pytest.raises(DeviceError, match="has no GPU path yet"):
        build_on_device(DeviceRequest("gpu"), build, False, what="this architecture")
    assert build_on_device(DeviceRequest("auto"), build, False).ops is CPU
    assert build_on_device(DeviceRequest("gpu"), build, True, opener=lambda _: gpu_fast_backend).ops is gpu_fast_backend


def test_auto_without_a_hardware_adapter_loads_on_the_cpu(tmp_path: Path) -> None:
    if any(not software for _, software in hk.GpuDevice.adapters()):
        pytest.skip("a hardware adapter exists here: auto takes it")
    path = make_models.write_model(tmp_path / "llama.gguf", "llama", qtype="q8_0")
    assert load_model(path, device=DeviceRequest("auto")).arch.ops is CPU
