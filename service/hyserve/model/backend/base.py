"""The operations an architecture's forward pass uses, as one interface over every device."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

import hyserve_kernels as hk
import numpy as np

from hyserve.model.backend.recurrent_base import RecurrentOps
from hyserve.model.backend.rotary import Rotary

# A tensor of the backend's device: a numpy array on the CPU, an `hk.GpuTensor` on the GPU. Both
# have `.shape` and `.reshape(*shape)`.
Tensor = Any
# A weight matrix: `hk.QMatrix` (CPU) or `hk.GpuMatrix` (GPU); both have `.rows` and `.cols`.
Matrix = Any


class AttentionSpan(NamedTuple):
    """One sequence's rows of a batch and where its keys go: `cache` (that sequence's layer cache)
    receives them from position `start` on."""

    cache: Any
    start: int
    rows: slice


class Backend(RecurrentOps, Protocol):
    """Operations are recorded or run in call order; `to_host` returns a result to numpy. Each
    output row depends only on its own input row (batch invariance), on every device."""

    name: str  # "cpu" or "gpu"
    description: str  # the device, for logs and ModelInfo
    numerics: str  # a GPU's numerics mode, "fast" or "exact"; "" on the CPU

    # -- weights and memory, at load time
    def matrix(self, m: hk.QMatrix) -> Matrix: ...
    def vector(self, v: np.ndarray) -> Tensor: ...
    def kv_cache(self, n_ctx: int, n_kv: int, head_dim: int) -> Any: ...

    # -- one forward call
    def ids(self, a: np.ndarray, step_input: str = "") -> Tensor:
        """Token ids or positions (int32) where the kernels read them. `step_input` names a
        forward's own inputs ("tokens", "positions"), which a captured step rewrites."""
        ...

    def embed(self, m: Matrix, tokens: Tensor) -> Tensor: ...
    def matmul(self, w: Matrix, x: Tensor, cancel: hk.CancelFlag | None = None) -> Tensor: ...
    def matmul_many(self, ws: Sequence[Matrix], x: Tensor, cancel: hk.CancelFlag | None = None) -> list[Tensor]: ...
    def rms_norm(
        self,
        x: Tensor,
        weight: Tensor,
        eps: float,
        feeds: Sequence[Matrix] = (),
        rope: Rotary | None = None,
        gate: Tensor | None = None,
    ) -> Tensor:
        """RMSNorm over consecutive groups of len(weight) values (rows, or heads within rows).
        `feeds`: the matrices the result goes into next, a hint that changes no value (a device
        may quantize the result for them in the norm's own pass, sparing the matmul that pass).
        `rope`: the groups are heads, turned by RoPE after the norm (one pass on a device; the
        bits of `rope(rms_norm(x), *rope)`). `gate`: as many values as x, the result multiplied
        by silu(gate) (one pass on a device; the bits of `mul_silu_` after the norm; neither
        `rope` nor `feeds` with it)."""
        ...

    def rope(
        self, x: Tensor, n_head: int, positions: Tensor, n_rot: int, base: float, scale: float, neox: bool
    ) -> Tensor:
        """x (rows x n_head*head_dim) rotated; may work in place and return x."""
        ...

    def add_(self, dst: Tensor, a: Tensor) -> None: ...
    def add_rms_norm(self, h: Tensor, a: Tensor, weight: Tensor, eps: float, feeds: Sequence[Matrix] = ()) -> Tensor:
        """h += a, then the RMSNorm of h's rows (one pass on a device): the bits of `add_` and
        `rms_norm` (`feeds` as there)."""
        ...

    def scale_(self, dst: Tensor, s: float | np.float32) -> None: ...
    def add_row(self, x: Tensor, bias: Tensor) -> Tensor:
        """x + bias for every row (a new tensor)."""
        ...

    def geglu(self, gate: Tensor, up: Tensor, feeds: Sequence[Matrix] = ()) -> Tensor:
        """gelu(gate) * up (`feeds` as in `rms_norm`)."""
        ...

    def swiglu(self, gate: Tensor, up: Tensor, feeds: Sequence[Matrix] = ()) -> Tensor:
        """silu(gate) * up (`feeds` as in `rms_norm`)."""
        ...

    def softcap(self, x: Tensor, cap: float) -> Tensor: ...
    def empty(self, shape: tuple[int, ...]) -> Tensor: ...
    def take_rows(self, x: Tensor, rows: np.ndarray) -> Tensor: ...
    def argmax_rows(self, x: Tensor) -> Tensor:
        """Each row's first maximum (numpy's argmax) as float32 values (exact below 2^24), so
        they come back with the other float outputs of a forward."""
        ...

    def attention(
        self,
        spans: Sequence[AttentionSpan],
        q: Tensor,
        k: Tensor,
        v: Tensor,
        positions: Tensor,
        window: int,
        kq_scale: float,
        out: Tensor,
    ) -> None:
        """For each span (one sequence's rows of the batch): append rows `span.rows` of k, v
        (rows x n_kv*head_dim) to `span.cache` at position `span.start`, attend the same rows of q
        (rows x n_head*head_dim) over that cache and write them into `out` (rows x
        n_head*head_dim). All spans of a layer come in one call (one dispatch for a decode step)."""
        ...

    # -- mixture-of-experts FFN (qwen35moe, qwen3next)
    def moe(self, ffn: hk.MoeFfn) -> Any:
        """The layer's MoE FFN (built from host weights at load time) on this device."""
        ...

    def moe_ffn(self, moe: Any, x: Tensor, cancel: hk.CancelFlag | None = None) -> Tensor:
        """`moe`'s output for x (rows x n_embd): routing, the selected experts, the shared expert."""
        ...

    def to_host(self, x: Tensor) -> np.ndarray: ...
    def to_host_many(self, xs: Sequence[Tensor | np.ndarray]) -> list[np.ndarray]:
        """Several results at once (host arrays pass through): one read-back on a GPU."""
        ...

    def flush(self) -> None:
        """Start the work a forward call recorded (it completed: nothing may drop it any more)."""
        ...

    def abort(self) -> None:
        """End a forward call that did not finish (a cancel or an error): no memory may change."""
        ...
