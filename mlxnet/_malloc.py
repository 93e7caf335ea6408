"""Keep freed memory in the process on Linux (glibc), so MLX's CPU arrays reuse it.

MLX's CPU back end takes every array from malloc and frees it after its last use. glibc
serves large blocks with fresh mmap regions and returns them on free, so every 4 KiB page of
the next array page-faults when first written. With mmap and heap trimming off, freed blocks
stay in the heap and the next array reuses them. The cost: the process keeps its peak heap,
as GPU caching allocators do. Because it changes the whole process, it is opt-in:
:func:`mlxnet.tune_cpu` (the ``mlxnet`` command calls it for its own process unless
``MLXNET_MALLOC=system``).
"""
from __future__ import annotations

import ctypes
import platform
import sys


# glibc <malloc.h>
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8

_state = {"malloc": "system"}


def configure() -> None:
    """Turn glibc's mmap and trimming off (Linux with glibc only; idempotent)."""
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return
    libc = ctypes.CDLL(None)
    # One arena: MLX allocates on its stream threads, whose per-thread arenas would trim.
    ok = (libc.mallopt(_M_ARENA_MAX, 1) and libc.mallopt(_M_MMAP_MAX, 0)
          and libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))
    _state["malloc"] = "glibc, freed memory kept for reuse" if ok else "system (mallopt refused)"


def malloc_info() -> str:
    return _state["malloc"]
