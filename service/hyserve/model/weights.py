"""Turn GGUF tensors into kernel objects, with errors that name the file and the tensor."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType
from hyserve_kernels import QMatrix

from hyserve.model.backend.base import Backend, Matrix, Tensor
from hyserve.model.backend.cpu import CPU
from hyserve.model.gguf_file import GGUFError, GGUFFile

SUPPORTED_TYPES = frozenset(
    {
        GGMLQuantizationType.F32,
        GGMLQuantizationType.F16,
        GGMLQuantizationType.BF16,
        GGMLQuantizationType.Q4_0,
        GGMLQuantizationType.Q4_1,
        GGMLQuantizationType.Q5_0,
        GGMLQuantizationType.Q5_1,
        GGMLQuantizationType.Q8_0,
        GGMLQuantizationType.Q4_K,
        GGMLQuantizationType.Q5_K,
        GGMLQuantizationType.Q6_K,
    }
)


class WeightLoader:
    """Reads named tensors of one GGUF file as matrices or small f32 vectors and puts them where
    `backend` runs the forward pass (on the CPU: zero-copy views of the file)."""

    def __init__(self, gguf: GGUFFile, backend: Backend = CPU) -> None:
        self.gguf = gguf
        self.backend = backend

    def has(self, name: str) -> bool:
        return name in self.gguf.tensors

    def matrix(self, name: str) -> Matrix:
        return self.backend.matrix(self.host_matrix(name))

    def host_matrix(self, name: str) -> QMatrix:
        info = self.gguf.tensor(name)
        if info.ggml_type not in SUPPORTED_TYPES:
            raise GGUFError(
                f"{self.gguf.path}: tensor {name!r} has type {info.ggml_type.name}, which hyserve does not support"
            )
        if len(info.shape) > 2:
            raise GGUFError(f"{self.gguf.path}: tensor {name!r} has shape {info.shape}, expected a matrix")
        return QMatrix(info.data, int(info.ggml_type), info.n_rows, info.row_len)

    def experts(self, name: str, n_expert: int) -> QMatrix:
        """A 3-D expert tensor ({cols, rows, n_expert} in ggml order) as one matrix of n_expert
        blocks of rows, expert e's rows first-to-last in block e."""
        info = self.gguf.tensor(name)
        if len(info.shape) != 3 or info.shape[2] != n_expert:
            raise GGUFError(f"{self.gguf.path}: tensor {name!r} has shape {info.shape}, expected [*, *, {n_expert}]")
        if info.ggml_type not in SUPPORTED_TYPES:
            raise GGUFError(
                f"{self.gguf.path}: tensor {name!r} has type {info.ggml_type.name}, which hyserve does not support"
            )
        return QMatrix(info.data, int(info.ggml_type), info.n_rows, info.row_len)

    def optional_vector(self, name: str, length: int | None = None) -> Tensor | None:
        return self.vector(name, length) if self.has(name) else None

    def vector(self, name: str, length: int | None = None) -> Tensor:
        """A small tensor (norm weights, biases) as f32 values on the backend's device."""
        return self.backend.vector(self.host_vector(name, length))

    def host_vector(self, name: str, length: int | None = None) -> np.ndarray:
        """A small tensor as a contiguous f32 host array."""
        info = self.gguf.tensor(name)
        if info.ggml_type == GGMLQuantizationType.F32:
            values = info.data.view(np.float32)
        elif info.ggml_type == GGMLQuantizationType.F16:
            values = info.data.view(np.float16).astype(np.float32)
        else:
            values = np.asarray(_dequantize_all(self.host_matrix(name))).reshape(-1)
        if length is not None and values.size != length:
            raise GGUFError(f"{self.gguf.path}: tensor {name!r} has {values.size} elements, expected {length}")
        return np.ascontiguousarray(values, dtype=np.float32)


def _dequantize_all(m: QMatrix) -> np.ndarray:
    from hyserve_kernels import get_rows

    return get_rows(m)
