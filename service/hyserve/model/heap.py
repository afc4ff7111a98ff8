"""Keep the activation buffers of long prompts in the process heap between layers.

A forward pass over a long prompt allocates and frees numpy buffers of tens of MB per layer. With
glibc's defaults such buffers are mmapped and unmapped each time, or trimmed off the heap top, so
every layer pays page faults to map and zero them again (`perf`: ~10% kernel time, and a 2048-token
prompt of the realistic qwen35 took ~25% longer). Raising the mmap threshold to glibc's maximum and
the trim threshold to 1 GiB keeps freed buffers for reuse; the cost is that the process keeps its
heap's high-water mark (as servers that preallocate their compute buffers do).

glibc caps the mmap threshold at 32 MiB, and a 4096-token prompt's buffers are larger (the realistic
qwen35's FFN: 4096 x 3584 floats, 59 MB; its q/k/v projection 101 MB), so those were still mapped
and faulted in afresh in every layer. So mmap is switched off for allocations altogether
(`M_MMAP_MAX` 0), and all threads share the main arena (`M_ARENA_MAX` 1): a thread's own arena
grows in 64 MiB heaps, which cannot hold such a buffer either (the engine thread's forward calls).
4096-token qwen35 prompt in a thread, two samples: 35.1 / 35.4 s -> 32.6 / 31.2 s.
`HYSERVE_MALLOC_TUNING=0` leaves glibc's settings alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

import structlog

log = structlog.get_logger(__name__)

# mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_MMAP_MAX = -4
M_ARENA_MAX = -8
MMAP_THRESHOLD_BYTES = 32 << 20  # glibc refuses more on 64-bit (HEAP_MAX_SIZE / 2)
TRIM_THRESHOLD_BYTES = 1 << 30

_tuned: bool | None = None


def wants_tuning(environ: dict[str, str] | os._Environ[str], libc_name: str) -> bool:
    """Tune only glibc (mallopt's parameters are glibc's) and only unless switched off."""
    return libc_name == "glibc" and environ.get("HYSERVE_MALLOC_TUNING", "1") != "0"


def keep_freed_buffers() -> bool:
    """Apply the settings once per process; returns whether they are in effect."""
    global _tuned
    if _tuned is None:
        _tuned = False
        if wants_tuning(os.environ, platform.libc_ver()[0]):
            libc = ctypes.CDLL(ctypes.util.find_library("c"))
            settings = [
                (M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES),
                (M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES),
                (M_MMAP_MAX, 0),
                (M_ARENA_MAX, 1),
            ]
            _tuned = all([bool(libc.mallopt(param, value)) for param, value in settings])
            log.debug("malloc_tuning", applied=_tuned)
    return _tuned
