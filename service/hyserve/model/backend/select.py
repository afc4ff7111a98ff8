"""Choosing the device: `--device cpu|gpu|auto`, `--gpu-backend` / HYSERVE_WGPU_BACKEND, `--gpu-adapter`,
HYSERVE_WGPU_FEATURES (the optional adapter features the shaders may use: "subgroups", "f16"; a
comma list, "none", or unset / "all" for every one the adapter has; same bits either way, so it is
a switch for working around a driver, not a setting to tune).

- cpu: the SIMD kernels.
- gpu: the best wgpu adapter: a hardware one if there is one, else a software adapter (Mesa's
  lavapipe), with a warning: asking for the GPU by name is asking for whatever GPU exists.
- auto: a hardware adapter if there is one, else the CPU (never a software adapter).
"""

from __future__ import annotations

import argparse
import os

import hyserve_kernels as hk
import structlog

from hyserve.model.backend.base import Backend
from hyserve.model.backend.cpu import CPU

log = structlog.get_logger(__name__)

DEVICES = ("cpu", "gpu", "auto")
BACKEND_ENV = "HYSERVE_WGPU_BACKEND"
FEATURES_ENV = "HYSERVE_WGPU_FEATURES"


def features_from_env() -> list[str] | None:
    """HYSERVE_WGPU_FEATURES as `GpuDevice(features=...)` takes it: None for all (unset, empty,
    "all"), [] for "none", else the names (the device refuses unknown ones)."""
    value = os.environ.get(FEATURES_ENV, "").strip().lower()
    if value in ("", "all"):
        return None
    if value == "none":
        return []
    return [name.strip() for name in value.split(",") if name.strip()]


def add_device_arguments(p: argparse.ArgumentParser) -> None:
    """`--device`, `--gpu-backend`, `--gpu-adapter` (for `run` and `serve`)."""
    p.add_argument(
        "--device",
        choices=DEVICES,
        default="cpu",
        help="where the model runs: cpu, gpu (wgpu; a software adapter if no GPU), auto (a GPU adapter, else cpu)",
    )
    p.add_argument(
        "--gpu-backend",
        default=None,
        help=f"wgpu backend: vulkan, metal or dx12 (default: ${BACKEND_ENV}, else the best found)",
    )
    p.add_argument("--gpu-adapter", default=None, help="use the GPU adapter whose name contains this text")


class DeviceError(RuntimeError):
    """No device fits the request; the message names what was found."""


def open_backend(device: str = "cpu", gpu_backend: str | None = None, gpu_adapter: str | None = None) -> Backend:
    if device not in DEVICES:
        raise DeviceError(f"unknown device {device!r} (choose from {', '.join(DEVICES)})")
    if device == "cpu":
        return CPU
    from hyserve.model.backend.gpu import GpuBackend

    backend = gpu_backend or os.environ.get(BACKEND_ENV) or None
    features = features_from_env()
    try:
        gpu = GpuBackend(hk.GpuDevice(backend, gpu_adapter, allow_software=False, features=features))
    except ValueError as hardware_error:
        if device == "auto":
            log.info("device_auto_cpu", reason=str(hardware_error))
            return CPU
        try:
            gpu = GpuBackend(hk.GpuDevice(backend, gpu_adapter, allow_software=True, features=features))
        except ValueError as exc:
            raise DeviceError(str(exc)) from None
        log.warning("gpu_software_adapter", adapter=gpu.description, note="a software adapter: correct, not fast")
    log.info("gpu_device", adapter=gpu.description, features=gpu.device.features)
    return gpu
