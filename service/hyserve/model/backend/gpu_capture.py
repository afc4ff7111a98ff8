"""What the GPU backend saw while a forward was captured (`GpuDevice.begin_capture`): the step's
own inputs, the tensors the forward read back, and the plan or why there is none."""

from __future__ import annotations

from dataclasses import dataclass, field

import hyserve_kernels as hk


@dataclass
class CaptureLog:
    # the forward's own inputs by name ("tokens", "positions"): a replay rewrites them
    inputs: dict[str, hk.GpuTensor] = field(default_factory=dict)
    # the tensors the forward read back, in order (its kept inputs, then its logits)
    outputs: list[hk.GpuTensor] = field(default_factory=list)
    plan: hk.GpuPlan | None = None
    why: str = ""  # why there is no plan
