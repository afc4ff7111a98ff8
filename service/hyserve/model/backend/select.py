"""Choosing the device, in one place: a `DeviceRequest` built once from the flags (`--device
cpu|gpu|auto`, `--gpu-backend` / HYSERVE_WGPU_BACKEND, `--gpu-adapter`, `--gpu-numerics`,
HYSERVE_WGPU_FEATURES), and `build_on_device`, which opens the backend, builds the architecture on
it and owns every fallback to the CPU.

- cpu: the SIMD kernels.
- gpu: the best wgpu adapter: a hardware one if there is one, else a software adapter (Mesa's
  lavapipe), with a warning: asking for the GPU by name is asking for whatever GPU exists. What the
  GPU path refuses (an architecture without shaders, a layout no kernel handles, ring caches) is an
  error that names the reason.
- auto: a hardware adapter if there is one, else the CPU (never a software adapter); what the GPU
  path refuses runs on the CPU, with the reason logged.

HYSERVE_WGPU_FEATURES names the optional adapter features the shaders may use ("subgroups", "f16";
a comma list, "none", or unset / "all" for every one the adapter has); same bits either way, so it
is a switch for working around a driver, not a setting to tune. `--gpu-numerics` is a numerics
choice: "fast" (default) uses the adapter's float operations, "exact" gives the CPU kernels' bits.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import hyserve_kernels as hk
import structlog

from hyserve.model.backend.base import Backend
from hyserve.model.backend.cpu import CPU
from hyserve.model.backend.errors import DeviceError, GpuUnsupported

log = structlog.get_logger(__name__)

DEVICES = ("cpu", "gpu", "auto")
NUMERICS = ("fast", "exact")
BACKEND_ENV = "HYSERVE_WGPU_BACKEND"
FEATURES_ENV = "HYSERVE_WGPU_FEATURES"

Built = TypeVar("Built")


@dataclass(frozen=True)
class DeviceRequest:
    """Where the forward pass should run, as the flags ask for it."""

    device: str = "cpu"
    gpu_backend: str | None = None  # vulkan, metal, dx12 (None: $HYSERVE_WGPU_BACKEND, else any)
    gpu_adapter: str | None = None  # a substring of the adapter's name
    gpu_numerics: str = "fast"
    cpu_only: str | None = None  # why this model must run on the CPU (a CPU-only option), if it must

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise DeviceError(f"unknown device {self.device!r} (choose from {', '.join(DEVICES)})")
        if self.gpu_numerics not in NUMERICS:
            raise DeviceError(f"unknown GPU numerics {self.gpu_numerics!r} (choose from {', '.join(NUMERICS)})")


def features_from_env() -> list[str] | None:
    """HYSERVE_WGPU_FEATURES as `GpuDevice(features=...)` takes it: None for all (unset, empty,
    "all"), [] for "none", else the names (the device refuses unknown ones)."""
    value = os.environ.get(FEATURES_ENV, "").strip().lower()
    if value in ("", "all"):
        return None
    if value == "none":
        return []
    return [name.strip() for name in value.split(",") if name.strip()]


def open_backend(request: DeviceRequest) -> Backend:
    """The backend the request asks for: the CPU or a GPU device. `gpu` with no adapter at all is a
    DeviceError; `auto` without a hardware adapter is the CPU."""
    if request.device == "cpu":
        return CPU
    from hyserve.model.backend.gpu import GpuBackend

    backend = request.gpu_backend or os.environ.get(BACKEND_ENV) or None
    features = features_from_env()

    def device(allow_software: bool) -> hk.GpuDevice:
        return hk.GpuDevice(
            backend,
            request.gpu_adapter,
            allow_software=allow_software,
            features=features,
            numerics=request.gpu_numerics,
        )

    try:
        gpu = GpuBackend(device(allow_software=False))
    except ValueError as hardware_error:
        if request.device == "auto":
            log.info("device_auto_cpu", reason=str(hardware_error))
            return CPU
        try:
            gpu = GpuBackend(device(allow_software=True))
        except ValueError as exc:
            raise DeviceError(str(exc)) from None
        log.warning("gpu_software_adapter", adapter=gpu.description, note="a software adapter: correct, not fast")
    log.info("gpu_device", adapter=gpu.description, features=gpu.device.features, numerics=gpu.device.numerics)
    return gpu


def build_on_device(
    request: DeviceRequest,
    build: Callable[[Backend], Built],
    has_gpu_path: bool,
    what: str = "the model",
    opener: Callable[[DeviceRequest], Backend] = open_backend,
) -> Built:
    """`build(backend)` on the backend the request asks for (`opener` opens it). Every CPU
    fallback is here: with `auto`, a model the GPU path refuses (no GPU path for its architecture,
    a CPU-only option, a `GpuUnsupported` from building it) is built on the CPU; with `gpu` the
    refusal is an error."""
    refusal = _gpu_refusal(request, has_gpu_path, what)
    if refusal is not None:
        if request.device == "gpu":
            raise DeviceError(f"{refusal} (use --device cpu)")
        log.info("device_auto_cpu", reason=refusal)
        return build(CPU)
    backend = opener(request)
    try:
        return build(backend)
    except GpuUnsupported as exc:
        if request.device == "gpu":
            raise
        log.info("device_auto_cpu", reason=str(exc))
        return build(CPU)


def _gpu_refusal(request: DeviceRequest, has_gpu_path: bool, what: str) -> str | None:
    """Why the GPU path cannot take this model before any device is opened, or None."""
    if request.device == "cpu":
        return None
    if not has_gpu_path:
        return f"{what} has no GPU path yet"
    return request.cpu_only
