"""The device flags of `run` and `serve` (`--device`, `--gpu-backend`, `--gpu-adapter`,
`--gpu-numerics`) and the one `DeviceRequest` they make."""

from __future__ import annotations

import argparse

from hyserve.model.backend.select import BACKEND_ENV, DEVICES, NUMERICS, DeviceRequest


def add_device_arguments(p: argparse.ArgumentParser) -> None:
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
    p.add_argument(
        "--gpu-numerics",
        choices=NUMERICS,
        default="fast",
        help="GPU float operations: fast (the adapter's own; deterministic and batch-invariant, within "
        "KL 1e-3 of the CPU) or exact (the CPU kernels' bits, slower)",
    )


def device_request(args: argparse.Namespace, cpu_only: str | None = None) -> DeviceRequest:
    """The request the flags make; `cpu_only` says why the model must run on the CPU, if it must."""
    return DeviceRequest(args.device, args.gpu_backend, args.gpu_adapter, args.gpu_numerics, cpu_only)
