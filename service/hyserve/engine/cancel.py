"""A task's own cancel flag. There is deliberately no process-wide stop flag anywhere.

The flag is an atomic owned by the Rust kernel wheel (`hyserve_kernels.CancelFlag`): the asyncio
side sets it (Cancel RPC, client disconnect, deadline), the engine reads it at every step boundary,
and when a batch holds only this task the model polls it between layers and the matmul kernels
between row chunks, so a long prompt chunk stops early.
"""

from __future__ import annotations

from enum import Enum

import hyserve_kernels


class CancelSource(Enum):
    """Who asked for the cancel (kept for logs; the effect on the task is the same)."""

    RPC = "cancel_rpc"
    CLIENT_GONE = "client_gone"  # the Generate call was cancelled by its client or its deadline passed
    SHUTDOWN = "shutdown"  # the server's drain deadline passed with the task still running
    SLOW_READER = "slow_reader"  # its client stopped reading the stream (events piled up or it stalled)


class CancelFlag:
    """Set once, never cleared. Owned by exactly one task (who set it is logged where it is set)."""

    __slots__ = ("native",)

    def __init__(self) -> None:
        self.native = hyserve_kernels.CancelFlag()

    def set(self) -> None:
        self.native.set()

    def is_set(self) -> bool:
        return self.native.is_set()

    def __bool__(self) -> bool:
        return self.native.is_set()
