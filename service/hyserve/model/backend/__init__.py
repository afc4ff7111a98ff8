"""Where the model's math runs. An architecture calls the operations of one `Backend` on its
tensors; `CpuBackend` runs them with the SIMD kernels on numpy arrays, `GpuBackend` with the wgpu
compute shaders on device tensors. The architectures, the memory, the engine and the prompt cache
are the same code for both (the device is a parameter, not a fork)."""

from hyserve.model.backend.base import Backend
from hyserve.model.backend.cpu import CPU, CpuBackend
from hyserve.model.backend.errors import DeviceError, GpuUnsupported
from hyserve.model.backend.select import DeviceRequest, open_backend

__all__ = ["CPU", "Backend", "CpuBackend", "DeviceError", "DeviceRequest", "GpuUnsupported", "open_backend"]
