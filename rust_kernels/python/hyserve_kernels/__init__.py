"""SIMD CPU kernels for hyserve (Rust, PyO3). See rust_kernels/src for the implementations."""

from hyserve_kernels._native import (
    QMatrix,
    attention,
    geglu,
    gelu,
    get_rows,
    matmul,
    matmul_many,
    num_threads,
    rms_norm,
    rope,
    set_force_scalar,
    set_num_threads,
    silu,
    simd_path,
    swiglu,
)

__all__ = [
    "QMatrix",
    "attention",
    "geglu",
    "gelu",
    "get_rows",
    "matmul",
    "matmul_many",
    "num_threads",
    "rms_norm",
    "rope",
    "set_force_scalar",
    "set_num_threads",
    "silu",
    "simd_path",
    "swiglu",
]
