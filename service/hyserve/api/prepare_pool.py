"""Where requests are validated, rendered and tokenized: worker threads at a lower CPU priority.

Tokenizing runs off the asyncio loop (which writes every stream) and mostly without the GIL (the
tokenizer's Rust core releases it, see model/tokenizer.py), so it no longer blocks other streams;
but on a machine with few cores it still competes with the engine's kernel threads for CPU time.
Its threads therefore run at a higher nice value (Linux keeps one per thread): a long prompt is
prepared with the CPU time the engine leaves, not at the expense of the tokens already streaming.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

import structlog

__all__ = ["PREPARE_NICENESS", "run_prepare"]

log = structlog.get_logger(__name__)

PREPARE_NICENESS = 10
PREPARE_THREADS = 4

P = ParamSpec("P")
T = TypeVar("T")

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _lower_priority() -> None:
    try:  # per thread on Linux; elsewhere (or without permission) the thread keeps its priority
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + PREPARE_NICENESS))
    except (AttributeError, OSError) as exc:
        log.debug("prepare_priority_unchanged", reason=str(exc))


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(PREPARE_THREADS, "hyserve-prepare", initializer=_lower_priority)
        return _pool


async def run_prepare(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """fn(*args, **kwargs) on a prepare thread."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_executor(), lambda: fn(*args, **kwargs))
